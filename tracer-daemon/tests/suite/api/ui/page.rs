//! What the web page's test drives Chromium with: chromedriver and its
//! browser (stopped by pid), a proxy of tracerd's Unix socket, waiting for
//! the page, reading its tables (each cell's text and title) and checking
//! what they show against the API's numbers.

use std::{
    net::{TcpListener, TcpStream},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fantoccini::{Client, ClientBuilder, Locator, elements::Element};
use serde_json::{Value, json};

use crate::suite::support::{TempDir, free_port, kill_if_running, poll};

/// chromedriver and the Chromium it starts (with a profile directory of
/// this test's own), stopped by pid when dropped, also when the test
/// failed before it could close the session: Chromium outlives a killed
/// chromedriver, so each process whose command line names the profile
/// directory is killed.
pub(super) struct Driver(Child, TempDir);

impl Driver {
    pub(super) fn start() -> (Self, u16) {
        let port = free_port();
        let child = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (package chromium-driver, installed by cargo xtask setup)");
        let driver = Self(child, TempDir::new("chromium-profile"));
        poll(Duration::from_secs(20), Duration::from_millis(50), || {
            TcpStream::connect(("127.0.0.1", port))
                .map(drop)
                .map_err(|e| e.to_string())
        });
        (driver, port)
    }
}

impl Driver {
    /// The `--user-data-dir` argument that marks this test's Chromium.
    pub(super) fn profile_arg(&self) -> String {
        format!("--user-data-dir={}", self.1.path().display())
    }

    /// The pids of the Chromium processes started for this test.
    pub(super) fn browser_pids(&self) -> Vec<i32> {
        let mark = self.profile_arg();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                    cmdline.split(|&b| b == 0).any(|arg| arg == mark.as_bytes())
                })
            })
            .collect()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        kill_if_running(&mut self.0);
        for pid in self.browser_pids() {
            // SAFETY: kill takes no pointer; these are our test's browser
            // processes, found by their profile directory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// A TCP listener on loopback that hands each connection to tracerd's Unix
/// socket: what `socat TCP-LISTEN:...,fork UNIX-CONNECT:...` or a web
/// server's proxy does for a browser.
pub(super) fn proxy_to(socket: &Path) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let port = listener.local_addr().expect("addr").port();
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let Ok(unix) = UnixStream::connect(&socket) else {
                continue;
            };
            let (mut tcp_in, mut unix_out) = (
                tcp.try_clone().expect("clone"),
                unix.try_clone().expect("clone"),
            );
            std::thread::spawn(move || copy(&mut tcp_in, &mut unix_out));
            let (mut unix_in, mut tcp_out) = (unix, tcp);
            std::thread::spawn(move || copy(&mut unix_in, &mut tcp_out));
        }
    });
    port
}

pub(super) fn copy(from: &mut impl std::io::Read, to: &mut impl std::io::Write) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}

/// Polls `f` every 100 ms for up to 30 s until it gives Some; a timeout
/// fails with the page's status line and a screenshot beside the artifact.
pub(super) async fn until<T, F, Fut>(client: &Client, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = f().await {
            return value;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let status = match client.find(Locator::Id("status")).await {
                Ok(status) => status.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if let Ok(png) = client.screenshot().await {
                let _ = std::fs::write(artifact().with_file_name("ui-failed.png"), png);
            }
            panic!("timed out waiting for {what}; the page's status: {status:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One cell: its text and its title (what hovering shows), "" if none.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Shown {
    pub(super) text: String,
    pub(super) title: String,
}

/// The cells of a row.
pub(super) async fn cells(row: &Element) -> Option<Vec<Shown>> {
    let mut cells = Vec::new();
    for td in row.find_all(Locator::Css("td")).await.ok()? {
        cells.push(Shown {
            text: td.text().await.ok()?,
            title: td.attr("title").await.ok()?.unwrap_or_default(),
        });
    }
    Some(cells)
}

/// The cells of each body row of table `id`.
pub(super) async fn table(client: &Client, id: &str) -> Vec<Vec<Shown>> {
    let mut rows = Vec::new();
    let Ok(found) = client
        .find_all(Locator::Css(&format!("#{id} tbody tr")))
        .await
    else {
        return rows;
    };
    for row in found {
        match cells(&row).await {
            Some(cells) => rows.push(cells),
            None => return Vec::new(),
        }
    }
    rows
}

/// The attributes `data-pid`, `data-generation`, `data-state` and `class`
/// of each row of the process list, in the page's order.
pub(super) async fn process_rows(client: &Client) -> Vec<(u32, u64, String, String)> {
    let mut rows = Vec::new();
    let Ok(found) = client.find_all(Locator::Css("#processes tbody tr")).await else {
        return rows;
    };
    for row in found {
        let attr = |name: &'static str| {
            let row = row.clone();
            async move { row.attr(name).await.ok().flatten().unwrap_or_default() }
        };
        let (pid, generation) = (attr("data-pid").await, attr("data-generation").await);
        let (Ok(pid), Ok(generation)) = (pid.parse(), generation.parse()) else {
            return Vec::new();
        };
        rows.push((
            pid,
            generation,
            attr("data-state").await,
            attr("class").await,
        ));
    }
    rows
}

/// The live process row of `pid` once the page lists it: its cells (pid,
/// command, executable, state, current, peak, blocks).
pub(super) async fn process_row(client: &Client, pid: u32) -> Vec<Shown> {
    until(client, "the process row", || async {
        let row = client
            .find(Locator::Css(&format!(
                "#processes tr[data-pid=\"{pid}\"][data-state=\"alive\"]"
            )))
            .await
            .ok()?;
        cells(&row).await
    })
    .await
}

/// Asserts that a size cell shows `bytes` as tracemalloc prints sizes
/// (`format_size`, signed for a growth) and the exact bytes on hover.
pub(super) fn assert_size(cell: &Shown, bytes: i64, sign: bool) {
    assert_eq!(
        cell.text,
        tracer_model::format_size(bytes, sign),
        "{cell:?}"
    );
    assert_eq!(number(&cell.title), bytes, "{cell:?}");
    assert!(cell.title.ends_with(" bytes"), "{cell:?}");
}

/// `1,234` → 1234; `+1,234` → 1234; `-5` → -5.
pub(super) fn number(text: &str) -> i64 {
    let digits: String = text
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {text:?}"))
}

/// What the page shows in a row of a compare table, from the API's JSON.
pub(super) fn diff_rows(answer: &Value) -> Vec<(String, i64, i64, i64, i64)> {
    answer["statistics"]
        .as_array()
        .expect("statistics")
        .iter()
        .map(|s| {
            let frame = &s["traceback"][0];
            (
                format!(
                    "{}:{}",
                    frame["filename"].as_str().expect("filename"),
                    frame["lineno"]
                ),
                s["size"].as_i64().expect("size"),
                s["size_diff"].as_i64().expect("size_diff"),
                s["count"].as_i64().expect("count"),
                s["count_diff"].as_i64().expect("count_diff"),
            )
        })
        .collect()
}

/// What a row of a compare table shows: the place, the exact size and
/// growth (on hover, after checking that their text is tracemalloc's), the
/// blocks and new blocks.
pub(super) fn shown_rows(rows: &[Vec<Shown>]) -> Vec<(String, i64, i64, i64, i64)> {
    rows.iter()
        .map(|cells| {
            // A frame with a function name shows it after the line.
            let place = cells[0]
                .text
                .split(" (")
                .next()
                .unwrap_or_default()
                .to_string();
            let (size, growth) = (number(&cells[1].title), number(&cells[2].title));
            assert_size(&cells[1], size, false);
            assert_size(&cells[2], growth, true);
            (
                place,
                size,
                growth,
                number(&cells[3].text),
                number(&cells[4].text),
            )
        })
        .collect()
}

pub(super) async fn click(client: &Client, css: &str) {
    let element: Element = client.find(Locator::Css(css)).await.expect(css);
    element.click().await.expect("click");
}

pub(super) async fn browser(port: u16, profile: &str) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,2400", "--no-first-run", "--no-default-browser-check",
                     "--disable-crash-reporter", profile],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session through chromedriver")
}

pub(super) fn artifact() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui.png")
}
