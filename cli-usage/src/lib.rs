//! A command line clap refused, or `--help`/`--version`, as `spank-gpu` and
//! `gpu-node-agent` answer it: written once for both binaries, in a crate of
//! its own so that no crate the plugin links needs clap.

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::process::ExitCode;

/// The exit status of a usage error (and of lint's unreadable script).
pub const USAGE: u8 = 2;

/// `--help` and `--version` on stdout, exit 0. A usage error: exit 2, clap's
/// text on stderr with its first line as `PROGRAM[: COMMAND]: what`, and,
/// when `--json` was given to a command that takes it, also one JSON object
/// on stdout: `{"error", "tip", "usage", "exit": 2}`.
pub fn exit(cmd: &clap::Command, args: &[OsString], e: &clap::Error) -> ExitCode {
    let text = e.render().to_string();
    if !e.use_stderr() {
        print!("{text}");
        return ExitCode::SUCCESS;
    }
    // The command's own words: those after `--` are another program's.
    let words: Vec<&str> =
        args.iter().skip(1).filter_map(|a| a.to_str()).take_while(|a| *a != "--").collect();
    let sub = words.iter().find_map(|w| cmd.find_subcommand(w));
    let program = cmd.get_name();
    let prefix = sub.map_or_else(|| program.to_owned(), |s| format!("{program}: {}", s.get_name()));
    let Some(first) = text.strip_prefix("error: ") else {
        // The help, when no command was given.
        eprint!("{text}");
        return ExitCode::from(USAGE);
    };
    // What is wrong, in one line: clap lists missing arguments on the lines below.
    let lines: Vec<&str> = first.lines().collect();
    let listed = lines.iter().skip(1).take_while(|l| l.starts_with("  ")).count();
    let what = lines[..=listed].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
    eprintln!("{prefix}: {what}");
    for l in &lines[listed + 1..] {
        eprintln!("{l}");
    }
    let takes_json = sub.is_some_and(|s| s.get_arguments().any(|a| a.get_long() == Some("json")));
    if takes_json && words.contains(&"--json") {
        println!("{}", json(&what, &text));
    }
    ExitCode::from(USAGE)
}

/// `{"error", "tip", "usage", "exit": 2}` from clap's text.
fn json(what: &str, text: &str) -> serde_json::Value {
    let tips: Vec<&str> = text.lines().filter_map(|l| l.trim().strip_prefix("tip: ")).collect();
    let usage: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Usage: "))
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.trim_start_matches("Usage: ").trim())
        .collect();
    serde_json::json!({
        "error": what,
        "tip": if tips.is_empty() { None } else { Some(tips.join("; ")) },
        "usage": usage.join("\n"),
        "exit": USAGE,
    })
}
