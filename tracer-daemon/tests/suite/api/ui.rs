//! The web page (`/ui`) in Debian's own headless Chromium, driven through
//! chromedriver (WebDriver): the page loads, its numbers are the API's
//! (sizes as tracemalloc prints them, the exact bytes on hover), for a
//! traced fixture; live processes come first, the ended ones (an exited
//! process, the image an exec replaced) only with "show ended", greyed,
//! each image of one pid told apart; a process that lost events is marked
//! incomplete with its reason; the filter narrows the list as one types;
//! clicking the process shows its lines; a diff of two snapshots shows the
//! fixture's growth; a wrong token is refused and the right one taken; and
//! the same page works over the Unix socket through a local proxy. A
//! screenshot is kept as the test's artifact (`$CARGO_TARGET_TMPDIR/ui.png`,
//! copied to docs/ui.png by hand when the page changes).

use std::time::Duration;

use fantoccini::Locator;
use serde_json::json;

mod page;

use page::{
    Driver, artifact, assert_size, browser, cells, click, diff_rows, number, process_row,
    process_rows, proxy_to, shown_rows, table, until,
};

use super::app;
use crate::suite::support::{Fixture, Program, TempDir, Tracerd, poll, token_file};

const TOKEN: &str = "ui-test-token-0123456789abcdef";

#[test]
fn the_page_shows_the_api_s_numbers_and_a_process_s_lines_in_chromium_with_the_token_and_over_the_unix_socket()
 {
    let dir = TempDir::new("ui");
    let socket = dir.path().join("api.sock");
    let token_file = token_file(dir.path(), TOKEN);
    // Each process may hold 1 % of the live-block maps (2071 blocks), so
    // that one past it loses events (its drops) and the page marks it.
    let tracerd = Tracerd::start(&[
        "--unix-socket",
        socket.to_str().expect("utf-8"),
        "--auth-token-file",
        token_file.to_str().expect("utf-8"),
        "--max-live-blocks",
        "200000",
        "--live-table-blocks",
        "7168",
        "--process-share",
        "1",
    ]);
    assert_eq!(tracerd.maps()["process_max_blocks"], 2071);
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
    // Ended images: a process that exited, and one pid's image before its
    // exec (with the one after it, alive).
    let exits = Program::build("exits", &[]);
    let mut gone = Fixture::spawn(&exits.exe, &["5"]);
    let gone_pid = gone.pid();
    assert!(gone.finish().success());
    let execs = Program::build("exec", &[]);
    let mut twice = Fixture::spawn(&execs.exe, &[]);
    twice.expect_line("before");
    twice.go();
    twice.expect_line("after");
    let twice_pid = twice.pid();
    tracerd.wait_traced(twice_pid);
    let keepn = Program::build("keepn", &[]);
    let mut lossy = Fixture::spawn_traced(&tracerd, &keepn.exe, &["3000"]);
    lossy.step("done");
    let lossy_pid = lossy.pid();
    let drops = tracerd.get_ok(&format!("/pid/{lossy_pid}"))["drops"]
        .as_i64()
        .expect("drops");
    assert_eq!(drops, 3000 + 2 - 2071 + 1, "past its share");
    poll(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || match tracerd.get(&format!("/pid/{gone_pid}")) {
            (200, body) if body["state"] == "exited" => Ok(()),
            (status, body) => Err(format!("{gone_pid}: {status} {body}")),
        },
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
            .goto(&format!(
                "{}/ui#token=wrong-token-0123456789",
                tracerd.base()
            ))
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
        let records = listed["processes"].as_array().expect("processes").clone();
        let api_row = records
            .iter()
            .find(|p| p["pid"] == pid)
            .expect("the fixture listed")
            .clone();
        let texts: Vec<&str> = row.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(
            texts[..4],
            [
                pid.to_string().as_str(),
                "apifix",
                program.exe.to_str().expect("utf-8"),
                "alive"
            ],
            "{row:?}"
        );
        assert_size(
            &row[4],
            api_row["current"].as_i64().expect("current"),
            false,
        );
        assert_size(&row[5], api_row["peak"].as_i64().expect("peak"), false);
        assert_eq!(
            number(&row[6].text),
            api_row["blocks"].as_i64().expect("blocks"),
            "{api_row}"
        );

        // Live processes only, largest first, until "show ended".
        let live = until(&client, "the live processes", || async {
            let rows = table(&client, "processes").await;
            let states = process_rows(&client).await;
            (!rows.is_empty() && rows.len() == states.len()).then_some((rows, states))
        })
        .await;
        assert!(live.1.iter().all(|r| r.2 == "alive"), "{:?}", live.1);
        assert!(!live.1.iter().any(|r| r.0 == gone_pid), "{:?}", live.1);
        let currents: Vec<i64> = live.0.iter().map(|r| number(&r[4].title)).collect();
        assert!(
            currents.windows(2).all(|w| w[0] >= w[1]),
            "largest first: {currents:?}"
        );
        click(&client, "#show-ended").await;
        let rows = until(&client, "the ended images", || async {
            let rows = process_rows(&client).await;
            (rows.iter().any(|r| r.0 == gone_pid)
                && rows.iter().filter(|r| r.0 == twice_pid).count() == 2)
                .then_some(rows)
        })
        .await;
        let first_ended = rows
            .iter()
            .position(|r| r.2 != "alive")
            .expect("an ended row");
        assert!(
            rows[first_ended..].iter().all(|r| r.2 != "alive"),
            "live ones first: {rows:?}"
        );
        let ended = |r: &(u32, u64, String, String)| r.3.split(' ').any(|c| c == "ended");
        assert!(
            rows.iter().all(|r| ended(r) == (r.2 != "alive")),
            "{rows:?}"
        );
        let gone_row = rows.iter().find(|r| r.0 == gone_pid).expect("listed");
        assert_eq!(gone_row.2, "exited");
        // One pid's two images, told apart: their generations are the API's.
        let listed = get_ok("/processes");
        let generation = |state: &str| {
            listed["processes"]
                .as_array()
                .expect("processes")
                .iter()
                .find(|p| p["pid"] == twice_pid && p["state"] == state)
                .and_then(|p| p["generation"].as_u64())
                .expect("the image")
        };
        let mut images: Vec<(u64, &str)> = rows
            .iter()
            .filter(|r| r.0 == twice_pid)
            .map(|r| (r.1, r.2.as_str()))
            .collect();
        images.sort_unstable();
        assert_eq!(
            images,
            [(generation("exec"), "exec"), (generation("alive"), "alive")]
        );
        for (state, shown) in [
            ("exec", "exec'd (image 1 of 2)"),
            ("alive", "alive (image 2 of 2)"),
        ] {
            let row = client
                .find(Locator::Css(&format!(
                    "#processes tr[data-pid=\"{twice_pid}\"][data-state=\"{state}\"]"
                )))
                .await
                .expect("the image's row");
            let cells = cells(&row).await.expect("cells");
            assert_eq!(cells[3].text, shown);
            assert!(
                cells[3]
                    .title
                    .starts_with(&format!("generation {}, traced from ", generation(state))),
                "{:?}",
                cells[3]
            );
        }
        let grey = client
            .execute(
                "return getComputedStyle(document.querySelector('#processes tr.ended')).color;",
                Vec::new(),
            )
            .await
            .expect("a colour");
        assert_eq!(grey, json!("rgb(138, 148, 156)"), "ended rows are greyed");

        // The filter narrows the list as one types: by pid, then by command
        // or executable.
        let filter = client.find(Locator::Id("filter")).await.expect("filter");
        filter
            .send_keys(&twice_pid.to_string())
            .await
            .expect("type");
        let narrowed = until(&client, "the list filtered by pid", || async {
            let rows = process_rows(&client).await;
            (!rows.is_empty()
                && rows
                    .iter()
                    .all(|r| r.0.to_string().contains(&twice_pid.to_string())))
            .then_some(rows)
        })
        .await;
        assert_eq!(narrowed.iter().filter(|r| r.0 == twice_pid).count(), 2);
        assert!(narrowed.len() < rows.len(), "{narrowed:?}");
        filter.clear().await.expect("clear");
        filter.send_keys("EXITS").await.expect("type");
        let narrowed = until(&client, "the list filtered by command", || async {
            let rows = process_rows(&client).await;
            (!rows.is_empty() && !rows.iter().any(|r| r.0 == pid)).then_some(rows)
        })
        .await;
        let listed = get_ok("/processes");
        for (pid, generation, _, _) in &narrowed {
            let record = listed["processes"]
                .as_array()
                .expect("processes")
                .iter()
                .find(|p| p["pid"] == *pid && p["generation"] == *generation)
                .expect("a listed image");
            let named = |field: &str| {
                record[field]
                    .as_str()
                    .is_some_and(|v| v.to_lowercase().contains("exits"))
            };
            assert!(named("comm") || named("exe"), "{record}");
        }
        assert!(narrowed.iter().any(|r| r.0 == gone_pid), "{narrowed:?}");
        filter.clear().await.expect("clear");
        // clear() sends no input event: one keystroke and its undo do.
        filter.send_keys(" ").await.expect("type");
        filter.send_keys("\u{e003}").await.expect("backspace");
        process_row(&client, pid).await;

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

        // The screenshot: the test's fixtures alone (their executables are
        // under the suite's scratch directories), ended ones included.
        let filter = client.find(Locator::Id("filter")).await.expect("filter");
        filter.send_keys("tracer-test-").await.expect("type");
        until(&client, "the fixtures alone", || async {
            let rows = process_rows(&client).await;
            (rows.iter().any(|r| r.0 == gone_pid) && !rows.iter().any(|r| r.0 == 1)).then_some(())
        })
        .await;
        client
            .execute("window.scrollTo(0, 0);", Vec::new())
            .await
            .expect("scroll");
        let png = client.screenshot().await.expect("screenshot");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::write(artifact(), &png).expect("artifact");
        filter.clear().await.expect("clear");
        filter.send_keys(" ").await.expect("type");
        filter.send_keys("\u{e003}").await.expect("backspace");

        // A process that lost events is marked, with the reason on hover,
        // and so is its view.
        let reason = format!(
            "incomplete: {} allocator events lost (kernel maps full); these figures undercount",
            grouped(drops)
        );
        let mark = until(&client, "the incomplete mark", || async {
            let mark = client
                .find(Locator::Css(&format!(
                    "#processes tr[data-pid=\"{lossy_pid}\"] span.incomplete"
                )))
                .await
                .ok()?;
            Some((mark.text().await.ok()?, mark.attr("title").await.ok()??))
        })
        .await;
        assert_eq!(mark, ("\u{26a0} incomplete".to_string(), reason.clone()));
        let marks = client
            .find_all(Locator::Css(&format!(
                "#processes tr[data-pid=\"{pid}\"] span.incomplete"
            )))
            .await
            .expect("find");
        assert!(marks.is_empty(), "the fixture is complete");
        click(&client, &format!("#processes tr[data-pid=\"{lossy_pid}\"]")).await;
        let shown = until(&client, "the view's incomplete mark", || async {
            let note = client.find(Locator::Id("process-incomplete")).await.ok()?;
            if !note.is_displayed().await.ok()? {
                return None;
            }
            note.text().await.ok()
        })
        .await;
        assert_eq!(shown, reason);

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
        assert_size(&row[4], current, false);
        client.close().await.expect("close the session");
    });
    drop(driver);
    fx.end();
    twice.end();
    lossy.end();
}

/// `1234567` as the page writes it: `1,234,567`.
fn grouped(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}
