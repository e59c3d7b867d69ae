//! The web page (`/ui`) in Debian's own headless Chromium, driven through
//! chromedriver (WebDriver): the page loads, its numbers are the API's,
//! digit for digit, for a traced fixture; clicking the process shows its
//! lines; a diff of two snapshots shows the fixture's growth; a wrong
//! token is refused and the right one taken; and the same page works over
//! the Unix socket through a local proxy. A screenshot is kept as the
//! test's artifact (`$CARGO_TARGET_TMPDIR/ui.png`).

use std::{
    net::{TcpListener, TcpStream},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fantoccini::{Client, ClientBuilder, Locator, elements::Element};
use serde_json::{Value, json};

use super::app;
use crate::suite::support::{
    Fixture, TempDir, Tracerd, free_port, kill_if_running, poll, token_file,
};

const TOKEN: &str = "ui-test-token-0123456789abcdef";

/// chromedriver and the Chromium it starts (with a profile directory of
/// this test's own), stopped by pid when dropped, also when the test
/// failed before it could close the session: Chromium outlives a killed
/// chromedriver, so each process whose command line names the profile
/// directory is killed.
struct Driver(Child, TempDir);

impl Driver {
    fn start() -> (Self, u16) {
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
    fn profile_arg(&self) -> String {
        format!("--user-data-dir={}", self.1.path().display())
    }

    /// The pids of the Chromium processes started for this test.
    fn browser_pids(&self) -> Vec<i32> {
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
fn proxy_to(socket: &Path) -> u16 {
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

fn copy(from: &mut impl std::io::Read, to: &mut impl std::io::Write) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}

/// Polls `f` every 100 ms for up to 30 s until it gives Some; a timeout
/// fails with the page's status line and a screenshot beside the artifact.
async fn until<T, F, Fut>(client: &Client, what: &str, mut f: F) -> T
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

/// The texts of the cells of each body row of table `id`.
async fn table(client: &Client, id: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let Ok(found) = client
        .find_all(Locator::Css(&format!("#{id} tbody tr")))
        .await
    else {
        return rows;
    };
    for row in found {
        let mut cells = Vec::new();
        let Ok(tds) = row.find_all(Locator::Css("td")).await else {
            return Vec::new();
        };
        for td in tds {
            match td.text().await {
                Ok(text) => cells.push(text),
                Err(_) => return Vec::new(),
            }
        }
        rows.push(cells);
    }
    rows
}

/// The process row of `pid` once the page lists it: its cells.
async fn process_row(client: &Client, pid: u32) -> Vec<String> {
    until(client, "the process row", || async {
        let row = client
            .find(Locator::Css(&format!("#processes tr[data-pid=\"{pid}\"]")))
            .await
            .ok()?;
        let mut cells = Vec::new();
        for td in row.find_all(Locator::Css("td")).await.ok()? {
            cells.push(td.text().await.ok()?);
        }
        Some(cells)
    })
    .await
}

/// `1,234` → 1234; `+1,234` → 1234; `-5` → -5.
fn number(text: &str) -> i64 {
    let digits: String = text
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {text:?}"))
}

/// What the page shows in a row of a compare table, from the API's JSON.
fn diff_rows(answer: &Value) -> Vec<(String, i64, i64, i64, i64)> {
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

fn shown_rows(rows: &[Vec<String>]) -> Vec<(String, i64, i64, i64, i64)> {
    rows.iter()
        .map(|cells| {
            // A frame with a function name shows it after the line.
            let place = cells[0].split(" (").next().unwrap_or_default().to_string();
            (
                place,
                number(&cells[1]),
                number(&cells[2]),
                number(&cells[3]),
                number(&cells[4]),
            )
        })
        .collect()
}

async fn click(client: &Client, css: &str) {
    let element: Element = client.find(Locator::Css(css)).await.expect(css);
    element.click().await.expect("click");
}

async fn browser(port: u16, profile: &str) -> Client {
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

fn artifact() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui.png")
}

#[test]
fn the_page_shows_the_api_s_numbers_and_a_process_s_lines_in_chromium_with_the_token_and_over_the_unix_socket()
 {
    let dir = TempDir::new("ui");
    let socket = dir.path().join("api.sock");
    let token_file = token_file(dir.path(), TOKEN);
    let tracerd = Tracerd::start(&[
        "--unix-socket",
        socket.to_str().expect("utf-8"),
        "--auth-token-file",
        token_file.to_str().expect("utf-8"),
    ]);
    let program = app();
    let mut fx = Fixture::spawn_traced(&tracerd, &program.exe, &[]);
    fx.step("phase1");
    let pid = fx.pid();
    let (status, first) = tracerd.post(&format!("/pid/{pid}/snapshots?label=ui-before"));
    assert_eq!(status, 201, "{first}");
    fx.go();
    fx.read_line(); // the address of SITE_OBJ
    fx.expect_line("phase2");
    let (status, second) = tracerd.post(&format!("/pid/{pid}/snapshots?label=ui-after"));
    assert_eq!(status, 201, "{second}");
    let (first, second) = (
        first["id"].as_u64().expect("id"),
        second["id"].as_u64().expect("id"),
    );

    let (driver, port) = Driver::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // reqwest's blocking client (the suite's) runs its own runtime: off
    // this one's threads.
    // The page's own requests may hold tracerd's expensive slots: a 429 is
    // asked again.
    let get_ok = |path: &str| {
        tokio::task::block_in_place(|| {
            poll(
                Duration::from_secs(30),
                Duration::from_millis(200),
                || match tracerd.get(path) {
                    (200, body) => Ok(body),
                    (status, body) => Err(format!("GET {path}: {status} {body}")),
                },
            )
        })
    };
    let get_text = |path: &str| {
        tokio::task::block_in_place(|| {
            poll(
                Duration::from_secs(30),
                Duration::from_millis(200),
                || match tracerd.get_text(path) {
                    (200, text) => Ok(text),
                    (status, text) => Err(format!("GET {path}: {status} {text}")),
                },
            )
        })
    };
    runtime.block_on(async {
        let client = browser(port, &driver.profile_arg()).await;

        // A wrong token: tracerd's 401 in the status line, the form shown.
        client
            .goto(&format!("{}/ui#token=wrong-token-0123456789", tracerd.base))
            .await
            .expect("goto /ui");
        let status = until(&client, "the 401", || async {
            let text = client
                .find(Locator::Id("status"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.starts_with("401").then_some(text)
        })
        .await;
        assert!(status.contains("missing or wrong bearer token"), "{status}");
        let form = client.find(Locator::Id("token-form")).await.expect("form");
        assert!(form.is_displayed().await.expect("displayed"));

        // The right token: the process list, with the API's numbers.
        let input = client
            .find(Locator::Id("token"))
            .await
            .expect("token input");
        input.send_keys(TOKEN).await.expect("type");
        click(&client, "#token-form button").await;
        let row = process_row(&client, pid).await;
        let listed = get_ok("/processes");
        let api_row = listed["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == pid)
            .expect("the fixture listed")
            .clone();
        assert_eq!(row[0], pid.to_string());
        assert_eq!(
            (number(&row[2]), number(&row[3]), number(&row[4])),
            (
                api_row["current"].as_i64().expect("current"),
                api_row["peak"].as_i64().expect("peak"),
                api_row["blocks"].as_i64().expect("blocks"),
            ),
            "{api_row}"
        );

        // A click: the process's lines with their growth, as the API's compare.
        click(&client, &format!("#processes tr[data-pid=\"{pid}\"]")).await;
        let api_lines = diff_rows(&get_ok(&format!(
            "/pid/{pid}/compare?group_by=lineno&limit=20"
        )));
        assert!(!api_lines.is_empty());
        let lines = until(&client, "the lines", || async {
            let rows = table(&client, "lines").await;
            (rows.len() == api_lines.len()).then_some(rows)
        })
        .await;
        assert_eq!(shown_rows(&lines), api_lines);
        let site_a = format!("{}:{}", program.src(), program.line("SITE_A"));
        let a = api_lines
            .iter()
            .find(|l| l.0 == site_a)
            .expect("SITE_A shown");
        assert_eq!((a.1, a.3), (1300, 13), "13 blocks of 100 bytes at SITE_A");

        // tracemalloc's text, as the API gives it.
        let text = get_text(&format!(
            "/pid/{pid}/statistics?group_by=lineno&limit=50&format=text"
        ));
        let shown = until(&client, "the text", || async {
            let shown = client
                .find(Locator::Id("text"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            (!shown.is_empty()).then_some(shown)
        })
        .await;
        assert_eq!(shown.trim_end(), text.trim_end());

        // The diff of the two snapshots: SITE_A grew by 3 blocks of 100 bytes.
        click(&client, &format!("#diff-base option[value=\"{first}\"]")).await;
        click(&client, &format!("#diff-new option[value=\"{second}\"]")).await;
        click(&client, "#diff-run").await;
        let api_diff = diff_rows(&get_ok(&format!(
            "/snapshots/{second}/compare?base={first}&group_by=lineno&limit=20"
        )));
        let diff = until(&client, "the diff", || async {
            let rows = table(&client, "diff").await;
            (rows.len() == api_diff.len() && !rows.is_empty()).then_some(rows)
        })
        .await;
        assert_eq!(shown_rows(&diff), api_diff);
        let a = api_diff
            .iter()
            .find(|l| l.0 == site_a)
            .expect("SITE_A in the diff");
        assert_eq!((a.2, a.4), (300, 3));

        // The flame graph: tracerd's own SVG (format=svg), drawn.
        let width = until(&client, "the flame graph", || async {
            let width = client
                .execute(
                    "const img = document.querySelector('#flamegraph img');\n\
                     return img && img.complete ? img.naturalWidth : 0;",
                    Vec::new(),
                )
                .await
                .ok()?
                .as_u64()?;
            (width > 0).then_some(width)
        })
        .await;
        assert!(width >= 100, "the flame graph is {width} pixels wide");

        let png = client.screenshot().await.expect("screenshot");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::write(artifact(), &png).expect("artifact");

        // The same page over the Unix socket, through a local proxy.
        let proxy = proxy_to(&socket);
        client
            .goto(&format!("http://127.0.0.1:{proxy}/ui"))
            .await
            .expect("goto the proxy");
        let row = process_row(&client, pid).await;
        let listed = get_ok("/processes");
        let current = listed["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == pid)
            .and_then(|p| p["current"].as_i64())
            .expect("current");
        assert_eq!(number(&row[2]), current);
        client.close().await.expect("close the session");
    });
    drop(driver);
    fx.end();
}
