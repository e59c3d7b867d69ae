//! nginx for the services part: a master and its forked workers on
//! 127.0.0.1, loaded by `ab -k`.
use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    process::{Child, Command, Stdio},
};

use anyhow::{Context as _, bail};
use tracer_testkit::{TempDir, free_port};

use super::server::{
    Figure, Server, children_of, number_after, output_ok, stop_with_children, wait_ready,
};

/// nginx's workers (forked by the master at its start) and `ab`'s
/// concurrent keep-alive connections.
const NGINX_WORKERS: usize = 2;
const AB_CONCURRENCY: &str = "8";
/// Bytes of the file nginx serves.
const NGINX_FILE_BYTES: usize = 4096;

/// nginx: a master (this process's child, as root) and [`NGINX_WORKERS`]
/// workers it forks as www-data, serving a 4 KiB file on 127.0.0.1, loaded
/// by `ab -k` (keep-alive).
pub struct Nginx {
    // Declared first: stopped before its directory goes.
    master: Child,
    port: u16,
    dir: TempDir,
}

impl Nginx {
    /// Writes its configuration and file, starts it and waits until it
    /// answers with all its workers.
    ///
    /// # Errors
    /// A step failed, or nginx does not answer in time.
    pub fn start() -> anyhow::Result<Self> {
        let dir = TempDir::try_new("bench-nginx")?;
        let root = dir.path();
        fs::set_permissions(root, fs::Permissions::from_mode(0o755))?;
        fs::create_dir(root.join("www"))?;
        fs::write(root.join("www/file"), vec![b'x'; NGINX_FILE_BYTES])?;
        let port = free_port()?;
        let conf = format!(
            "daemon off; master_process on; worker_processes {NGINX_WORKERS}; user www-data;\n\
             pid {dir}/nginx.pid; error_log {dir}/error.log;\n\
             events {{ worker_connections 1024; }}\n\
             http {{ server {{ listen 127.0.0.1:{port}; root {dir}/www; access_log off; }} }}\n",
            dir = root.display()
        );
        fs::write(root.join("nginx.conf"), conf)?;
        let master = Command::new("/usr/sbin/nginx")
            .arg("-c")
            .arg(root.join("nginx.conf"))
            .arg("-p")
            .arg(root)
            .arg("-e")
            .arg(root.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nginx")?;
        let nginx = Self { master, port, dir };
        wait_ready("nginx", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && children_of(nginx.master.id()).len() == NGINX_WORKERS
        })?;
        Ok(nginx)
    }
}

impl Server for Nginx {
    fn name(&self) -> &'static str {
        "nginx"
    }

    fn unit(&self) -> &'static str {
        "req/s"
    }

    fn load(&self) -> String {
        format!(
            "{NGINX_WORKERS} workers, `ab -k -c {AB_CONCURRENCY}` of a {NGINX_FILE_BYTES}-byte file"
        )
    }

    fn pid(&self) -> u32 {
        self.master.id()
    }

    fn run(&mut self, seconds: u64, _mode: &str) -> anyhow::Result<Vec<Figure>> {
        let csv = self.dir.path().join("ab-percentiles.csv");
        let out = output_ok(
            Command::new("ab")
                .args(["-q", "-k", "-c", AB_CONCURRENCY, "-t", &seconds.to_string()])
                // -t implies at most 50,000 requests; -n after it lifts that.
                .args(["-n", "100000000", "-e"])
                .arg(&csv)
                .arg(format!("http://127.0.0.1:{}/file", self.port)),
        )?;
        if number_after(&out, "Failed requests:") != Some(0.0) {
            bail!("ab: requests failed: {out}");
        }
        let rps = number_after(&out, "Requests per second:").context("ab printed no rate")?;
        // `Percentage served,Time in ms` then `P,MS` for P of 0 to 100.
        let p99_ms = fs::read_to_string(&csv)?
            .lines()
            .find_map(|l| l.strip_prefix("99,")?.trim().parse().ok());
        Ok(vec![Figure {
            metric: "get-4k".into(),
            per_s: rps,
            p99_ms,
        }])
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: a fast shutdown of the master and its workers.
        stop_with_children(&mut self.master, "TERM");
    }
}
