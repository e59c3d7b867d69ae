//! Helpers shared by the model's differential tests.

/// A fresh directory under the system's temporary directory, removed on
/// drop: the root suite's and xtask's.
pub use tracer_testkit::TempDir;
