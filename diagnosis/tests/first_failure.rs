//! `autopsy`'s first failure and cause on a two-node job: for each cause
//! class, a log where rank 3 on node2 prints that class's real message (the
//! framework's own text, its source named below) and exits 1 while the other
//! ranks block, then srun kills them (`--kill-on-bad-exit`); and the steps'
//! accounting. See `fixtures/first-failure/SOURCES.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use job_diagnosis::causes::{self, CLASSES, CauseClass, classify_line};
use job_diagnosis::first_failure::{self, AtFrom, Death, Why, read_log};
use job_diagnosis::release::{R22_05, R24_11, R26_05};
use job_diagnosis::{NodeEvent, autopsy, decode_agent_reason, ended_job, parse_parsable};

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!("fixtures/first-failure/", $name))
    };
}

/// The scenarios: the log, the class rank 3's message shows, and where that
/// message's text comes from.
const SCENARIOS: &[(&str, &str, CauseClass)] = &[
    // torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp: "[Rank N] Watchdog caught
    // collective operation timeout: WorkNCCL(...) ran for N milliseconds before timing out."
    (fixture!("nccl-timeout.log"), "nccl-timeout", CauseClass::NcclTimeout),
    // c10/cuda/CUDAException.cpp: "CUDA error: " + cudaGetErrorString(cudaErrorIllegalAddress),
    // with c10/cuda/CUDAMiscFunctions.cpp's asynchronous-error suffix.
    (fixture!("cuda-illegal-address.log"), "cuda-illegal-address", CauseClass::CudaIllegalAddress),
    // The same, cudaErrorInvalidDevice, with get_cuda_error_help's "GPU device may be out of range".
    (fixture!("invalid-device-ordinal.log"), "invalid-device-ordinal", CauseClass::InvalidDeviceOrdinal),
    // torch/csrc/distributed/c10d/socket.cpp, SocketListenOp::run and tryListen:
    // "The server socket has failed to listen on any local network address." and
    // "The server socket has failed to bind to {} (errno: 98 - Address already in use)."
    (fixture!("address-in-use.log"), "address-in-use", CauseClass::AddressInUse),
    // torch/csrc/distributed/c10d/socket.cpp, SocketConnectOp::throwTimeoutError:
    // "The client socket has timed out after {}ms while trying to connect to ({}, {})."
    (fixture!("store-connect-timeout.log"), "store-connect-timeout", CauseClass::StoreConnectTimeout),
    // NCCL src/init.cc, ncclGetErrorString(ncclSystemError): "unhandled system error (run
    // with NCCL_DEBUG=INFO for details)"; src/debug.cc: "HOST:PID:TID [DEV] FILE:LINE NCCL WARN ...".
    (fixture!("nccl-error.log"), "nccl-error", CauseClass::NcclError),
    // c10/cuda/CUDACachingAllocator.cpp: "CUDA out of memory. Tried to allocate {}. GPU {}
    // has a total capacity of {} of which {} is free. ..." (torch.OutOfMemoryError).
    (fixture!("gpu-oom.log"), "gpu-oom", CauseClass::GpuOom),
    // numpy/_core/_exceptions.py, _ArrayMemoryError: "Unable to allocate {} for an array with
    // shape {} and data type {}" (a MemoryError).
    (fixture!("host-oom.log"), "host-oom", CauseClass::HostOom),
];

fn job(sacct: &str) -> job_diagnosis::EndedJob {
    ended_job(&parse_parsable(sacct), None).expect("ended")
}

/// The agent's drain of node2 during job 4242's run.
fn xid_on_node2() -> Vec<NodeEvent> {
    let reason = "gpu: xid79 gpu3 GPU has fallen off the bus (kmsg)";
    vec![NodeEvent {
        node: "node2".into(),
        start: "2026-11-30T19:00:01".into(),
        end: "Unknown".into(),
        state: "DRAIN".into(),
        reason: reason.into(),
        agent: decode_agent_reason("node2", reason),
    }]
}

#[test]
fn each_cause_on_rank_3_of_node2_and_the_others_killed_by_srun() {
    let j = job(fixture!("steps.sacct"));
    assert_eq!((j.gpus, j.steps.len()), (Some(8), 3));
    let mut cases: Vec<(&str, &str, CauseClass, Vec<NodeEvent>)> =
        SCENARIOS.iter().map(|(log, name, class)| (*log, *name, *class, Vec::new())).collect();
    // A GPU that fell off the bus: the program sees only "unspecified launch failure".
    cases.push((fixture!("xid.log"), "xid", CauseClass::Xid, xid_on_node2()));
    for (log, name, class, events) in cases {
        for release in [R22_05, R24_11, R26_05] {
            let a = autopsy(&j, &[], Some(log), &events, release);
            let f = a.first_failure.as_ref().unwrap_or_else(|| panic!("{name}: no first failure"));
            assert_eq!(
                (f.node.as_deref(), f.task, f.step.as_deref(), &f.death),
                (Some("node2"), Some(3), Some("4242.0"), &Death::Exit(1)),
                "{name}"
            );
            assert_eq!(f.death.codes(), (Some(1), None));
            // slurmstepd's cancel (either release's wording) after srun's kill: 3 s
            // before the job's end, 8 GPUs.
            assert_eq!(f.at, Some(("2026-11-30T19:00:05".to_owned(), AtFrom::StepCancel)), "{name}");
            assert_eq!(f.gpu_seconds_after, Some(4 * 8), "{name}");
            let c = a.cause.as_ref().unwrap_or_else(|| panic!("{name}: no cause"));
            assert_eq!((c.class, c.class.id()), (class, name), "{name}: {c:?}");
            assert!(!c.class.meaning().is_empty() && !c.class.fix().is_empty());
            if class != CauseClass::Xid {
                assert_eq!(c.rank, Some(3), "{name}: {c:?}");
            }
            // The others: killed by srun on the bad exit.
            let others: Vec<(&str, Vec<u32>, Why)> =
                f.consequences.iter().map(|c| (c.nodes.as_str(), c.tasks.ids(10), c.why)).collect();
            assert_eq!(
                others,
                [("node1", vec![0, 1], Why::KillOnBadExit), ("node2", vec![2], Why::KillOnBadExit)],
                "{name}"
            );
            assert!(f.consequences.iter().all(|c| c.death == Death::Signal(15, "Terminated".into(), false)));
            // The text: node, task, exit, class, the others.
            let lines = first_failure::section(a.first_failure.as_ref(), a.cause.as_ref());
            assert!(
                lines[0].starts_with(
                    "task 3 on node2 (step 4242.0) exited with status 1, at 2026-11-30T19:00:05"
                ),
                "{name}: {lines:?}"
            );
            assert!(lines[1].starts_with("cause: ") && lines[1].ends_with(&format!("({name})")), "{lines:?}");
            assert!(
                lines.iter().any(|l| l
                    == "then tasks 0-1 on node1 killed by signal 15 (Terminated): killed by srun on the first bad exit (--kill-on-bad-exit)"),
                "{lines:?}"
            );
            assert!(lines.last().is_some_and(|l| l.contains("0.01 GPU-hours")), "{lines:?}");
        }
    }
}

#[test]
fn without_kill_on_bad_exit_the_others_die_of_the_nccl_timeout() {
    let j = job(fixture!("steps-no-kill.sacct"));
    let a = autopsy(&j, &[], Some(fixture!("no-kill-on-bad-exit.log")), &[], R24_11);
    let f = a.first_failure.expect("first failure");
    assert_eq!((f.node.as_deref(), f.task, f.step.as_deref()), (Some("node2"), Some(3), Some("4243.0")));
    // Rank 3's own error, not the others' timeouts, is the cause.
    assert_eq!(a.cause.as_ref().map(|c| c.class), Some(CauseClass::CudaIllegalAddress));
    assert!(f.consequences.iter().all(|c| c.why == Why::NcclTimeout), "{:?}", f.consequences);
    assert_eq!(f.consequences[0].death, Death::Signal(6, "Aborted".into(), true));
    // No kill, no cancel line: the failure's time is known only to the step's end.
    assert_eq!(f.at, Some(("2026-11-30T19:10:04".to_owned(), AtFrom::StepEnd)));
    assert_eq!(f.gpu_seconds_after, Some(2 * 8));
    let lines = first_failure::section(Some(&f), a.cause.as_ref());
    assert!(
        lines[0].ends_with("at or before 2026-11-30T19:10:04 (known only to the step's end)"),
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l.contains("the NCCL watchdog's timeout")), "{lines:?}");
    assert_eq!(f.others_waited_s, Some(600));
    assert!(lines.iter().any(|l| l.ends_with("for the dead rank (00:10:00)")), "{lines:?}");
    let last = lines.last().unwrap();
    assert!(
        last.starts_with(
            "the failure's own time is not in the log, only its step's end (2026-11-30T19:10:04)"
        ) && last.contains("the others waited 00:10:00 in NCCL for the dead rank, about 1.33 GPU-hours more"),
        "{last}"
    );
}

#[test]
fn accounting_alone_names_the_failed_step() {
    let j = job(fixture!("steps.sacct"));
    let a = autopsy(&j, &[], None, &[], R22_05);
    let f = a.first_failure.expect("from the steps");
    assert_eq!((f.node, f.task, f.step.as_deref(), f.death), (None, None, Some("4242.0"), Death::Exit(1)));
    assert_eq!(f.at, Some(("2026-11-30T19:00:07".to_owned(), AtFrom::StepEnd)));
    assert_eq!(a.cause, None);
    // A job whose steps completed, or that Slurm ended (a time limit), has none.
    let done = parse_parsable(
        "JobID|State|ExitCode|End\n9|COMPLETED|0:0|2026-11-30T19:00:07\n9.0|COMPLETED|0:0|2026-11-30T19:00:07\n",
    );
    assert_eq!(autopsy(&ended_job(&done, None).unwrap(), &[], None, &[], R22_05).first_failure, None);
    let timeout = "JobID|State|ExitCode|End\n9|TIMEOUT|0:0|2026-11-30T19:00:07\n9.0|CANCELLED|0:15|2026-11-30T19:00:07\n";
    let log = "slurmstepd: error: *** STEP 9.0 ON node1 CANCELLED AT 2026-11-30T19:00:05 DUE TO TIME LIMIT ***\n\
               srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n\
               srun: error: node1: tasks 0-3: Terminated\n";
    let j = ended_job(&parse_parsable(timeout), None).unwrap();
    assert_eq!(autopsy(&j, &[], Some(log), &[], R26_05).first_failure, None);
}

#[test]
fn srun_and_slurmstepd_lines_as_each_release_prints_them() {
    let log = "srun: error: gpu[01-02]: tasks 0-3,7: Exited with exit code 2\n\
               srun: error: gpu03: task 12: Segmentation fault (core dumped)\n\
               srun: error: gpu04: task 13: Out Of Memory\n\
               srun: error: gpu05: task 14: Real-time signal 3\n\
               srun: error: Unable to create step for job 4242: Invalid generic resource (gres) specification\n\
               srun: Terminating StepId=4242.1\n\
               slurmstepd: error: *** STEP 4242.1 ON gpu01 CANCELLED AT 2026-11-30T19:00:05 DUE to SIGNAL Terminated ***\n\
               slurmstepd-gpu01: error: *** JOB 4242 ON gpu01 CANCELLED AT 2026-11-30T19:00:06 DUE TO PREEMPTION ***\n";
    let f = read_log(log);
    assert_eq!(f.exits.len(), 4, "{f:?}");
    assert_eq!(
        (f.exits[0].hosts.as_str(), f.exits[0].node.as_str(), f.exits[0].tasks.ids(10)),
        ("gpu[01-02]", "gpu01", vec![0, 1, 2, 3, 7])
    );
    assert_eq!((f.exits[0].tasks.to_string(), f.exits[0].tasks.count()), ("0-3,7".to_owned(), 5));
    assert_eq!(f.exits[1].death, Death::Signal(11, "Segmentation fault".into(), true));
    assert_eq!(f.exits[2].death, Death::OutOfMemory);
    assert_eq!(f.exits[3].death, Death::Signal(37, "Real-time signal 3".into(), false));
    assert_eq!(f.terminating, [(6, "4242.1".to_owned())]);
    assert_eq!(
        f.cancels
            .iter()
            .map(|c| (c.step.as_str(), c.node.as_str(), c.at.as_str(), c.due.as_deref()))
            .collect::<Vec<_>>(),
        [
            ("4242.1", "gpu01", "2026-11-30T19:00:05", Some("SIGNAL Terminated")),
            ("4242", "gpu01", "2026-11-30T19:00:06", Some("PREEMPTION")),
        ]
    );
}

#[test]
fn each_class_from_its_real_text() {
    // One line per class, as the frameworks print it (sources in `causes`' docs).
    let lines: &[(&str, Option<CauseClass>)] = &[
        (
            "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.",
            Some(CauseClass::NcclTimeout),
        ),
        (
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            Some(CauseClass::CudaIllegalAddress),
        ),
        // XLA/TensorFlow's stream_executor: cuGetErrorName ": " cuGetErrorString.
        (
            "E0000 cuda_driver.cc:981] failed to synchronize the stop event: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
            Some(CauseClass::CudaIllegalAddress),
        ),
        ("RuntimeError: CUDA error: invalid device ordinal", Some(CauseClass::InvalidDeviceOrdinal)),
        (
            "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: CUDA_ERROR_INVALID_DEVICE: invalid device ordinal",
            Some(CauseClass::InvalidDeviceOrdinal),
        ),
        ("OSError: [Errno 98] Address already in use", Some(CauseClass::AddressInUse)),
        // TCPStoreLibUvBackend.cpp's libuv error name.
        (
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
            Some(CauseClass::AddressInUse),
        ),
        // NCCL retries another port: not the cause.
        (
            "node1:1:2 [0] misc/socket.cc:457 NCCL WARN socketTryAccept: bind failed: Address already in use",
            Some(CauseClass::NcclError),
        ),
        (
            "torch.distributed.DistNetworkError: The client socket has failed to connect to any network address of (node9, 29500). The client socket has failed to connect to [node9]:29500 (errno: 111 - Connection refused).",
            Some(CauseClass::StoreConnectTimeout),
        ),
        (
            "RuntimeError: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5",
            Some(CauseClass::NcclError),
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", Some(CauseClass::GpuOom)),
        // XLA's BFC allocator as JAX prints it.
        (
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 33762398024 bytes.",
            Some(CauseClass::GpuOom),
        ),
        (
            "slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been OOM Killed.",
            Some(CauseClass::HostOom),
        ),
        ("srun: error: node2: task 3: Out Of Memory", Some(CauseClass::HostOom)),
        (
            "NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            Some(CauseClass::Xid),
        ),
        ("[rank3]: step 41000 loss 2.117", None),
        ("srun: error: node2: task 3: Exited with exit code 1", None),
    ];
    for (line, want) in lines {
        assert_eq!(classify_line(line), *want, "{line}");
    }
    // Every class has words, a fix and a distinct id.
    let mut ids: Vec<&str> = CLASSES.iter().map(|c| c.id()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), CLASSES.len());
    assert_eq!(causes::line_rank("[rank12]:[E1130 ...] x"), Some(12));
    assert_eq!(causes::line_rank("7: Traceback"), Some(7));
    assert_eq!(causes::line_rank("node2:204818:205127 [1] misc/socket.cc:484 NCCL WARN x"), None);
}

#[test]
fn tasks_stay_ranges_and_hosts_stay_a_hostlist() {
    let t = first_failure::Tasks::parse("0-99999,100001").unwrap();
    assert_eq!(
        (t.count(), t.first(), t.contains(50_000), t.contains(100_000)),
        (100_001, Some(0), true, false)
    );
    assert_eq!(t.to_string(), "0-99999,100001");
    assert_eq!(t.ids(3), [0, 1, 2]);
    let every_other: Vec<String> = (0..100u32).map(|i| (i * 2).to_string()).collect();
    let t = first_failure::Tasks::parse(&every_other.join(",")).unwrap();
    assert_eq!(t.count(), 100);
    assert!(t.to_string().ends_with(",126,... (100 in all)"), "{t}");
    assert_eq!(first_failure::Tasks::parse("3-1"), None);
    assert_eq!(first_failure::Tasks::parse(""), None);
    // 65536 hosts and 4 billion tasks on one line: read, not expanded.
    let f = read_log("srun: error: a[0-65535]: tasks 0-4294967295: Exited with exit code 1\n");
    assert_eq!((f.exits[0].hosts.as_str(), f.exits[0].node.as_str()), ("a[0-65535]", "a0"));
    assert_eq!(f.exits[0].tasks.count(), 1 << 32);
}

#[test]
fn past_the_kept_consequences_the_others_are_counted() {
    let mut log = String::from("srun: error: node2: task 3: Exited with exit code 1\n");
    for t in 0..100 {
        log.push_str(&format!("srun: error: node1: task {}: Terminated\n", t + 10));
    }
    let j = job(fixture!("steps.sacct"));
    let a = autopsy(&j, &[], Some(&log), &[], R24_11);
    let f = a.first_failure.unwrap();
    assert_eq!((f.consequences.len(), f.more_consequences), (first_failure::MAX_CONSEQUENCES, 100 - 32));
    let lines = first_failure::section(Some(&f), None);
    assert!(lines.iter().any(|l| l == "and 68 more task-exit lines in the log"), "{lines:?}");
}
