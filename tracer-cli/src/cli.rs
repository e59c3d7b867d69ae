//! The command line (clap derive): global options (where tracerd is, the
//! token, output) and one subcommand each for `ps`, `top`, `stat`,
//! `snapshot`, `diff`, `run` and `load`; and how their flags map to the
//! API's query parameters (`docs/api.md`: statistics parameters, filters,
//! compare).

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

/// tracer: the command line of tracerd (tracemalloc for every native process).
///
/// Talks to tracerd over TCP (default 127.0.0.1:7466) or its Unix socket.
/// Exit status: 0 done, 1 tracerd refused the request (its message is
/// shown), 2 bad usage, 3 tracerd could not be reached.
#[derive(Debug, Parser)]
#[command(name = "tracer", version)]
pub struct Cli {
    /// tracerd's TCP address, HOST:PORT
    #[arg(
        long,
        env = "TRACER_ADDR",
        default_value = "127.0.0.1:7466",
        global = true
    )]
    pub addr: String,

    /// tracerd's Unix socket (e.g. /run/tracer/api.sock); used instead of --addr
    #[arg(long, env = "TRACER_SOCKET", global = true)]
    pub socket: Option<PathBuf>,

    /// Bearer token to send over TCP (tracerd's auth_token_file)
    #[arg(long, env = "TRACER_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,

    /// File holding the bearer token (surrounding whitespace ignored)
    #[arg(
        long,
        env = "TRACER_TOKEN_FILE",
        global = true,
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,

    /// Print tracerd's JSON answer as it is
    #[arg(long, global = true)]
    pub json: bool,

    /// Colour: auto (a terminal, and NO_COLOR unset), always or never
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, global = true)]
    pub color: ColorChoice,

    /// Seconds a request may take
    #[arg(long, default_value_t = 120, global = true, value_name = "SECONDS")]
    pub timeout: u64,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Traced processes, largest current heap first
    Ps(PsArgs),
    /// A live view of a process's top lines and their growth since it started
    Top(TopArgs),
    /// Statistics of a process now (tracemalloc's Snapshot.statistics)
    Stat(StatArgs),
    /// Take and store a snapshot of a process, and print its statistics
    Snapshot(SnapshotArgs),
    /// Compare a process now with a stored snapshot or with the past
    Diff(DiffArgs),
    /// Run a command, then print what it allocated and still held at exit
    Run(RunArgs),
    /// Load a tracemalloc pickle or a tracer dump into tracerd and print its statistics
    Load(LoadArgs),
}

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Also list processes that ended (their last state)
    #[arg(short, long)]
    pub all: bool,
    /// Exact byte counts instead of KiB/MiB
    #[arg(short, long)]
    pub bytes: bool,
    /// Every process the watch reads instead: resident and anonymous
    /// memory, its growth over the window, and since when it is traced exactly
    #[arg(short, long, conflicts_with = "all")]
    pub watched: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TopSort {
    /// Largest size first
    Size,
    /// Largest growth since the view started first
    Growth,
    /// Most blocks first
    Count,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// The process
    pub pid: u32,
    /// Seconds between refreshes
    #[arg(short = 'd', long, default_value = "2", value_parser = parse_seconds)]
    pub interval: Duration,
    /// Stop after this many refreshes (for scripts)
    #[arg(short = 'n', long)]
    pub iterations: Option<u64>,
    /// Lines shown (0: as many as the terminal holds)
    #[arg(short, long, default_value_t = 0)]
    pub limit: usize,
    /// Order of the lines
    #[arg(short, long, value_enum, default_value_t = TopSort::Size)]
    pub sort: TopSort,
    #[command(flatten)]
    pub group: GroupArgs,
    #[command(flatten)]
    pub filters: FilterArgs,
    /// Exact byte counts instead of KiB/MiB
    #[arg(short, long)]
    pub bytes: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GroupBy {
    Lineno,
    Filename,
    Traceback,
    Function,
    Module,
}

impl GroupBy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lineno => "lineno",
            Self::Filename => "filename",
            Self::Traceback => "traceback",
            Self::Function => "function",
            Self::Module => "module",
        }
    }
}

/// How statistics are grouped (tracemalloc's `key_type`, `cumulative`).
#[derive(Debug, Args)]
pub struct GroupArgs {
    /// Group by line, file, whole traceback, function or module
    #[arg(short, long, value_enum, default_value_t = GroupBy::Lineno)]
    pub group_by: GroupBy,
    /// Count each block at every frame of its traceback, not only the most recent
    #[arg(short, long)]
    pub cumulative: bool,
    /// Keep the allocators' own frames (allocator_frames=keep)
    #[arg(long)]
    pub keep_allocator_frames: bool,
}

/// tracemalloc's `Filter`s and `DomainFilter`s, and tracer's `allocator=`.
#[derive(Debug, Default, Args)]
pub struct FilterArgs {
    /// Keep traces whose file matches PATTERN[:LINENO][@PID] (fnmatch; repeatable)
    #[arg(short, long, value_name = "PATTERN")]
    pub include: Vec<String>,
    /// Drop traces whose file matches PATTERN[:LINENO][@PID] (repeatable)
    #[arg(short = 'x', long, value_name = "PATTERN")]
    pub exclude: Vec<String>,
    /// --include/--exclude look at every frame, not only the most recent
    #[arg(long)]
    pub all_frames: bool,
    /// Keep the traces of this allocator (glibc, musl, jemalloc, tcmalloc, mimalloc, malloc, mmap; repeatable)
    #[arg(long, value_name = "SOURCE")]
    pub allocator: Vec<String>,
    /// Drop the traces of this allocator (repeatable)
    #[arg(long, value_name = "SOURCE")]
    pub exclude_allocator: Vec<String>,
}

/// Output of statistics and diffs: tracemalloc's text or a table.
#[derive(Debug, Args)]
pub struct TextOrTable {
    /// A table sized for the terminal instead of tracemalloc's text
    #[arg(short, long)]
    pub table: bool,
    /// With --table: exact byte counts instead of KiB/MiB
    #[arg(short, long, requires = "table")]
    pub bytes: bool,
}

/// A statistics or compare view: grouping, how many lines, filters.
#[derive(Debug, Args)]
pub struct ViewArgs {
    #[command(flatten)]
    pub group: GroupArgs,
    /// Lines shown (0: all)
    #[arg(short, long, default_value_t = 20)]
    pub limit: usize,
    #[command(flatten)]
    pub filters: FilterArgs,
}

#[derive(Debug, Args)]
pub struct StatArgs {
    /// The process
    pub pid: u32,
    #[command(flatten)]
    pub view: ViewArgs,
    /// tracemalloc's text lines instead of a table
    #[arg(long, conflicts_with = "bytes")]
    pub text: bool,
    /// Exact byte counts instead of KiB/MiB
    #[arg(short, long)]
    pub bytes: bool,
}

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// The process
    pub pid: u32,
    /// A label for the snapshot (unique among stored snapshots)
    #[arg(short = 'L', long)]
    pub label: Option<String>,
    /// Lines of statistics shown (0: all)
    #[arg(short, long, default_value_t = 20)]
    pub limit: usize,
    /// Keep the allocators' own frames (allocator_frames=keep)
    #[arg(long)]
    pub keep_allocator_frames: bool,
    #[command(flatten)]
    pub output: TextOrTable,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The process
    pub pid: u32,
    /// Base: a stored snapshot's id or label (default: the latest one stored of the process)
    #[arg(long, conflicts_with = "since")]
    pub base: Option<String>,
    /// Base: the process as it was this long ago (90s, 10m, 1h30m, 2d), from the automatic snapshots
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// New side: a stored snapshot's id or label (default: now)
    #[arg(long)]
    pub new: Option<String>,
    #[command(flatten)]
    pub view: ViewArgs,
    #[command(flatten)]
    pub output: TextOrTable,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Lines shown of what it held at exit (0: all)
    #[arg(short, long, default_value_t = 10)]
    pub limit: usize,
    #[command(flatten)]
    pub group: GroupArgs,
    /// Exact byte counts instead of KiB/MiB
    #[arg(short, long)]
    pub bytes: bool,
    /// Seconds to wait, once CMD ended, for the processes it started that
    /// still run (then shown as they are, and left running; 0: no wait)
    #[arg(long, default_value = "10", value_parser = parse_wait, value_name = "SECONDS")]
    pub wait_descendants: Duration,
    /// The command and its arguments
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FileFormat {
    /// tracer's own dump (GET /snapshots/{id}/dump)
    Tracer,
    /// A pickle of Python's tracemalloc.Snapshot.dump()
    Tracemalloc,
}

impl FileFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tracer => "tracer",
            Self::Tracemalloc => "tracemalloc",
        }
    }

    /// The format of a file from its first bytes: tracer's magic
    /// `\x89TRSNAP\n`, else a pickle (opcode PROTO, `0x80`); `None` when
    /// it is neither.
    pub fn sniff(head: &[u8]) -> Option<Self> {
        if head.starts_with(b"\x89TRSNAP\n") {
            Some(Self::Tracer)
        } else if head.first() == Some(&0x80) {
            Some(Self::Tracemalloc)
        } else {
            None
        }
    }
}

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// The file
    pub file: PathBuf,
    /// Its format (default: told by its first bytes)
    #[arg(short, long, value_enum)]
    pub format: Option<FileFormat>,
    /// A label for the loaded snapshot
    #[arg(short = 'L', long)]
    pub label: Option<String>,
    /// Lines of statistics shown (0: all)
    #[arg(short, long, default_value_t = 20)]
    pub limit: usize,
    #[command(flatten)]
    pub output: TextOrTable,
}

/// A duration in seconds, fractions allowed (`0.5`, `2`).
fn parse_seconds(text: &str) -> Result<Duration, String> {
    seconds_from(text, 0.05)
}

/// A wait in seconds, fractions allowed, 0 (no wait) to a day.
fn parse_wait(text: &str) -> Result<Duration, String> {
    seconds_from(text, 0.0)
}

/// `text` as seconds from `least` to a day.
fn seconds_from(text: &str, least: f64) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(least..=86_400.0).contains(&seconds) {
        return Err(format!(
            "{text} s is out of range; valid: {least} to 86400 seconds"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Query parameters, in order.
pub type Pairs = Vec<(String, String)>;

fn push(pairs: &mut Pairs, key: &str, value: impl ToString) {
    pairs.push((key.to_string(), value.to_string()));
}

impl GroupArgs {
    /// `group_by`, `cumulative` (only when set) and `allocator_frames`
    /// (only when keep).
    pub fn pairs(&self, pairs: &mut Pairs) {
        push(pairs, "group_by", self.group_by.as_str());
        if self.cumulative {
            push(pairs, "cumulative", "true");
        }
        if self.keep_allocator_frames {
            push(pairs, "allocator_frames", "keep");
        }
    }
}

impl FilterArgs {
    /// The API's filter parameters, each repeated as given.
    pub fn pairs(&self, pairs: &mut Pairs) {
        for (key, values) in [
            ("include", &self.include),
            ("exclude", &self.exclude),
            ("allocator", &self.allocator),
            ("exclude_allocator", &self.exclude_allocator),
        ] {
            for value in values {
                push(pairs, key, value);
            }
        }
        if self.all_frames {
            push(pairs, "all_frames", "true");
        }
    }
}

impl StatArgs {
    /// `GET /pid/{pid}/statistics`'s parameters (`format=text` when asked).
    pub fn pairs(&self, text: bool) -> Pairs {
        let mut pairs = Pairs::new();
        self.view.pairs(&mut pairs, text);
        pairs
    }
}

impl ViewArgs {
    /// What a statistics or compare view takes after its own parameters:
    /// the grouping, `limit`, the filters, and `format=text` when `text`.
    fn pairs(&self, pairs: &mut Pairs, text: bool) {
        view_pairs(pairs, &self.group, self.limit, &self.filters, text);
    }
}

/// See [`ViewArgs::pairs`] (`top` has its own `limit`).
fn view_pairs(
    pairs: &mut Pairs,
    group: &GroupArgs,
    limit: usize,
    filters: &FilterArgs,
    text: bool,
) {
    group.pairs(pairs);
    push(pairs, "limit", limit);
    filters.pairs(pairs);
    if text {
        push(pairs, "format", "text");
    }
}

impl DiffArgs {
    /// `GET /pid/{pid}/compare`'s parameters.
    pub fn pairs(&self, text: bool) -> Pairs {
        let mut pairs = Pairs::new();
        if let Some(base) = &self.base {
            push(&mut pairs, "base", base);
        }
        if let Some(since) = &self.since {
            push(&mut pairs, "since", since);
        }
        if let Some(new) = &self.new {
            push(&mut pairs, "new", new);
        }
        self.view.pairs(&mut pairs, text);
        pairs
    }
}

impl TopArgs {
    /// `GET /pid/{pid}/compare`'s parameters against the view's base
    /// snapshot: every line (sorted here), the view's grouping and filters.
    pub fn pairs(&self, base: u64) -> Pairs {
        let mut pairs = Pairs::new();
        push(&mut pairs, "base", base);
        view_pairs(&mut pairs, &self.group, 0, &self.filters, false);
        pairs
    }
}

#[cfg(test)]
mod tests;
