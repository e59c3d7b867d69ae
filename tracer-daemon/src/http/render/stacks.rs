//! The stacks of a statistics or compare answer, as the profile formats
//! (`format=pprof`, `collapsed`, `svg`) draw them: one [`Row`] per
//! statistic (group), its frames most recent first, with its counts and
//! sizes, and the base side's for a compare.
//!
//! Which frames a row has depends on `group_by`: the traceback's frames for
//! `traceback` (the profile formats' default), its one frame for `lineno`
//! and `filename` (`filename:0`), and one frame named by the group's label
//! for `function` and `module`.
use tracer_model::{Frame, GroupBy, Statistic, StatisticDiff, Traceback};

/// The name of a frame whose function is unknown (as `group_by=function`
/// names its group).
pub const UNKNOWN_FUNCTION: &str = "<unknown>";

/// One frame of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node<'a> {
    /// The function, from the frame's symbolization (DWARF), or a group's
    /// label; None when unknown.
    pub function: Option<&'a str>,
    /// The source file (or the module's path when the frame has no line
    /// information, or `<unknown>`); empty for a label frame.
    pub filename: &'a str,
    /// The line in `filename`, 0 when unknown.
    pub lineno: u32,
    /// The executable or shared library the frame's address is in, if known.
    pub module: Option<&'a str>,
}

impl<'a> Node<'a> {
    /// A frame of the unit tests.
    #[cfg(test)]
    pub fn of(
        function: Option<&'a str>,
        filename: &'a str,
        lineno: u32,
        module: Option<&'a str>,
    ) -> Self {
        Node {
            function,
            filename,
            lineno,
            module,
        }
    }

    fn of_frame(frame: &'a Frame) -> Self {
        let extra = frame.extra.as_deref();
        Node {
            function: extra.and_then(|e| e.function.as_deref()),
            filename: &frame.filename,
            lineno: frame.lineno,
            module: extra.and_then(|e| e.module.as_deref()),
        }
    }

    /// The name of a function or module group.
    fn of_label(label: &'a str, group_by: GroupBy) -> Self {
        Node {
            function: Some(label),
            filename: "",
            lineno: 0,
            module: (group_by == GroupBy::Module).then_some(label),
        }
    }

    /// The frame as one item of a folded stack: `function (file:line)`,
    /// `function (file)` without a line, `file:line` or `file` without a
    /// function, the label alone for a group's label. `;` (the separator of
    /// folded stacks) becomes `:`, and line breaks spaces.
    #[must_use]
    pub fn folded_name(&self) -> String {
        let name = match (self.function, self.filename.is_empty(), self.lineno) {
            (Some(function), true, _) => function.to_string(),
            (Some(function), false, 0) => format!("{function} ({})", self.filename),
            (Some(function), false, line) => format!("{function} ({}:{line})", self.filename),
            (None, _, 0) => self.filename.to_string(),
            (None, _, line) => format!("{}:{line}", self.filename),
        };
        name.replace(';', ":").replace(['\n', '\r'], " ")
    }
}

/// One group of a statistics or compare answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row<'a> {
    /// Most recent call first; never empty.
    pub frames: Vec<Node<'a>>,
    /// Blocks of the group (of the new side, for a compare).
    pub count: u64,
    /// Their bytes.
    pub size: u64,
    /// `count_diff` of a compare (new minus base); `count` for statistics.
    pub count_diff: i64,
    /// `size_diff` of a compare; `size` for statistics.
    pub size_diff: i64,
}

impl Row<'_> {
    /// Bytes of the base side of a compare (`size - size_diff`); 0 for
    /// statistics.
    #[must_use]
    pub fn base_size(&self) -> u64 {
        let base = i128::from(self.size) - i128::from(self.size_diff);
        u64::try_from(base).unwrap_or(0)
    }
}

fn frames<'a>(
    traceback: &'a Traceback,
    label: Option<&'a str>,
    group_by: GroupBy,
) -> Vec<Node<'a>> {
    match (group_by, label) {
        (GroupBy::Function | GroupBy::Module, Some(label)) => {
            vec![Node::of_label(label, group_by)]
        }
        _ => traceback.frames().iter().map(Node::of_frame).collect(),
    }
}

/// The rows of `statistics`, in their order.
#[must_use]
pub fn of_statistics(statistics: &[Statistic], group_by: GroupBy) -> Vec<Row<'_>> {
    statistics
        .iter()
        .map(|s| Row {
            frames: frames(&s.traceback, s.label.as_deref(), group_by),
            count: s.count,
            size: s.size,
            count_diff: i64::try_from(s.count).unwrap_or(i64::MAX),
            size_diff: i64::try_from(s.size).unwrap_or(i64::MAX),
        })
        .collect()
}

/// The rows of a compare's `diffs`, in their order (unchanged groups
/// too).
#[must_use]
pub fn of_diffs(diffs: &[StatisticDiff], group_by: GroupBy) -> Vec<Row<'_>> {
    diffs
        .iter()
        .map(|d| Row {
            frames: frames(&d.traceback, d.label.as_deref(), group_by),
            count: d.count,
            size: d.size,
            count_diff: d.count_diff,
            size_diff: d.size_diff,
        })
        .collect()
}
