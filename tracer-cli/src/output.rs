//! Writing to the terminal: stdout lines (a closed pipe, as in `tracer ps |
//! head`, ends the output quietly), notes on stderr, and a progress line on
//! stderr (indicatif; drawn only when stderr is a terminal) while long work
//! runs.

use std::{
    io::{ErrorKind, Write as _},
    time::Duration,
};

use indicatif::{ProgressBar, ProgressStyle};

use crate::error::CliError;

/// Writes `text` and a newline to stdout. A reader that went away is not
/// an error.
///
/// # Errors
/// [`CliError::Io`] when stdout cannot be written otherwise.
pub fn emit(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|()| {
            if text.ends_with('\n') {
                Ok(())
            } else {
                out.write_all(b"\n")
            }
        })
        .and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() != ErrorKind::BrokenPipe => Err(CliError::Io {
            what: "write to stdout".into(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// A note for the person at the terminal, on stderr (`tracer: ...`).
pub fn note(text: &str) {
    eprintln!("tracer: {text}");
}

/// Runs `work` with a spinner and `message` on stderr (when it is a
/// terminal), cleared when the work is done.
pub fn with_progress<T>(message: &str, work: impl FnOnce() -> T) -> T {
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        bar.set_style(style);
    }
    bar.set_message(message.to_string());
    bar.enable_steady_tick(Duration::from_millis(100));
    let out = work();
    bar.finish_and_clear();
    out
}
