//! tracerd's configuration: command-line flags, with one `Default` as the
//! single source of default values.
use std::{net::SocketAddr, path::PathBuf};

use clap::Parser;

/// tracerd: Python's tracemalloc for every native process on this host.
///
/// Traces glibc allocations of every process with eBPF uprobes and serves
/// tracemalloc's statistics, snapshots and diffs over HTTP.
#[derive(Clone, Debug, Parser)]
#[command(name = "tracerd", version, about, long_about = None)]
pub struct Config {
    /// Address to serve the HTTP API on (loopback only: 127.0.0.1 or ::1).
    #[arg(long, default_value = "127.0.0.1:7466", value_parser = parse_loopback)]
    pub listen: SocketAddr,

    /// Frames kept per traceback (tracemalloc's nframe), 1 to 127.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=127))]
    pub nframe: u32,

    /// Directory for tracerd's state (created if missing).
    #[arg(long, default_value = "/var/lib/tracer")]
    pub state_dir: PathBuf,

    /// Seconds an exited process's last state stays queryable.
    #[arg(long, default_value_t = 600)]
    pub exited_retention: u64,

    /// Capacity of the kernel's live-block map, all processes together.
    #[arg(long, default_value_t = 4 * 1024 * 1024, value_parser = clap::value_parser!(u32).range(1024..=(1 << 26)))]
    pub max_live_blocks: u32,

    /// Capacity of the kernel's stack map in distinct stacks.
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(256..=(1 << 22)))]
    pub max_stacks: u32,

    /// Capacity of the kernel's per-process map in processes.
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(64..=(1 << 22)))]
    pub max_procs: u32,

    /// glibc to probe (repeatable); default: every libc.so.6 the dynamic
    /// loader resolves (tracerd's own, and ld.so.cache's).
    #[arg(long)]
    pub libc: Vec<PathBuf>,

    /// Log filter (tracing's EnvFilter syntax), e.g. info or tracer_daemon=debug.
    #[arg(long, default_value = "info")]
    pub log: String,
}

impl Default for Config {
    fn default() -> Self {
        Self::parse_from(["tracerd"])
    }
}

fn parse_loopback(value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value
        .parse()
        .map_err(|e| format!("{e}; expected ADDR:PORT such as 127.0.0.1:7466 or [::1]:7466"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{addr} is not a loopback address; tracerd serves only 127.0.0.1 or ::1"
        ));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = Config::default();
        assert_eq!(config.listen.to_string(), "127.0.0.1:7466");
        assert_eq!(config.nframe, 16);
        assert_eq!(config.state_dir, PathBuf::from("/var/lib/tracer"));
    }

    #[test]
    fn out_of_range_values_are_refused_with_the_range() {
        let err = Config::try_parse_from(["tracerd", "--nframe", "128"]).unwrap_err();
        assert!(err.to_string().contains("1..=127"), "{err}");
        let err = Config::try_parse_from(["tracerd", "--listen", "0.0.0.0:7466"]).unwrap_err();
        assert!(err.to_string().contains("not a loopback address"), "{err}");
    }
}
