//! The stacks of a statistics or compare answer, as the profile formats
//! (`format=pprof`, `collapsed`, `svg`) draw them: one [`Row`] per
//! statistic (group), its frames most recent first, with its counts and
//! sizes, and the base side's for a compare.
//!
//! Which frames a row has depends on `group_by`: the traceback's frames for
//! `traceback` (the profile formats' default), its one frame for `lineno`
//! and `filename` (`filename:0`), and one frame named by the group's label
//! for `function` and `module`.
//!
//! A frame with no line info is named by its site (`MODULE!FUNCTION+0xOFFSET`
//! or `MODULE+0xOFFSET`, see [`tracer_model::Frame`]): the profile formats
//! name it by its site too ([`Node::site_name`]), so two sites are two frames
//! there as well, even in one function.
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
    /// The source file; for a frame with no line information the name of its
    /// site (`MODULE!FUNCTION+0xOFFSET`, `MODULE+0xOFFSET`); `<unknown>`;
    /// empty for a label frame.
    pub filename: &'a str,
    /// Where the site starts in `filename`, for a frame named by its site.
    pub site_start: Option<usize>,
    /// The line in `filename`, 0 when unknown.
    pub lineno: u32,
    /// The executable or shared library the frame's address is in, if known.
    pub module: Option<&'a str>,
    /// That module's GNU build id (lowercase hex), if known.
    pub build_id: Option<&'a str>,
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
            site_start: None,
            lineno,
            module,
            build_id: None,
        }
    }

    /// A frame of the unit tests named by its site.
    #[cfg(test)]
    pub fn of_site(frame: &'a Frame) -> Self {
        Self::of_frame(frame)
    }

    fn of_frame(frame: &'a Frame) -> Self {
        let extra = frame.extra.as_deref();
        Node {
            function: extra.and_then(|e| e.function.as_deref()),
            filename: &frame.filename,
            site_start: frame.site_start(),
            lineno: frame.lineno,
            module: extra.and_then(|e| e.module.as_deref()),
            build_id: extra.and_then(|e| e.build_id.as_deref()),
        }
    }

    /// The file of the frame: `filename` without its site (the module's
    /// path), else all of `filename`.
    #[must_use]
    pub fn file(&self) -> &'a str {
        let filename = self.filename;
        self.site_start
            .and_then(|start| filename.get(..start))
            .unwrap_or(filename)
    }

    /// The name of a frame with no line info by its site: `FUNCTION+0xOFFSET`
    /// when it names a function, else `MODULE+0xOFFSET` (all of `filename`);
    /// None for other frames.
    #[must_use]
    pub fn site_name(&self) -> Option<&'a str> {
        let filename = self.filename;
        let site = filename.get(self.site_start?..)?;
        Some(
            site.strip_prefix(tracer_model::SITE_FUNCTION_MARK)
                .unwrap_or(filename),
        )
    }

    /// The name of a function or module group.
    fn of_label(label: &'a str, group_by: GroupBy) -> Self {
        Node {
            function: Some(label),
            filename: "",
            site_start: None,
            lineno: 0,
            module: (group_by == GroupBy::Module).then_some(label),
            build_id: None,
        }
    }

    /// The frame as one item of a folded stack: `function (file:line)`,
    /// `function (file)` without a line, `file:line` or `file` without a
    /// function, the label alone for a group's label; a frame named by its
    /// site `FUNCTION+0xOFFSET (MODULE)`, or `MODULE+0xOFFSET`. `;` (the
    /// separator of folded stacks) becomes `:`, and line breaks spaces.
    #[must_use]
    pub fn folded_name(&self) -> String {
        if let Some(site) = self.site_name() {
            // `MODULE+0xOFFSET` names its module already.
            let name = if std::ptr::eq(site, self.filename) {
                site.to_string()
            } else {
                format!("{site} ({})", self.file())
            };
            return name.replace(';', ":").replace(['\n', '\r'], " ");
        }
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

#[cfg(test)]
mod tests {
    use tracer_model::{Frame, FrameExtra};

    use super::*;

    #[test]
    fn a_frame_without_line_is_named_by_its_site_in_folded_stacks() {
        let in_function = Frame::without_line("/bin/app", Some("alloc;a"), 0x1f);
        let node = Node::of_site(&in_function);
        assert_eq!(node.file(), "/bin/app");
        assert_eq!(node.site_name(), Some("alloc;a+0x1f"));
        assert_eq!(node.folded_name(), "alloc:a+0x1f (/bin/app)");
        let in_module = Frame::without_line("/bin/app", None, 0x115f).with_extra(FrameExtra {
            function: None,
            module: Some("/bin/app".into()),
            address: Some(0x5555_0000_115f),
            build_id: Some("8e1f".into()),
        });
        let node = Node::of_site(&in_module);
        assert_eq!(node.site_name(), Some("/bin/app+0x115f"));
        assert_eq!(node.folded_name(), "/bin/app+0x115f");
        assert_eq!(
            (node.module, node.build_id),
            (Some("/bin/app"), Some("8e1f"))
        );
        // The module's own line 0 has no site.
        let plain = Frame::new("/bin/app", 0);
        assert_eq!(Node::of_site(&plain).site_name(), None);
        assert_eq!(Node::of_site(&plain).folded_name(), "/bin/app");
    }
}
