//! `autopsy` on logs built to exhaust it: 256 KiB (the most of a log it
//! reads) of srun task-exit lines naming 65536 hosts and 100000 tasks each,
//! of task lists with one range per id, of exit lines between NCCL timeouts
//! and srun kills (each compared with each), and one line without an end.
//! Each must be read in under a second and 50 MB, its answer a few lines.
//! One test in this file, so that the process's peak RSS is its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use job_diagnosis::first_failure::{self, Why};
use job_diagnosis::release::R24_11;
use job_diagnosis::{autopsy, ended_job, parse_parsable};

/// What `autopsy` reads of a log at most (the CLI's tail).
const LOG: usize = 256 * 1024;

/// `line` repeated up to 256 KiB.
fn repeat(line: &str) -> String {
    line.repeat(LOG / line.len())
}

/// `kB` of a `/proc/self/status` field (`VmRSS`, `VmHWM`).
fn status_kb(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn logs() -> Vec<(&'static str, String)> {
    let many_ranges = {
        let ids: Vec<String> = (0..1500u32).map(|i| (i * 2).to_string()).collect();
        format!("srun: error: node1: tasks {}: Killed\n", ids.join(","))
    };
    let mixed = {
        let mut s = String::new();
        let mut i = 0u32;
        while s.len() < LOG {
            s.push_str(&format!("srun: error: node[1-2]: tasks {i}-{}: Terminated\n", i + 3));
            s.push_str("[rank7]: [Rank 7] Watchdog caught collective operation timeout: ran for 600081 milliseconds\n");
            s.push_str("srun: Terminating StepId=4242.0\n");
            i += 4;
        }
        s
    };
    vec![
        (
            "huge hostlists and task ranges",
            repeat("srun: error: a[0-65535]: tasks 0-99999: Exited with exit code 1\n"),
        ),
        (
            "two brackets of hosts",
            repeat("srun: error: r[0-255]n[0-255]: tasks 0-4294967295: Segmentation fault (core dumped)\n"),
        ),
        ("one range per task id", repeat(&many_ranges)),
        ("exits, timeouts and kills mixed", mixed),
        ("one line without an end", "srun: error: node1: tasks ".to_owned() + &"1,".repeat(LOG / 2)),
    ]
}

#[test]
fn a_crafted_256_kib_log_is_read_in_bounded_time_and_memory() {
    let job = ended_job(&parse_parsable(include_str!("fixtures/first-failure/steps.sacct")), None).unwrap();
    for (name, log) in logs() {
        assert!(log.len() >= LOG * 9 / 10 && log.len() <= LOG + 1024, "{name}: {}", log.len());
        let rss_before = status_kb("VmRSS");
        let hwm_before = status_kb("VmHWM");
        let t = Instant::now();
        let a = autopsy(&job, &[], Some(&log), &[], R24_11);
        let lines = first_failure::section(a.first_failure.as_ref(), a.cause.as_ref());
        let took = t.elapsed();
        let grew_mb = status_kb("VmHWM").saturating_sub(hwm_before.max(rss_before)) / 1024;
        println!("{name}: {took:?}, peak RSS +{grew_mb} MB, {} lines out", lines.len());
        assert!(took < Duration::from_secs(1), "{name}: {took:?}");
        assert!(grew_mb < 50, "{name}: peak RSS grew by {grew_mb} MB");
        // The answer stays a few short lines, whatever the log holds.
        assert!(lines.len() <= 40, "{name}: {} lines", lines.len());
        assert!(lines.iter().all(|l| l.len() <= 1024), "{name}: {:?}", lines.iter().map(String::len).max());
        if let Some(f) = &a.first_failure {
            assert!(f.consequences.len() <= first_failure::MAX_CONSEQUENCES, "{name}");

            if name == "exits, timeouts and kills mixed" {
                assert!(
                    f.consequences.iter().all(|c| c.why == Why::Terminated || c.why == Why::KillOnBadExit)
                );
            }
        }
    }
}
