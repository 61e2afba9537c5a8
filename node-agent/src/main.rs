//! `gpu-node-agent`: the per-node GPU health daemon.
//!
//! It will read NVML (ECC, remapped rows, Xid events) and the kernel log, and
//! drain a bad node in Slurm with a reason that reads well in `sinfo -R`,
//! never touching a drain it did not make. It also writes the node's GPU
//! table that the SPANK plugin binds tasks with. This is the crate's frame;
//! the commands arrive with the agent's own issues.

#![forbid(unsafe_code)]

use std::process::ExitCode;

const USAGE: &str = "\
usage: gpu-node-agent [--version | --help]

The GPU health agent of spank-gpu. Its commands (run, check, status, scan-log,
topology) are not part of this build yet.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version" | "-V") => {
            println!("gpu-node-agent {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        None | Some("--help" | "-h") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("gpu-node-agent: unknown command '{other}'\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
