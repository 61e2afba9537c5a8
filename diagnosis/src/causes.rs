//! What a job's log says killed it: one class per way a GPU job commonly
//! dies, each read from the frameworks' own words, with what it means and
//! the fix (`autopsy`'s `cause`).
//!
//! The texts, and where each comes from (the tests hold a real line of each):
//!
//! - `nccl-timeout`: PyTorch's NCCL watchdog, `[Rank N] Watchdog caught
//!   collective operation timeout: WorkNCCL(...) ran for N milliseconds before
//!   timing out.` (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp,
//!   `checkTimeout`/the watchdog loop);
//! - `cuda-illegal-address`: `an illegal memory access was encountered`, CUDA's
//!   string for `cudaErrorIllegalAddress` as PyTorch prints it (`CUDA error: `
//!   and `cudaGetErrorString`, c10/cuda/CUDAException.cpp) and the driver's
//!   `CUDA_ERROR_ILLEGAL_ADDRESS: ...` as XLA (JAX) and TensorFlow print it
//!   (stream_executor's `cuGetErrorName: cuGetErrorString`);
//! - `invalid-device-ordinal`: `invalid device ordinal` (`cudaErrorInvalidDevice`,
//!   PyTorch adds `GPU device may be out of range, do you have enough GPUs?`,
//!   c10/cuda/CUDAMiscFunctions.cpp; the driver's `CUDA_ERROR_INVALID_DEVICE`);
//! - `address-in-use`: `Address already in use` / `EADDRINUSE`: c10d's
//!   `The server socket has failed to listen on any local network address.`
//!   with `(errno: 98 - Address already in use)` (torch/csrc/distributed/c10d/socket.cpp,
//!   `SocketListenOp`), libuv's `EADDRINUSE` (TCPStoreLibUvBackend.cpp),
//!   Python's `OSError: [Errno 98] Address already in use`. NCCL's own
//!   `NCCL WARN ... bind failed: Address already in use` is not counted: NCCL
//!   retries another port;
//! - `store-connect-timeout`: c10d's `The client socket has timed out after
//!   ...ms while trying to connect to (HOST, PORT).` and `The client socket has
//!   failed to connect to any network address of (HOST, PORT).` (socket.cpp,
//!   `SocketConnectOp`);
//! - `nccl-error`: NCCL's result strings (`ncclGetErrorString`, NCCL's src/init.cc:
//!   `unhandled system error (run with NCCL_DEBUG=INFO for details)`, `unhandled
//!   cuda error`, `remote process exited or there was a network error`) and its
//!   `NCCL WARN` lines (src/debug.cc: `HOST:PID:TID [DEV] FILE:LINE NCCL WARN ...`);
//! - `gpu-oom`, `host-oom`: [`classify_oom`]'s texts, line by line (PyTorch's
//!   `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...`,
//!   c10/cuda/CUDACachingAllocator.cpp; XLA's `RESOURCE_EXHAUSTED: Out of memory
//!   while trying to allocate`; the kernel's and Slurm's OOM kills) and srun's
//!   `srun: error: NODE: task N: Out Of Memory` (src/srun/launch.c);
//! - `xid`: a GPU's Xid during the run, from the agent's drain of the node
//!   ([`NodeEvent`]) or an `NVRM: Xid` line in the log ([`gpu_health::xid`]).
//!
//! JAX's multi-host rendezvous (XLA's coordination service) fails with gRPC
//! statuses (`DEADLINE_EXCEEDED`) that name no cause of their own, so they are
//! not a class.
//!
//! A log usually holds several of them: the rank that failed first, then
//! what the others printed as they died of it. [`find_cause`] takes the most
//! telling one: a GPU's own fault first, then the program's errors, then the
//! rendezvous and NCCL's errors, an NCCL timeout last (the others' usual
//! death), and within one of these the first failing rank's line, else the
//! earliest.

use super::evidence::{NodeEvent, OomKind, classify_oom};

/// A cause of death a log can show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CauseClass {
    /// A GPU failed (an Xid).
    Xid,
    /// GPU memory ran out.
    GpuOom,
    /// Host memory ran out.
    HostOom,
    /// A kernel read or wrote memory it does not own.
    CudaIllegalAddress,
    /// The program asked for a GPU it does not see.
    InvalidDeviceOrdinal,
    /// A fixed port another process already holds.
    AddressInUse,
    /// No rendezvous store where `MASTER_ADDR:MASTER_PORT` points.
    StoreConnectTimeout,
    /// NCCL failed (a system call, the network, a peer that died).
    NcclError,
    /// A collective waited longer than its timeout.
    NcclTimeout,
}

/// Every class, in the order of `docs/users.md`'s table of cause classes.
pub const CLASSES: [CauseClass; 9] = [
    CauseClass::NcclTimeout,
    CauseClass::CudaIllegalAddress,
    CauseClass::InvalidDeviceOrdinal,
    CauseClass::AddressInUse,
    CauseClass::StoreConnectTimeout,
    CauseClass::NcclError,
    CauseClass::GpuOom,
    CauseClass::HostOom,
    CauseClass::Xid,
];

impl CauseClass {
    /// Its id (`--json`'s `cause.class`).
    pub fn id(self) -> &'static str {
        match self {
            CauseClass::Xid => "xid",
            CauseClass::GpuOom => "gpu-oom",
            CauseClass::HostOom => "host-oom",
            CauseClass::CudaIllegalAddress => "cuda-illegal-address",
            CauseClass::InvalidDeviceOrdinal => "invalid-device-ordinal",
            CauseClass::AddressInUse => "address-in-use",
            CauseClass::StoreConnectTimeout => "store-connect-timeout",
            CauseClass::NcclError => "nccl-error",
            CauseClass::NcclTimeout => "nccl-timeout",
        }
    }

    /// What it means, in words.
    pub fn meaning(self) -> &'static str {
        match self {
            CauseClass::Xid => "a GPU of the job failed in hardware or in its driver (an Xid): not your code",
            CauseClass::GpuOom => "a rank ran out of GPU memory",
            CauseClass::HostOom => {
                "a rank ran out of host memory: the kernel or Slurm's memory limit killed it"
            }
            CauseClass::CudaIllegalAddress => {
                "a CUDA kernel read or wrote memory it does not own (a bug in a kernel, an index out of range, \
                 a tensor used after it was freed, or a faulty GPU); the GPU context is lost and the rank dies"
            }
            CauseClass::InvalidDeviceOrdinal => {
                "a rank asked for a GPU index it does not see: the program uses more GPUs per node than the \
                 task was given (CUDA_VISIBLE_DEVICES holds fewer)"
            }
            CauseClass::AddressInUse => {
                "the rendezvous port was taken: another job or step on the node already listens on this \
                 fixed MASTER_PORT"
            }
            CauseClass::StoreConnectTimeout => {
                "ranks could not reach the rendezvous store: nothing listened where MASTER_ADDR:MASTER_PORT \
                 points (rank 0 runs elsewhere, it died first, or the address is another node's)"
            }
            CauseClass::NcclError => {
                "NCCL failed: a system call or the network between ranks (an interface that does not route, \
                 /dev/shm too small in a container, InfiniBand trouble), or a peer rank that died"
            }
            CauseClass::NcclTimeout => {
                "a collective (all-reduce, broadcast, ...) waited past its timeout: a rank never joined it, \
                 because it died, hung, or ran a different collective"
            }
        }
    }

    /// The fix, in words.
    pub fn fix(self) -> &'static str {
        match self {
            CauseClass::Xid => {
                "resubmit (Slurm will not place it on a drained node), and resume from the latest checkpoint"
            }
            CauseClass::GpuOom => {
                "a smaller batch, activation checkpointing, or more GPUs (sharded optimizer states); --mem \
                 does not help"
            }
            CauseClass::HostOom => "ask for more --mem (or --mem-per-gpu), or fewer data-loader workers",
            CauseClass::CudaIllegalAddress => {
                "rerun with CUDA_LAUNCH_BLOCKING=1 (or compute-sanitizer) to find the kernel; if the same \
                 code ran before, suspect the GPU and check the node's Xids"
            }
            CauseClass::InvalidDeviceOrdinal => {
                "make the processes per node match the GPUs per node: --gpus-per-node=N with torchrun \
                 --nproc-per-node=N, or --gpus-per-task=1 with one task per GPU, and select the GPU by \
                 LOCAL_RANK (SLURM_LOCALID), not by the global rank"
            }
            CauseClass::AddressInUse => {
                "derive the port from the job (MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))) or use \
                 --auto-rdzv"
            }
            CauseClass::StoreConnectTimeout => {
                "point MASTER_ADDR at the job's first node (scontrol show hostnames \"$SLURM_JOB_NODELIST\" | \
                 head -n1) and reach it over an interface every node routes; with --auto-rdzv the plugin sets \
                 both"
            }
            CauseClass::NcclError => {
                "rerun with NCCL_DEBUG=INFO to see the failing call; check NCCL_SOCKET_IFNAME, the container's \
                 /dev/shm size, and whether another rank died first"
            }
            CauseClass::NcclTimeout => {
                "find the rank that did not join (the first failure above); srun --kill-on-bad-exit=1 ends \
                 the others at once instead of after the timeout"
            }
        }
    }

    /// How telling it is: the lowest wins ([`find_cause`]).
    fn tier(self) -> u8 {
        match self {
            CauseClass::Xid => 0,
            CauseClass::GpuOom
            | CauseClass::HostOom
            | CauseClass::CudaIllegalAddress
            | CauseClass::InvalidDeviceOrdinal
            | CauseClass::AddressInUse => 1,
            CauseClass::StoreConnectTimeout | CauseClass::NcclError => 2,
            CauseClass::NcclTimeout => 3,
        }
    }
}

/// The cause found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// Its class.
    pub class: CauseClass,
    /// The line that shows it (clipped), or the agent's drain reason.
    pub line: String,
    /// The line's number in the text read (1-based); `None` for a node event.
    pub line_no: Option<usize>,
    /// The rank the line names (`[rank3]:`, srun's `--label` `3: `), when it does.
    pub rank: Option<u32>,
}

/// The class one log line shows, if any.
pub fn classify_line(line: &str) -> Option<CauseClass> {
    let has = |p: &str| line.contains(p);
    let lower = line.to_ascii_lowercase();
    let nccl_warn = has("NCCL WARN");
    if gpu_health::xid::parse_line(line).is_some() {
        return Some(CauseClass::Xid);
    }
    if has("srun: error: ") && line.trim_end().ends_with(": Out Of Memory") {
        return Some(CauseClass::HostOom);
    }
    match classify_oom(line) {
        Some(OomKind::Gpu) => return Some(CauseClass::GpuOom),
        // "Cannot allocate memory" is also NCCL's and the kernel's for pinned memory: only outside NCCL's lines.
        Some(OomKind::Host) if !nccl_warn => return Some(CauseClass::HostOom),
        _ => {}
    }
    if has("an illegal memory access was encountered") || has("CUDA_ERROR_ILLEGAL_ADDRESS") {
        return Some(CauseClass::CudaIllegalAddress);
    }
    if has("invalid device ordinal") || has("CUDA_ERROR_INVALID_DEVICE") {
        return Some(CauseClass::InvalidDeviceOrdinal);
    }
    if !nccl_warn && (lower.contains("address already in use") || has("EADDRINUSE")) {
        return Some(CauseClass::AddressInUse);
    }
    if (has("The client socket has timed out after") && has("while trying to connect to"))
        || has("The client socket has failed to connect to any network address of")
    {
        return Some(CauseClass::StoreConnectTimeout);
    }
    if has("Watchdog caught collective operation timeout") {
        return Some(CauseClass::NcclTimeout);
    }
    if nccl_warn
        || has("unhandled system error (run with NCCL_DEBUG")
        || has("unhandled cuda error (run with NCCL_DEBUG")
        || has("remote process exited or there was a network error")
    {
        return Some(CauseClass::NcclError);
    }
    None
}

/// The rank a log line names: PyTorch's `[rank3]:` prefix (and its `[Rank 3]`
/// in the watchdog's words), srun's `--label` prefix `3: `.
pub fn line_rank(line: &str) -> Option<u32> {
    let digits = |s: &str| -> Option<u32> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        s[..end].parse().ok()
    };
    for tag in ["[rank", "[Rank "] {
        if let Some(i) = line.find(tag) {
            if let Some(n) = digits(&line[i + tag.len()..]) {
                return Some(n);
            }
        }
    }
    let t = line.trim_start();
    let (n, rest) = t.split_once(": ")?;
    (!n.is_empty() && n.len() <= 6 && n.bytes().all(|b| b.is_ascii_digit()) && !rest.is_empty())
        .then(|| n.parse().ok())
        .flatten()
}

/// The most telling cause in `log` and the node `events` of the run: the
/// lowest tier (a GPU's fault, then the program's errors, then rendezvous and
/// NCCL errors, then NCCL timeouts); within it, a line of rank `task` (the
/// first failure's, when known), else the earliest line. An agent's Xid drain
/// of `node` (the first failure's) counts before one of another node.
pub fn find_cause(
    log: Option<&str>,
    events: &[NodeEvent],
    node: Option<&str>,
    task: Option<u32>,
) -> Option<Cause> {
    let mut xid_events: Vec<&NodeEvent> =
        events.iter().filter(|e| e.agent.as_ref().is_some_and(|a| a.xid.is_some())).collect();
    xid_events.sort_by_key(|e| node.is_some_and(|n| n != e.node));
    if let Some(e) = xid_events.first() {
        let a = e.agent.as_ref();
        return Some(Cause {
            class: CauseClass::Xid,
            line: a.map_or_else(|| e.reason.clone(), |a| format!("{} ({})", a.meaning, e.reason)),
            line_no: None,
            rank: None,
        });
    }
    let log = log?;
    let mut best: Option<((u8, bool, usize), Cause)> = None;
    for (i, line) in log.lines().enumerate() {
        let Some(class) = classify_line(line) else { continue };
        let rank = line_rank(line);
        let key = (class.tier(), !(task.is_some() && rank == task), i);
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            let line = slurm_formats::text::clip(line.trim(), 300);
            best = Some((key, Cause { class, line, line_no: Some(i + 1), rank }));
        }
    }
    best.map(|(_, c)| c)
}

/// Whether `log` shows that ranks (other than `except`) died of an NCCL
/// timeout: the watchdog's words on their lines, or on lines that name no rank.
pub fn nccl_timeouts(log: &str, except: Option<u32>) -> Vec<Option<u32>> {
    log.lines()
        .filter(|l| classify_line(l) == Some(CauseClass::NcclTimeout))
        .map(line_rank)
        .filter(|r| r.is_none() || *r != except)
        .collect()
}
