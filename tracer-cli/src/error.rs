//! The errors of the commands, and the exit status each gives: 1 when
//! tracerd refused a request or a local step failed, 3 when tracerd could
//! not be reached (clap's usage errors are 2).

use std::path::PathBuf;

use crate::client::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A local input or output failed.
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A file whose format cannot be told.
    #[error(
        "cannot tell the format of {}: it is neither a tracer dump nor a pickle; pass --format tracer or --format tracemalloc",
        path.display()
    )]
    UnknownFormat { path: PathBuf },
    /// The token file holds no token.
    #[error("the token file {} is empty", path.display())]
    EmptyToken { path: PathBuf },
    /// `tracer run` could not start or follow its command.
    #[error("{0}")]
    Run(String),
}

impl CliError {
    /// The process's exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Client(
                ClientError::Unreachable { .. }
                | ClientError::Transport { .. }
                | ClientError::Timeout { .. },
            ) => 3,
            _ => 1,
        }
    }
}
