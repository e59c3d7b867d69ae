//! `tracer`: the command line of tracerd. Parses the command line, makes
//! the client (TCP or the Unix socket, the token), runs the subcommand and
//! turns its error into a message on stderr and an exit status (1: tracerd
//! refused, or a local failure; 2: usage; 3: tracerd unreachable).

mod cli;
mod client;
mod commands;
mod error;
mod format;
mod output;

use std::{process::ExitCode, time::Duration};

use clap::Parser as _;

use crate::{
    cli::Cli,
    client::{Client, Endpoint},
    commands::Context,
    error::CliError,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match start(&cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("tracer: {err:#}");
            ExitCode::from(err.exit_code())
        }
    }
}

fn start(cli: &Cli) -> Result<ExitCode, CliError> {
    let endpoint = match &cli.socket {
        Some(path) => Endpoint::Unix(path.clone()),
        None => Endpoint::Tcp(
            cli.addr
                .strip_prefix("http://")
                .unwrap_or(&cli.addr)
                .trim_end_matches('/')
                .to_string(),
        ),
    };
    let token = match (&cli.token, &cli.token_file) {
        (Some(token), _) => Some(token.trim().to_string()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
                what: format!("read the token file {}", path.display()),
                source,
            })?;
            let token = text.trim();
            if token.is_empty() {
                return Err(CliError::EmptyToken { path: path.clone() });
            }
            Some(token.to_string())
        }
        (None, None) => None,
    };
    let client = Client::new(endpoint, token, Duration::from_secs(cli.timeout.max(1))).map_err(
        |source| CliError::Io {
            what: "start the HTTP client".into(),
            source,
        },
    )?;
    let ctx = Context {
        client,
        json: cli.json,
        color: cli.color,
    };
    commands::run(&ctx, &cli.command)
}
