//! Text: tracemalloc's and Python's formats that the `str()` of every model
//! type is built from ([`format`](mod@format)), and the source lines that
//! `Traceback.format()` shows, of bytes handed in ([`source`]). The bottom
//! of the crate:
//! nothing here imports another module of it.

pub(crate) mod format;
pub(crate) mod source;
