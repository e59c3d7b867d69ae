//! Query parameters and path segments, parsed without trust: every route
//! names the parameters it accepts ([`Params::parse`]), and every bad name
//! or value is a 400 whose hint names the valid ones.
use std::{collections::HashMap, path::PathBuf, time::Duration};

use tracer_model::{
    AllocatorFamily, AllocatorFamilyFilter, DomainFilter, Filter, GroupBy, TraceFilter,
};

use super::error::ApiError;
use crate::lifecycle::Scope;
use crate::service::{BaseSpec, SnapshotRef};
use crate::snapshot::AllocatorFrames;
use crate::store::check_label;

pub mod spec;
use spec::{ALLOCATOR_FRAMES, Query};

/// Default number of statistics or traces returned (`limit`); 0 means all.
pub const DEFAULT_LIMIT: usize = 50;

/// How text output shows tracebacks, as the query asks (`source`,
/// `tb_limit`, `most_recent_first`; [`Params::text_options`]); the lines
/// are written by `http::render`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TextOptions {
    /// Append `Traceback.format()` lines after each line.
    pub tracebacks: bool,
    /// With source lines (as linecache).
    pub source: bool,
    /// `Traceback.format(limit=...)`.
    pub tb_limit: Option<i64>,
    /// `Traceback.format(most_recent_first=...)`.
    pub most_recent_first: bool,
}

/// `format` of a statistics or compare answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// JSON (the default).
    #[default]
    Json,
    /// tracemalloc's `str()` lines.
    Text,
    /// A gzipped `profile.proto`, as `go tool pprof` reads it.
    Pprof,
    /// Folded stacks, `root;...;leaf bytes` per line.
    Collapsed,
    /// A flame graph, SVG.
    Svg,
}

impl Format {
    /// The valid values, as the 400 names them.
    pub const VALID: &'static str = "json, text, pprof, collapsed, svg";

    /// Whether it draws stacks (`pprof`, `collapsed`, `svg`): then
    /// `group_by` defaults to `traceback` and `limit` to 0 (all).
    #[must_use]
    pub fn is_profile(self) -> bool {
        matches!(self, Format::Pprof | Format::Collapsed | Format::Svg)
    }
}

/// Query parameters, checked against the names a route accepts.
#[derive(Debug, Default)]
pub struct Params(HashMap<String, Vec<String>>);

impl Params {
    /// Parses a query string against the route's `query` (its
    /// [`spec`]): unknown names, and names given twice that do not repeat
    /// (`include`, `exclude`, `domain`, `exclude_domain`, `allocator`,
    /// `exclude_allocator`, and `PUT /scope`'s), are a 400 that lists the
    /// valid ones. Required parameters are the route's to check.
    ///
    /// # Errors
    /// [`ApiError`] 400.
    pub fn parse(raw: Option<&str>, query: Query) -> Result<Self, ApiError> {
        let mut map: HashMap<String, Vec<String>> = HashMap::new();
        for (name, value) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            let Some(param) = spec::find(query, &name) else {
                let allowed = spec::names(query);
                let valid = if allowed.is_empty() {
                    "none (this route takes no query parameters)".to_string()
                } else {
                    allowed.join(", ")
                };
                return Err(ApiError::bad(
                    format!("unknown parameter {name:?}"),
                    format!("valid parameters: {valid}"),
                ));
            };
            let values = map.entry(name.to_string()).or_default();
            if !values.is_empty() && !param.repeat {
                let repeating: Vec<&str> = query
                    .iter()
                    .flat_map(|g| g.iter())
                    .filter(|p| p.repeat)
                    .map(|p| p.name)
                    .collect();
                let hint = if repeating.is_empty() {
                    "give each parameter once".to_string()
                } else {
                    format!(
                        "give each parameter once (only {} repeat)",
                        repeating.join(", ")
                    )
                };
                return Err(ApiError::bad(
                    format!("parameter {name:?} given twice"),
                    hint,
                ));
            }
            values.push(value.to_string());
        }
        Ok(Self(map))
    }

    /// The value of `name`, if given (the first, for a repeatable one).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(|v| v.first()).map(String::as_str)
    }

    /// Every value of `name`.
    pub fn all(&self, name: &str) -> &[String] {
        self.0.get(name).map_or(&[], Vec::as_slice)
    }

    /// `group_by`: filename, lineno (default), traceback, function, module.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn group_by(&self) -> Result<GroupBy, ApiError> {
        match self.get("group_by") {
            None => Ok(GroupBy::Lineno),
            Some(v) => v.parse::<GroupBy>().map_err(|_| {
                ApiError::bad(
                    format!("invalid group_by {v:?}"),
                    "group_by is one of: filename, lineno, traceback, function, module",
                )
            }),
        }
    }

    /// A boolean parameter: true/false/1/0, default false.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") => Ok(true),
            Some(v) => Err(ApiError::bad(
                format!("invalid {name} {v:?}"),
                format!("{name} is one of: true, false, 1, 0"),
            )),
        }
    }

    /// `limit`: how many items, default [`DEFAULT_LIMIT`], 0 for all.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn limit(&self) -> Result<usize, ApiError> {
        self.count(
            "limit",
            DEFAULT_LIMIT,
            "limit is a whole number >= 0 (0 means all)",
        )
    }

    /// A whole number `name`, `default` when absent; `hint` for a bad one.
    ///
    /// # Errors
    /// 400 with `hint`.
    pub fn count(&self, name: &str, default: usize, hint: &str) -> Result<usize, ApiError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse::<usize>()
                .map_err(|_| ApiError::bad(format!("invalid {name} {v:?}"), hint)),
        }
    }

    /// `format` of a traces route: json (default) or text.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn text(&self) -> Result<bool, ApiError> {
        match self.get("format") {
            None | Some("json") => Ok(false),
            Some("text") => Ok(true),
            Some(v) => Err(ApiError::bad(
                format!("invalid format {v:?}"),
                "format is one of: json, text",
            )),
        }
    }

    /// `format` of a statistics or compare route: json (default), text,
    /// pprof, collapsed, svg.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn format(&self) -> Result<Format, ApiError> {
        match self.get("format") {
            None | Some("json") => Ok(Format::Json),
            Some("text") => Ok(Format::Text),
            Some("pprof") => Ok(Format::Pprof),
            Some("collapsed") => Ok(Format::Collapsed),
            Some("svg") => Ok(Format::Svg),
            Some(v) => Err(ApiError::bad(
                format!("invalid format {v:?}"),
                format!("format is one of: {}", Format::VALID),
            )),
        }
    }

    /// `allocator_frames`: `drop` (the default) or `keep`.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn allocator_frames(&self) -> Result<AllocatorFrames, ApiError> {
        match self.get(ALLOCATOR_FRAMES) {
            None => Ok(AllocatorFrames::default()),
            Some(v) => AllocatorFrames::parse(v).ok_or_else(|| {
                ApiError::bad(
                    format!("invalid {ALLOCATOR_FRAMES} {v:?}"),
                    format!(
                        "{ALLOCATOR_FRAMES} is one of: {} (drop, the default, starts tracebacks after the allocator and its wrappers)",
                        AllocatorFrames::VALID
                    ),
                )
            }),
        }
    }

    /// A snapshot parameter (`base`, `new`): an id or a label; `new=now`
    /// (or absent) is None.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn snapshot_ref(&self, name: &str) -> Result<Option<SnapshotRef>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some("now") if name == "new" => Ok(None),
            Some(v) => parse_ref(name, v).map(Some).map_err(|mut e| {
                if name == "new" {
                    e.hint = "new is a snapshot id or label from GET /snapshots, or now".into();
                }
                e
            }),
        }
    }

    /// `label`: None when absent; `Some(None)` for an empty value (removes
    /// a label).
    ///
    /// # Errors
    /// 400 for an invalid label.
    pub fn label(&self) -> Result<Option<Option<String>>, ApiError> {
        match self.get("label") {
            None => Ok(None),
            Some("") => Ok(Some(None)),
            Some(v) => {
                check_label(v).map_err(ApiError::from)?;
                Ok(Some(Some(v.to_string())))
            }
        }
    }

    /// The `filter_traces()` filters: `include`/`exclude` as
    /// `PATTERN[:LINENO][@DOMAIN]` (each with `all_frames`), `domain` and
    /// `exclude_domain` as `DomainFilter`s, `allocator` and
    /// `exclude_allocator` (a trace's source: `glibc`, `jemalloc`, ...) as
    /// `AllocatorFamilyFilter`s.
    ///
    /// # Errors
    /// 400 naming the valid forms.
    pub fn filters(&self) -> Result<Vec<TraceFilter>, ApiError> {
        let all_frames = self.flag("all_frames")?;
        let mut filters = Vec::new();
        for (name, inclusive) in [("include", true), ("exclude", false)] {
            for value in self.all(name) {
                let (pattern, lineno, domain) = parse_filter(name, value)?;
                filters.push(TraceFilter::from(Filter::new(
                    inclusive, &pattern, lineno, all_frames, domain,
                )));
            }
        }
        for (name, inclusive) in [("domain", true), ("exclude_domain", false)] {
            for value in self.all(name) {
                let domain = value.parse::<u32>().map_err(|_| {
                    ApiError::bad(
                        format!("invalid {name} {value:?}"),
                        format!("{name} is a domain (a pid, 0 to 4294967295); repeat it for more"),
                    )
                })?;
                filters.push(TraceFilter::from(DomainFilter { inclusive, domain }));
            }
        }
        for (name, inclusive) in [("allocator", true), ("exclude_allocator", false)] {
            for value in self.all(name) {
                let source = AllocatorFamily::from_name(value).ok_or_else(|| {
                    ApiError::bad(
                        format!("invalid {name} {value:?}"),
                        format!(
                            "{name} is a block's source: one of {}; repeat it for more",
                            AllocatorFamily::all().join(", ")
                        ),
                    )
                })?;
                filters.push(TraceFilter::from(AllocatorFamilyFilter {
                    inclusive,
                    source,
                }));
            }
        }
        Ok(filters)
    }

    /// Options of text output: `source` (source lines), `tb_limit` and
    /// `most_recent_first` of `Traceback.format()`.
    ///
    /// # Errors
    /// 400 naming the valid values, or for `source` without `format=text`.
    pub fn text_options(&self, text: bool) -> Result<TextOptions, ApiError> {
        let source = self.flag("source")?;
        let most_recent_first = self.flag("most_recent_first")?;
        let tb_limit = match self.get("tb_limit") {
            None => None,
            Some(v) => Some(v.parse::<i64>().map_err(|_| {
                ApiError::bad(
                    format!("invalid tb_limit {v:?}"),
                    "tb_limit is Traceback.format()'s limit: a whole number, negative counts from the oldest frame",
                )
            })?),
        };
        let tracebacks = source || tb_limit.is_some() || self.get("most_recent_first").is_some();
        if tracebacks && !text {
            return Err(ApiError::bad(
                "source, tb_limit and most_recent_first shape text output",
                "add format=text (JSON always has every frame)",
            ));
        }
        Ok(TextOptions {
            tracebacks,
            source,
            tb_limit,
            most_recent_first,
        })
    }
}

/// Refuses `allocator_frames` on a route that reads a stored snapshot: a
/// stored snapshot keeps the frames it was taken with.
///
/// # Errors
/// 400 saying why, when the query names `allocator_frames`.
pub fn refuse_allocator_frames(raw: Option<&str>) -> Result<(), ApiError> {
    let given = form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .any(|(name, _)| name == ALLOCATOR_FRAMES);
    if given {
        return Err(stored_allocator_frames(
            "this route reads a stored snapshot",
        ));
    }
    Ok(())
}

/// The 400 of `allocator_frames` given where a stored snapshot is read
/// (`what` says where).
pub fn stored_allocator_frames(what: &str) -> ApiError {
    ApiError::bad(
        format!("{ALLOCATOR_FRAMES} applies only when a snapshot is taken, and {what}"),
        "a stored snapshot keeps the allocator frames it was taken with (its summary's allocator_frames says which); \
         take one with POST /pid/{pid}/snapshots?allocator_frames=keep, or read the live state with GET /pid/{pid}/statistics?allocator_frames=keep",
    )
}

/// `PATTERN[:LINENO][@DOMAIN]`: a trailing `@digits` is the domain, then a
/// trailing `:digits` the line number; the rest is the pattern.
fn parse_filter(name: &str, value: &str) -> Result<(String, Option<u32>, Option<u32>), ApiError> {
    let invalid = |what: &str| {
        ApiError::bad(
            format!("invalid {name} {value:?}: {what}"),
            format!(
                "{name} is PATTERN[:LINENO][@DOMAIN], e.g. {name}=/srv/app/*.c:88@1234 (fnmatch pattern; line and domain are whole numbers)"
            ),
        )
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut rest = value;
    let mut domain = None;
    if let Some((head, tail)) = rest.rsplit_once('@')
        && digits(tail)
    {
        domain = Some(
            tail.parse::<u32>()
                .map_err(|_| invalid("the domain does not fit in 32 bits"))?,
        );
        rest = head;
    }
    let mut lineno = None;
    if let Some((head, tail)) = rest.rsplit_once(':')
        && digits(tail)
    {
        lineno = Some(
            tail.parse::<u32>()
                .map_err(|_| invalid("the line number does not fit in 32 bits"))?,
        );
        rest = head;
    }
    Ok((rest.to_string(), lineno, domain))
}

/// A pid from a path segment or a parameter, written as the kernel writes
/// it: `[1-9][0-9]*`, at most 4294967295. `+1`, `01`, `0` and anything
/// else are refused, so that one process has one spelling.
///
/// # Errors
/// 400 naming the valid form.
pub fn parse_pid(raw: &str) -> Result<u32, ApiError> {
    pid_of(raw).ok_or_else(|| {
        ApiError::bad(
            format!("invalid pid {raw:?}"),
            "pid is a positive integer without sign or leading zeros (1 to 4294967295), e.g. /pid/1234; GET /processes lists them",
        )
    })
}

/// `raw` as a pid: `[1-9][0-9]*` within u32.
fn pid_of(raw: &str) -> Option<u32> {
    let mut bytes = raw.bytes();
    let first = bytes.next()?;
    if !(b'1'..=b'9').contains(&first) || !bytes.all(|b| b.is_ascii_digit()) {
        return None;
    }
    raw.parse::<u32>().ok()
}

/// A snapshot reference from a path or parameter: an id (digits) or a
/// label.
pub fn parse_ref(name: &str, raw: &str) -> Result<SnapshotRef, ApiError> {
    if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        return match raw.parse::<u64>() {
            Ok(id) if id > 0 => Ok(SnapshotRef::Id(id)),
            _ => Err(ApiError::bad(
                format!("invalid {name} {raw:?}"),
                format!("{name} is a snapshot id (1 or more) or label from GET /snapshots"),
            )),
        };
    }
    check_label(raw).map_err(|e| {
        ApiError::bad(
            format!("invalid {name} {raw:?}: {e}"),
            format!("{name} is a snapshot id (1 or more) or label from GET /snapshots"),
        )
    })?;
    Ok(SnapshotRef::Label(raw.to_string()))
}

/// `base`, `since` (exclusive) and `new` of a compare.
pub fn compare_specs(params: &Params) -> Result<(BaseSpec, Option<SnapshotRef>), ApiError> {
    let base = params.snapshot_ref("base")?;
    let since = params.get("since").map(parse_duration).transpose()?;
    let spec = match (base, since) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad(
                "base and since are given together",
                "give base (a snapshot id or label) or since (e.g. 10m), not both",
            ));
        }
        (Some(reference), None) => BaseSpec::Snapshot(reference),
        (None, Some(ago)) => BaseSpec::Since(ago),
        (None, None) => BaseSpec::Default,
    };
    Ok((spec, params.snapshot_ref("new")?))
}

/// A duration like `90s`, `10m`, `2h`, `1d`, `1h30m`, or plain seconds.
pub fn parse_duration(raw: &str) -> Result<Duration, ApiError> {
    let invalid = || {
        ApiError::bad(
            format!("invalid since {raw:?}"),
            "since is a duration: whole numbers with units s, m, h, d (e.g. 90s, 10m, 1h30m), or seconds",
        )
    };
    if raw.is_empty() {
        return Err(invalid());
    }
    if raw.bytes().all(|b| b.is_ascii_digit()) {
        return raw
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| invalid());
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    for c in raw.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(invalid()),
        };
        let n: u64 = number.parse().map_err(|_| invalid())?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(invalid)?;
        number.clear();
    }
    if !number.is_empty() {
        return Err(invalid());
    }
    Ok(Duration::from_secs(total))
}

/// `nframe` of `start(nframe)`, if given.
///
/// # Errors
/// 400 naming the valid values.
pub fn nframe_param(params: &Params) -> Result<Option<u64>, ApiError> {
    params
        .get("nframe")
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                ApiError::bad(format!("invalid nframe {v:?}"), "nframe is a whole number from 1 to tracerd's --nframe (GET /tracing says max_nframe)")
            })
        })
        .transpose()
}

/// An address: `0x` hexadecimal or decimal.
pub fn parse_address(raw: &str) -> Result<u64, ApiError> {
    let parsed = match raw.strip_prefix("0x").or_else(|| raw.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => raw.parse::<u64>().ok(),
    };
    parsed.ok_or_else(|| {
        ApiError::bad(
            format!("invalid address {raw:?}"),
            "address is where a block starts: 0x-prefixed hexadecimal (e.g. 0x55d0c3a2b2a0) or decimal",
        )
    })
}

/// Parses `pid=`, `exe=`, `cgroup=` (each repeatable, [`spec::SET_SCOPE`])
/// into a scope.
///
/// # Errors
/// 400 naming the valid parameters and values.
pub fn parse_scope(query: Option<&str>) -> Result<Scope, ApiError> {
    let params = Params::parse(query, spec::SET_SCOPE)?;
    let mut scope = Scope::default();
    for pid in params.all("pid") {
        scope.pids.insert(parse_pid(pid)?);
    }
    for exe in params.all("exe") {
        scope.exes.insert(PathBuf::from(exe));
    }
    for cgroup in params.all("cgroup") {
        scope.cgroups.insert(cgroup.clone());
    }
    scope.validate().map_err(|e| {
        ApiError::bad(e, "exe is an absolute path; cgroup an absolute cgroup v2 path such as /system.slice/app.service (each repeatable; none traces every process)")
    })?;
    Ok(scope)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests;
