//! Errors of the snapshot engine.

use crate::text::format::py_repr_str;

/// Why a model operation refused its input. Messages follow CPython's
/// tracemalloc word for word where it has one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A group key other than `filename`, `lineno`, `traceback`, `function`
    /// or `module` (from
    /// [`GroupBy::from_str`](std::str::FromStr::from_str)); `value` is the
    /// text given.
    #[error(
        "unknown key_type: {}; valid values are 'filename', 'lineno', 'traceback', 'function', 'module'",
        py_repr_str(.value)
    )]
    UnknownGroupBy {
        /// The rejected text.
        value: String,
    },
    /// `cumulative` asked together with grouping by `traceback`; cumulative
    /// mode only exists for `filename` and `lineno`. The message keeps
    /// CPython's typo ("cannot by used").
    #[error("cumulative mode cannot by used with key type 'traceback'")]
    CumulativeTraceback,
}
