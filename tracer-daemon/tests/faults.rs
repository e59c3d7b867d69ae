//! Full kernel maps: tracing degrades with counted drops, the data says it is
//! incomplete, sizes stay exact for what is traced, and a block whose
//! allocation was dropped never shows up as a leak.
mod common;

use common::{C_PRELUDE, Fixture, TempDir, Tracerd, compile_c};

/// 5000 allocations of 64 bytes, then 5000 frees: with LIVE_ALLOCS at its
/// smallest (1024 entries for the whole host), most allocations cannot be
/// recorded. stdin and stdout are unbuffered so that stdio allocates nothing.
const FIVE_THOUSAND: &str = r#"
int main(void) {
    static void *keep[5000];
    setvbuf(stdout, NULL, _IONBF, 0);
    setvbuf(stdin, NULL, _IONBF, 0);
    say("ready");
    wait_go();
    for (int i = 0; i < 5000; i++)
        keep[i] = malloc(64);
    say("allocated");
    wait_go();
    for (int i = 0; i < 5000; i++)
        free(keep[i]);
    say("freed");
    wait_go();
    return 0;
}
"#;

fn n(value: &serde_json::Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

#[test]
fn a_full_live_map_counts_drops_says_incomplete_and_leaves_no_phantom_leak() {
    let dir = TempDir::new("livefull");
    let exe = compile_c(
        dir.path(),
        "fivethousand",
        &format!("{C_PRELUDE}{FIVE_THOUSAND}"),
        &[],
    );
    let tracerd = Tracerd::start(&["--max-live-blocks", "1024"]);
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    fx.go();
    fx.expect_line("allocated");
    // Its first allocation is in the loop: only then is it known.
    tracerd.wait_traced(pid);

    let (status, process) = tracerd.get(&format!("/pid/{pid}"));
    assert_eq!(status, 200);
    let (allocs, drops) = (n(&process, "allocs"), n(&process, "drops"));
    assert_eq!(allocs + drops, 5000, "{process}");
    assert!(drops >= 5000 - 1024, "{process}");
    assert_eq!(process["complete"], false);
    assert_eq!(n(&process, "blocks"), allocs);
    assert_eq!(n(&process, "current"), allocs * 64);

    let (status, stats) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
    assert_eq!(status, 200);
    assert_eq!(stats["process"]["complete"], false);
    assert_eq!(n(&stats["process"], "drops"), drops);
    let traced: u64 = stats["statistics"]
        .as_array()
        .expect("statistics")
        .iter()
        .map(|s| n(s, "size"))
        .sum();
    assert_eq!(
        traced,
        allocs * 64,
        "the snapshot holds exactly the recorded blocks"
    );

    fx.go();
    fx.expect_line("freed");
    let (_, process) = tracerd.get(&format!("/pid/{pid}"));
    // Every recorded block's free was seen; every dropped block's free is
    // an unknown free: nothing is left looking like a leak.
    assert_eq!(n(&process, "current"), 0, "{process}");
    assert_eq!(n(&process, "blocks"), 0, "{process}");
    assert_eq!(n(&process, "frees"), allocs, "{process}");
    assert_eq!(n(&process, "unknown_frees"), drops, "{process}");
    let (_, stats) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
    assert_eq!(
        stats["statistics"].as_array().map(Vec::len),
        Some(0),
        "{stats}"
    );

    let (_, metrics) = tracerd.get_text("/metrics");
    let live_full = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tracer_drops_total{reason=\"live_map_full\"} "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("tracer_drops_total{reason=\"live_map_full\"}");
    assert!(live_full >= drops, "{live_full} < {drops}");
    fx.go();
    assert!(fx.finish().success());
}

/// 600 distinct call sites (one function each), 100 bytes apiece: more
/// stacks than a 256-entry stack store holds.
fn many_sites() -> String {
    let mut source = String::from(C_PRELUDE);
    for i in 0..600 {
        source.push_str(&format!(
            "__attribute__((noinline)) void *site{i}(void) {{ return malloc(100); }}\n"
        ));
    }
    source.push_str("static void *(*sites[600])(void) = {");
    for i in 0..600 {
        source.push_str(&format!("site{i},"));
    }
    source.push_str(
        r#"};
int main(void) {
    static void *keep[600];
    setvbuf(stdout, NULL, _IONBF, 0);
    setvbuf(stdin, NULL, _IONBF, 0);
    say("ready");
    wait_go();
    for (int i = 0; i < 600; i++)
        keep[i] = sites[i]();
    say("done");
    wait_go();
    return keep[0] == NULL;
}
"#,
    );
    source
}

#[test]
fn a_full_stack_store_is_counted_and_keeps_sizes_and_lines_exact() {
    let dir = TempDir::new("stacksfull");
    let source = many_sites();
    let exe = compile_c(dir.path(), "manysites", &source, &[]);
    let tracerd = Tracerd::start(&["--max-stacks", "256"]);
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    fx.go();
    fx.expect_line("done");
    tracerd.wait_traced(pid);

    let (status, stats) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0&group_by=lineno"));
    assert_eq!(status, 200, "{stats}");
    let process = &stats["process"];
    assert_eq!(n(process, "blocks"), 600);
    assert_eq!(n(process, "current"), 60_000);
    // A block whose stack found no room keeps its frame 0: every call site
    // is its own line with exactly one block of 100 bytes.
    let list = stats["statistics"].as_array().expect("statistics");
    assert_eq!(list.len(), 600, "{stats}");
    let file = dir.path().join("manysites.c");
    for s in list {
        assert_eq!((n(s, "size"), n(s, "count")), (100, 1), "{s}");
        assert_eq!(s["traceback"][0]["filename"].as_str(), file.to_str(), "{s}");
    }
    let (_, metrics) = tracerd.get_text("/metrics");
    let stack_drops = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tracer_drops_total{reason=\"stack_store_full\"} "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("tracer_drops_total{reason=\"stack_store_full\"}");
    assert!(stack_drops >= 600 - 256, "{stack_drops}");
    fx.go();
    assert!(fx.finish().success());
}
