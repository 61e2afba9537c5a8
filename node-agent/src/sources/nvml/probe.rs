//! [`Probe`]: every GPU sampled under its own deadline.
//!
//! One long-lived worker thread loads NVML, counts the GPUs and samples them
//! in turn, each GPU under `nvml_timeout`. A GPU whose calls do not return in
//! time is left to its stuck thread and reported as hung; the GPUs after it
//! are sampled on threads of their own, all under one more deadline, so a
//! pass waits at most two deadlines however many GPUs hang. While a GPU is
//! stuck, later passes report it hung at once (with how long) and sample the
//! others, still each on its own thread; once it answers again, its stuck
//! thread ends and the next pass samples it as before. A healthy node keeps
//! exactly one NVML thread.
//!
//! NVML itself not answering (loading it, counting the GPUs) hides every GPU:
//! that is [`ProbeError::Hung`], the agent's own trouble.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use super::{ProbeError, load, sample_index};
use crate::policy::health::{GpuSample, Hang};
use crate::sources::{self, Source};

/// NVML, once loaded, shared by every worker.
type Shared = Arc<Mutex<Option<Arc<Nvml>>>>;

enum Job {
    /// Load NVML if needed and count the GPUs.
    Open,
    /// Sample one GPU.
    Sample(u32),
}

enum Done {
    Opened(Result<u32, ProbeError>),
    Sample(GpuSample),
}

/// A reply from worker `id`.
struct Msg {
    id: u64,
    done: Done,
}

/// A thread stuck past its deadline: on GPU `gpu` (`None`: opening NVML).
#[derive(Clone, Copy, Debug)]
struct Stuck {
    gpu: Option<u32>,
    since: Instant,
}

/// Samples every GPU, each within a deadline (see the module docs).
#[derive(Debug)]
pub struct Probe {
    lib: PathBuf,
    timeout: Duration,
    shared: Shared,
    /// The long-lived worker: its id and job queue.
    worker: Option<(u64, Sender<Job>)>,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    /// Threads past their deadline, by id.
    stuck: BTreeMap<u64, Stuck>,
    next_id: u64,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Job::Open => f.write_str("Open"),
            Job::Sample(i) => write!(f, "Sample({i})"),
        }
    }
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Msg({})", self.id)
    }
}

/// Loads NVML into `shared` if it is not yet, and counts the GPUs.
fn open(lib: &std::path::Path, shared: &Shared) -> Result<u32, ProbeError> {
    let loaded = shared.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let nvml = match loaded {
        Some(n) => n,
        None => match load(lib) {
            Ok(n) => {
                if let Ok(v) = n.sys_driver_version() {
                    sources::set_driver_version(&v);
                }
                let n = Arc::new(n);
                *shared.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&n));
                n
            }
            Err(e) => {
                let why = format!("cannot load {}: {e}", lib.display());
                return Err(if matches!(e, NvmlError::LibRmVersionMismatch) {
                    ProbeError::DriverMismatch(why)
                } else {
                    ProbeError::Unavailable(why)
                });
            }
        },
    };
    nvml.device_count().map_err(|e| ProbeError::Unavailable(format!("device count: {e}")))
}

fn loaded(shared: &Shared) -> Option<Arc<Nvml>> {
    shared.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

impl Probe {
    /// A probe that loads NVML from `lib` on first use.
    pub fn start(lib: PathBuf, timeout: Duration) -> Probe {
        let (tx, rx) = mpsc::channel();
        Probe {
            lib,
            timeout,
            shared: Arc::new(Mutex::new(None)),
            worker: None,
            tx,
            rx,
            stuck: BTreeMap::new(),
            next_id: 0,
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The long-lived worker, started if there is none.
    fn worker(&mut self) -> Result<(u64, Sender<Job>), ProbeError> {
        if let Some(w) = &self.worker {
            return Ok(w.clone());
        }
        let id = self.id();
        let (jobs_tx, jobs) = mpsc::channel::<Job>();
        let (lib, shared, out) = (self.lib.clone(), Arc::clone(&self.shared), self.tx.clone());
        thread::Builder::new()
            .name("nvml".to_owned())
            .spawn(move || {
                while let Ok(job) = jobs.recv() {
                    let done = match job {
                        Job::Open => Done::Opened(open(&lib, &shared)),
                        Job::Sample(i) => match loaded(&shared) {
                            Some(nvml) => Done::Sample(sample_index(&nvml, i)),
                            None => Done::Opened(Err(ProbeError::Unavailable("not loaded".to_owned()))),
                        },
                    };
                    if out.send(Msg { id, done }).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| ProbeError::Unavailable(format!("cannot start the NVML thread: {e}")))?;
        self.worker = Some((id, jobs_tx.clone()));
        Ok((id, jobs_tx))
    }

    /// Takes in the replies of threads that were stuck: they are free again.
    fn collect_late(&mut self) {
        while let Ok(m) = self.rx.try_recv() {
            if let Some(s) = self.stuck.remove(&m.id) {
                tracing::info!(gpu = ?s.gpu, after = ?s.since.elapsed(), "NVML answered again");
            }
        }
    }

    /// Waits until `deadline` for worker `id`'s reply; other threads'
    /// replies that come meanwhile go to `others`.
    fn wait_for(&mut self, id: u64, deadline: Instant, others: &mut Vec<Msg>) -> Option<Done> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(m) if m.id == id => return Some(m.done),
                Ok(m) => others.push(m),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Samples every GPU.
    ///
    /// # Errors
    /// NVML is unavailable, or did not load or count the GPUs within the
    /// deadline (then later calls say so at once until that call returns).
    pub fn sample(&mut self) -> Result<Vec<GpuSample>, ProbeError> {
        let result = self.sample_now();
        sources::set(Source::Nvml, result.is_ok());
        result
    }

    fn sample_now(&mut self) -> Result<Vec<GpuSample>, ProbeError> {
        self.collect_late();
        if let Some(s) = self.stuck.values().find(|s| s.gpu.is_none()) {
            return Err(ProbeError::Hung(format!(
                "a call has not returned for {:.1} s",
                s.since.elapsed().as_secs_f64()
            )));
        }
        let (id, jobs) = self.worker()?;
        let mut others = Vec::new();
        let started = Instant::now();
        let count = match jobs
            .send(Job::Open)
            .ok()
            .and_then(|()| self.wait_for(id, started + self.timeout, &mut others))
        {
            Some(Done::Opened(r)) => r?,
            Some(Done::Sample(_)) => {
                return Err(ProbeError::Unavailable("NVML thread out of step".to_owned()));
            }
            None => {
                self.worker = None;
                self.stuck.insert(id, Stuck { gpu: None, since: started });
                return Err(ProbeError::Hung(format!("no answer within {:?}", self.timeout)));
            }
        };
        let hung_on =
            |stuck: &BTreeMap<u64, Stuck>, g: u32| stuck.values().find(|s| s.gpu == Some(g)).map(|s| s.since);
        let mut samples: BTreeMap<u32, GpuSample> = BTreeMap::new();
        let mut rest: Vec<u32> = Vec::new();
        // In turn on the worker while nothing hangs.
        let mut index = 0;
        while index < count {
            if hung_on(&self.stuck, index).is_some() || !rest.is_empty() {
                rest.push(index);
                index += 1;
                continue;
            }
            let Some((id, jobs)) = self.worker.clone() else {
                rest.push(index);
                index += 1;
                continue;
            };
            let asked = Instant::now();
            match jobs
                .send(Job::Sample(index))
                .ok()
                .and_then(|()| self.wait_for(id, asked + self.timeout, &mut others))
            {
                Some(Done::Sample(s)) => {
                    samples.insert(index, s);
                }
                Some(Done::Opened(r)) => {
                    r?;
                }
                None => {
                    tracing::warn!(gpu = index, timeout = ?self.timeout, "NVML calls on this GPU do not return; sampling the others on threads of their own");
                    self.worker = None;
                    self.stuck.insert(id, Stuck { gpu: Some(index), since: asked });
                }
            }
            index += 1;
        }
        // The others, each on a thread of its own, under one deadline.
        let nvml = loaded(&self.shared);
        let mut pending: BTreeMap<u64, u32> = BTreeMap::new();
        let free: Vec<u32> = rest.iter().copied().filter(|g| hung_on(&self.stuck, *g).is_none()).collect();
        for g in free {
            let Some(nvml) = nvml.clone() else { break };
            let id = self.id();
            let out = self.tx.clone();
            let spawned = thread::Builder::new().name(format!("nvml-gpu{g}")).spawn(move || {
                let _ = out.send(Msg { id, done: Done::Sample(sample_index(&nvml, g)) });
            });
            match spawned {
                Ok(_) => {
                    pending.insert(id, g);
                }
                Err(e) => tracing::warn!(gpu = g, error = %e, "cannot start an NVML thread"),
            }
        }
        let deadline = Instant::now() + self.timeout;
        let mut late: Vec<Msg> = std::mem::take(&mut others);
        while !pending.is_empty() {
            let m = match late.pop() {
                Some(m) => m,
                None => match self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(m) => m,
                    Err(_) => break,
                },
            };
            if let Some(g) = pending.remove(&m.id) {
                if let Done::Sample(s) = m.done {
                    samples.insert(g, s);
                }
            } else if let Some(s) = self.stuck.remove(&m.id) {
                tracing::info!(gpu = ?s.gpu, "NVML answered again");
            }
        }
        let started_rest = deadline - self.timeout;
        for (id, g) in pending {
            self.stuck.insert(id, Stuck { gpu: Some(g), since: started_rest });
        }
        for m in late {
            self.stuck.remove(&m.id);
        }
        let now = Instant::now();
        for g in 0..count {
            if let Some(since) = hung_on(&self.stuck, g) {
                let secs = now.saturating_duration_since(since).as_secs();
                samples.insert(
                    g,
                    GpuSample { index: g, hang: Some(Hang { secs, polls: 0 }), ..GpuSample::default() },
                );
            }
        }
        Ok(samples.into_values().collect())
    }
}
