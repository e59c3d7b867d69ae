//! `tracer run -- CMD ARGS`: starts CMD, waits for the end of it and of
//! every process it started (its children, theirs, forks without exec, the
//! commands of `sh -c 'a; b'`), and prints what each allocated and what it
//! still held when it ended (its leaks), as heaptrack and valgrind
//! (`--trace-children=yes`) users expect: one row per process, then for
//! each process that held blocks at its end, where, by line. tracer exits
//! with CMD's status (128 + the signal that killed it), whatever tracerd
//! said: a failure to get the report is a note on stderr. Only before CMD
//! starts does tracer refuse (status 3) when tracerd cannot be reached: the
//! run would tell nothing.
//!
//! Where the data comes from: tracerd traces every new program from its
//! first allocation and keeps an ended image's last state (`GET
//! /processes`: its totals, allocation and free counts, `ppid`,
//! `generation`) and its last blocks (the statistics route) for
//! `exited_retention` seconds (600 by default). Those blocks are exactly
//! what the program held at its end. So nothing is taken before an exit
//! (which cannot be timed from outside):
//!
//! 1. tracer is a child subreaper ([`children`]): an orphan of the tree is
//!    re-parented to tracer, so the tree has ended when every child of
//!    tracer is a zombie. tracer waits for that (`waitid(WNOWAIT)`, leaving
//!    them unreaped, so their pids are not reused meanwhile), at most
//!    `--wait-descendants` seconds after CMD ended (10 by default): the
//!    processes still running then (a daemon CMD started) are reported as
//!    they are, `running`, and left running.
//! 2. It waits until tracerd has handled those ends: a helper (tracer's
//!    own `--version`, which allocates and exits) runs after them, and
//!    tracerd handles the kernel's events in order, so once it shows the
//!    helper ended, it has every end before it; a process it then has no
//!    record of made no allocation it saw. tracerd may lag behind the
//!    kernel (seconds, on a loaded host, or while it starts): tracer waits
//!    for the helper up to [`LAG_WITHIN`] when tracerd traces every process
//!    (`GET /scope`), else (the helper may be out of its scope) only
//!    [`RECORD_WITHIN`].
//! 3. It builds the tree from `GET /processes` ([`tree`]), reads the
//!    statistics of each member that held blocks at its end, prints
//!    ([`report`]), and only then reaps its children.

mod children;
mod report;
mod tree;

use std::{
    process::ExitCode,
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde::Serialize;
use tracer_api::{ProcessList, ProcessState, ScopeView, StatisticsAnswer, StatisticsTarget};

use super::{Context, warn_incomplete};
use crate::{
    cli::RunArgs,
    client::{ClientError, query},
    error::CliError,
    format::Complete as _,
    output::{emit, note},
};
use children::{Children, Ending};
use tree::{Member, Record};

/// How long tracerd may lag behind the kernel's events: to report the end
/// of an image it shows alive, or the helper's end (step 2).
const LAG_WITHIN: Duration = Duration::from_secs(30);
/// How long tracer waits for a record of a process that ended when the
/// helper may be out of tracerd's scope (step 2).
const RECORD_WITHIN: Duration = Duration::from_secs(2);
/// How often tracerd's list is read while waiting.
const POLL: Duration = Duration::from_millis(20);

pub fn run(ctx: &Context, args: &RunArgs) -> Result<ExitCode, CliError> {
    ctx.client.get("/health")?;
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| CliError::Run("no command given".into()))?;
    let shown = program.to_string_lossy().into_owned();
    children::become_subreaper()?;
    // tracerd traces on demand by default (`exact = "demand"`): ask it to
    // trace tracer and every process it forks from now on, the command's
    // whole tree, from their first allocation; let go at the end.
    let tree = TracedTree::start(ctx);
    let since_ms = unix_ms();
    let mut child = std::process::Command::new(program)
        .args(rest)
        .spawn()
        .map_err(|e| CliError::Run(format!("cannot start {shown}: {e}")))?;
    // The terminal's Ctrl-C and Ctrl-\ reach the command (the same process
    // group); tracer stays to report on it, and stops waiting for the rest
    // of the tree.
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGQUIT] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted)).map_err(|source| {
            CliError::Io {
                what: "handle SIGINT".into(),
                source,
            }
        })?;
    }
    let root = child.id();
    let ending = children::wait_unreaped(root)?;
    let waited = children::wait_tree(args.wait_descendants, &interrupted);
    if !waited.running.is_empty() {
        let (who, pids) = if waited.running.len() == 1 {
            ("a process it started is", "pid")
        } else {
            ("processes it started are", "pids")
        };
        note(&format!(
            "{who} ({pids} {}) still running {} s after {shown} ended (--wait-descendants): shown as they are now, left running",
            list(&waited.running),
            args.wait_descendants.as_secs_f64()
        ));
    }
    let helper = Helper::start();
    let gathered = gather(ctx, args, root, since_ms, &waited, helper.as_ref());
    for (pid, _) in &waited.ended {
        if *pid != root {
            children::reap(*pid);
        }
    }
    if let Some(helper) = helper {
        children::reap(helper.pid);
    }
    let _ = child.wait();
    let printed = gathered
        .map_err(CliError::from)
        .and_then(|gathered| print(ctx, args, &shown, root, ending, &gathered));
    if let Err(e) = printed {
        note(&format!("no report of {shown} (pid {root}): {e}"));
    }
    tree.end(ctx);
    Ok(ExitCode::from(ending.exit_code()))
}

/// tracer's own process traced exactly with its descendants
/// (`tracing/start?descendants=true`) for the run.
struct TracedTree {
    pid: u32,
}

impl TracedTree {
    /// Asks tracerd to trace this process and its descendants. A 404 is
    /// expected (this process allocated nothing since): tracing started;
    /// any other refusal (403: not an operator) is a note, and the run
    /// goes on with what tracerd traces anyway.
    fn start(ctx: &Context) -> Self {
        let pid = std::process::id();
        match ctx
            .client
            .post(&format!("/pid/{pid}/tracing/start?descendants=true"), None)
        {
            Ok(_) | Err(ClientError::Api { status: 404, .. }) => {}
            Err(e) => note(&format!(
                "tracerd could not trace the command's tree exactly ({e}): it shows what tracerd traces anyway (all of it with exact = \"all\")"
            )),
        }
        Self { pid }
    }

    /// Lets the tree go (`tracing/stop`): its probes detached.
    fn end(self, ctx: &Context) {
        let _ = ctx
            .client
            .post(&format!("/pid/{}/tracing/stop", self.pid), None);
    }
}

/// Unix ms now (tracerd's `first_seen_ms` are the same clock's).
fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or(0)
}

fn list(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The helper of step 2: tracer's own `--version`, exited, unreaped.
struct Helper {
    pid: u32,
    since_ms: i64,
}

impl Helper {
    /// Runs it to its end; None when it cannot be run.
    fn start() -> Option<Self> {
        let since_ms = unix_ms();
        let child = std::process::Command::new(std::env::current_exe().ok()?)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let pid = child.id();
        children::wait_unreaped(pid).ok()?;
        Some(Self { pid, since_ms })
    }

    /// True when `records` show the helper ended.
    fn seen_ended(&self, records: &[Record]) -> bool {
        latest(records, self.pid, self.since_ms).is_some_and(|r| r.state() == ProcessState::Exited)
    }
}

/// The last image of `pid` first seen since `since_ms` in `records`.
fn latest(records: &[Record], pid: u32, since_ms: i64) -> Option<&Record> {
    records
        .iter()
        .filter(|r| r.pid() == pid && r.first_seen_ms() >= since_ms)
        .max_by_key(|r| (r.first_seen_ms(), r.figure(|v| u64::from(v.generation))))
}

/// The tree and the statistics of its members that held blocks.
struct Gathered {
    members: Vec<Member>,
    tables: Vec<(usize, StatisticsAnswer)>,
}

fn gather(
    ctx: &Context,
    args: &RunArgs,
    root: u32,
    since_ms: i64,
    waited: &Children,
    helper: Option<&Helper>,
) -> Result<Gathered, ClientError> {
    let mut records = settle(ctx, since_ms, waited, helper)?;
    if let Some(helper) = helper {
        records.retain(|r| r.pid() != helper.pid || r.first_seen_ms() < helper.since_ms);
    }
    // The processes tracer waited for whose program tracerd has no record
    // of: none of it, or none since an exec.
    for (pid, _) in &waited.ended {
        let last = latest(&records, *pid, since_ms);
        if last.is_some_and(|r| r.state() != ProcessState::Exec) {
            continue;
        }
        let seen = last.map_or(since_ms, |r| {
            r.figure(|v| v.ended_ms.unwrap_or(0)).max(r.first_seen_ms()) + 1
        });
        if let Some((ppid, comm)) = children::parent_and_comm(*pid) {
            records.push(tree::untraced(*pid, ppid, &comm, seen));
        }
    }
    let members = tree::build(&records, root, std::process::id(), since_ms);
    let mut tables = Vec::new();
    for (index, member) in members.iter().enumerate() {
        let record = &member.record;
        if !member.latest
            || tree::is_untraced(record)
            || !matches!(record.state(), ProcessState::Exited | ProcessState::Alive)
            || record.figure(|v| v.blocks) == 0
        {
            continue;
        }
        let pid = record.pid();
        let mut pairs = Vec::new();
        args.group.pairs(&mut pairs);
        pairs.push(("limit".into(), args.limit.to_string()));
        let answer = ctx
            .client
            .get_typed::<StatisticsAnswer>(&format!("/pid/{pid}/statistics{}", query(&pairs)));
        match answer {
            Ok(stats) if generation_of(&stats) == record.view().map(|v| v.generation) => {
                tables.push((index, stats));
            }
            Ok(_) => note(&format!(
                "pid {pid} runs another program now: the lines of the one that ended are not shown"
            )),
            Err(e) => note(&format!("no lines of pid {pid}: {e}")),
        }
    }
    Ok(Gathered { members, tables })
}

/// The generation of the process a statistics answer is of, if it names
/// one.
fn generation_of(stats: &StatisticsAnswer) -> Option<u32> {
    match &stats.target {
        StatisticsTarget::Process {
            process: Some(process),
            ..
        } => Some(process.generation),
        _ => None,
    }
}

/// `GET /processes` once tracerd has handled the ends of the processes
/// tracer waited for (see the module's comment, step 2): none of them
/// shown alive (for at most [`LAG_WITHIN`]), and the helper ended (for at
/// most [`LAG_WITHIN`] when tracerd traces every process, else
/// [`RECORD_WITHIN`]).
fn settle(
    ctx: &Context,
    since_ms: i64,
    waited: &Children,
    helper: Option<&Helper>,
) -> Result<Vec<Record>, ClientError> {
    let every_process = ctx
        .client
        .get("/scope")
        .and_then(|answer| answer.typed::<ScopeView>("GET /scope"))
        .is_ok_and(|scope| scope.all_processes);
    let record_within = if every_process && helper.is_some() {
        LAG_WITHIN
    } else {
        RECORD_WITHIN
    };
    let start = Instant::now();
    loop {
        let body: ProcessList = ctx.client.get_typed("/processes")?;
        let records: Vec<Record> = body
            .processes
            .into_iter()
            .map(|p| Record::Traced(Box::new(p)))
            .collect();
        let alive: Vec<u32> = waited
            .ended
            .iter()
            .map(|(pid, _)| *pid)
            .filter(|pid| {
                latest(&records, *pid, since_ms).is_some_and(|r| r.state() == ProcessState::Alive)
            })
            .collect();
        let handled = helper.is_some_and(|h| h.seen_ended(&records));
        let elapsed = start.elapsed();
        let ends_in = alive.is_empty() || elapsed >= LAG_WITHIN;
        if ends_in && (handled || elapsed >= record_within) {
            if !alive.is_empty() {
                note(&format!(
                    "tracerd still shows pids {} alive {} s after they ended: shown as it says",
                    list(&alive),
                    LAG_WITHIN.as_secs()
                ));
            } else if !handled && helper.is_some() {
                note(&format!(
                    "tracerd did not show the end of tracer's helper (pid {}) within {} s: it may lag, and a process shown untraced may have allocated",
                    helper.map_or(0, |h| h.pid),
                    elapsed.as_secs()
                ));
            }
            return Ok(records);
        }
        std::thread::sleep(POLL);
    }
}

fn print(
    ctx: &Context,
    args: &RunArgs,
    shown: &str,
    root: u32,
    ending: Ending,
    gathered: &Gathered,
) -> Result<(), CliError> {
    if ctx.json {
        let report = JsonReport {
            pid: root,
            ended: match ending {
                Ending::Code(status) => Ended::Status { status },
                Ending::Signal(signal) => Ended::Signal { signal },
            },
            exit_code: ending.exit_code(),
            processes: gathered
                .members
                .iter()
                .map(|m| JsonMember {
                    record: &m.record,
                    depth: m.depth,
                    adopted: m.adopted,
                })
                .collect(),
            statistics: gathered
                .tables
                .iter()
                .filter_map(|(index, stats)| {
                    let member = gathered.members.get(*index)?;
                    Some((member.record.pid().to_string(), stats))
                })
                .collect(),
        };
        // Through a Value, as it was built: its keys sorted at every level.
        let text = serde_json::to_value(&report).map_err(|e| CliError::Run(e.to_string()))?;
        return emit(&text.to_string());
    }
    for member in &gathered.members {
        if !member.record.complete() {
            warn_incomplete(
                &format!("pid {} ({})", member.record.pid(), member.record.comm()),
                &member.record,
            );
        }
    }
    let outcome = report::Outcome {
        shown,
        root,
        ending,
        members: &gathered.members,
        tables: &gathered.tables,
        group_by: args.group.group_by.as_str(),
        tracer_pid: std::process::id(),
    };
    emit(&report::render(&outcome, &ctx.style(args.bytes)))
}

/// `tracer run --json`: the command, how it ended, its tree and the
/// statistics of the members that held blocks (sent through a Value:
/// keys sorted at every level).
#[derive(Serialize)]
struct JsonReport<'a> {
    /// The command's pid.
    pid: u32,
    /// How the command ended.
    ended: Ended,
    /// tracer's exit status (the command's, or 128 + the signal).
    exit_code: u8,
    /// The tree's images, in the report's order.
    processes: Vec<JsonMember<'a>>,
    /// The statistics answers of the members that held blocks, by pid.
    statistics: std::collections::BTreeMap<String, &'a StatisticsAnswer>,
}

/// How the command ended: `{"status": N}` or `{"signal": N}`.
#[derive(Serialize)]
#[serde(untagged)]
enum Ended {
    /// It exited with this status.
    Status { status: i32 },
    /// This signal killed it.
    Signal { signal: i32 },
}

/// One image of the tree: its record, its depth (0: the command's pid)
/// and whether tracer adopted it.
#[derive(Serialize)]
struct JsonMember<'a> {
    #[serde(flatten)]
    record: &'a Record,
    depth: usize,
    adopted: bool,
}

#[cfg(test)]
mod tests {
    use tracer_api::ProcessState;

    use super::*;
    use crate::format::tests::{answer, process};

    #[test]
    fn the_json_report_is_sorted_at_every_level() {
        let traced = Record::Traced(Box::new(process(5, "names", 64, ProcessState::Exited)));
        let untraced = tree::untraced(6, Some(5), "true", 7);
        let stats = answer(Vec::new());
        let report = JsonReport {
            pid: 5,
            ended: Ended::Signal { signal: 9 },
            exit_code: 137,
            processes: vec![
                JsonMember {
                    record: &traced,
                    depth: 0,
                    adopted: false,
                },
                JsonMember {
                    record: &untraced,
                    depth: 1,
                    adopted: true,
                },
            ],
            statistics: [("5".to_string(), &stats)].into_iter().collect(),
        };
        let text = serde_json::to_value(&report).unwrap().to_string();
        assert_eq!(
            text,
            concat!(
                r#"{"ended":{"signal":9},"exit_code":137,"pid":5,"processes":["#,
                r#"{"adopted":false,"allocs":0,"blocks":0,"cgroup":null,"comm":"names","complete":true,"container_id":null,"current":64,"cut_tracebacks":0,"depth":0,"drops":0,"ended_ms":null,"exe":null,"first_seen_ms":0,"frees":0,"generation":1,"is_tracing":true,"nspid":null,"owner_uid":null,"peak":64,"pid":5,"ppid":null,"state":"exited","traceback_limit":1,"unknown_frees":0},"#,
                r#"{"adopted":true,"comm":"true","depth":1,"first_seen_ms":7,"pid":6,"ppid":5,"state":"exited","untraced":true}],"#,
                r#""statistics":{"5":{"allocator_frames":"drop","complete":true,"cumulative":false,"cut_tracebacks":0,"cut_tracebacks_by_pid":{},"drops":0,"drops_by_pid":{},"filters":{},"group_by":"lineno","limit":10,"pid":1,"process":null,"statistics":[],"total":0,"totals":"per_block","traceback_limit":1,"traces":0}}}"#,
            )
        );
    }
}
