//! `gpu-node-agent run`: the daemon loop, in the library so that it can be
//! run (and tested) in-process.
//!
//! [`run`] starts the event sources (an NVML event set and the kernel log,
//! both on their own threads, feeding one channel) and the GPU table's
//! thread, then hands over to [`serve_gated`]: one loop that sleeps on the
//! channel until an Xid that may need the node out of service arrives, the
//! Epilog gate asks, or the next poll is due, runs a pass
//! ([`Agent::pass_on`] with `act`), and reports it.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use crate::agent::{Agent, Report, Trigger};
use crate::config::Config;
use crate::gate;
use crate::policy::health::XidEvent;
use crate::policy::rows::Step;
use crate::reports::sdnotify::Service;
use crate::store::LoadError;
use crate::usage::Usage;
use crate::{
    reports::metrics, reports::topo, slurm::release, sources::kmsg, sources::network, sources::nvml,
};

/// Writes the metrics textfile after a pass, when one is configured.
pub fn write_metrics(agent: &Agent, report: &Report, usage: Option<&Usage>) {
    if let Some(path) = &agent.cfg.metrics_textfile {
        let mut text = metrics::render(&agent.node_name, report, &agent.state);
        let plugins = release::cached(&agent.cfg);
        text.push_str(&release::metrics_text(&agent.node_name, &plugins));
        let fabric = network::Fabric::of(&plugins);
        text.push_str(&network::node_metrics(&agent.node_name, &fabric, &network::System::default()));
        if let Some(u) = usage {
            text.push_str(&metrics::job_text(&agent.node_name, &u.tally.metric_rows()));
        }
        if let Err(e) = metrics::write(path, &text) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write metrics");
        }
    }
}

/// Logs what a pass did and the agent's own problems.
pub fn log_report(report: &Report) {
    for a in &report.actions {
        tracing::warn!(action = %a);
    }
    for p in &report.problems {
        tracing::error!(problem = %p, "agent unhealthy");
    }
}

/// The daemon: until `stop` is set.
///
/// # Errors
/// The state file was written by another version of the agent: the daemon
/// does not start (and does not touch the file).
pub fn run(cfg: Config, stop: &Arc<AtomicBool>) -> Result<(), String> {
    let mut agent = Agent::new(cfg.clone());
    if let Some(e @ LoadError::Format(_)) = agent.load_error() {
        return Err(e.to_string());
    }
    // The GPU table is written by a child process (`topology --write`, killed
    // past its deadline) watched from a thread of its own: the daemon never
    // loads hwloc's vendor plugins, and NVML or hwloc hanging cannot keep the
    // health checks from starting. The flag is set once it is done.
    let table_done = topo::spawn_writer(&cfg);
    // NVML events, kernel-log Xids and the Epilog gate's requests arrive on
    // one channel; the loop sleeps on it until one comes or the next poll.
    let (wake_tx, wakes) = mpsc::channel::<Wake>();
    let (xid_tx, xid_rx) = mpsc::channel();
    if let Err(e) = nvml::watch_events(cfg.nvml_library.clone(), xid_tx.clone(), Arc::clone(stop)) {
        tracing::error!(error = %e, "cannot start the NVML event thread");
    }
    if let Some(path) = cfg.kmsg_path.clone() {
        if let Err(e) = kmsg::follow(path, Duration::from_millis(250), xid_tx, Arc::clone(stop)) {
            tracing::error!(error = %e, "cannot start the kernel-log thread");
        }
    }
    tracing::info!(node = %agent.node_name, poll = ?cfg.poll_interval, dry_run = cfg.dry_run, "gpu-node-agent started");
    // Per-job GPU use: its own NVML thread and AdminComment thread; the loop
    // only takes their readings in (see `usage`).
    let (usage, readings) = match Usage::start(&cfg, &agent.node_name, stop) {
        Some((u, rx)) => (RefCell::new(Some(u)), Some(rx)),
        None => (RefCell::new(None), None),
    };
    // systemd's Type=notify: READY after the first pass and the GPU table,
    // watchdog pings from the loop, STOPPING at the end.
    let service = RefCell::new(Service::from_env(table_done));
    forward_xids(xid_rx, wake_tx.clone());
    // The Epilog health gate's socket: requests reach the loop on its channel.
    if let Err(e) = gate::listen(&cfg.run_dir, wake_tx, Arc::clone(stop)) {
        tracing::error!(error = %e, "cannot open the epilog gate's socket: `gpu-node-agent epilog` will pass every node");
    }
    serve_gated(
        &mut agent,
        &wakes,
        stop,
        || {
            service.borrow_mut().tick();
            if let Some(u) = usage.borrow_mut().as_mut() {
                for r in readings.iter().flat_map(Receiver::try_iter) {
                    u.reading(&r);
                }
                u.tick();
            }
        },
        |agent, report| {
            log_report(report);
            // Logs a plugin of another Slurm release (at start, then each change).
            release::cached(&agent.cfg);
            write_metrics(agent, report, usage.borrow().as_ref());
            service.borrow_mut().passed();
        },
    );
    service.borrow().stopping();
    tracing::info!("gpu-node-agent stopping");
    Ok(())
}

/// Moves the event threads' Xids onto the loop's channel, on a thread of its
/// own that sleeps in `recv` and ends with the event threads.
fn forward_xids(xids: Receiver<XidEvent>, to: Sender<Wake>) {
    let spawned = thread::Builder::new().name("xid-forward".to_owned()).spawn(move || {
        for e in xids {
            if to.send(Wake::Xid(e)).is_err() {
                break;
            }
        }
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the Xid thread: Xids go unseen between polls");
    }
}

/// What wakes the daemon's loop besides its poll clock.
#[derive(Debug)]
pub enum Wake {
    /// An Xid, from NVML's events or the kernel log.
    Xid(XidEvent),
    /// The Epilog gate's request.
    Gate(gate::Request),
}

impl From<XidEvent> for Wake {
    fn from(e: XidEvent) -> Wake {
        Wake::Xid(e)
    }
}

impl From<gate::Request> for Wake {
    fn from(r: gate::Request) -> Wake {
        Wake::Gate(r)
    }
}

/// Where the loop's wake-ups come from: one channel, so that the loop sleeps
/// on it until something comes or the next poll is due, never polling.
trait Wakes {
    /// The next wake-up within `wait` (none waited for when zero). A channel
    /// whose senders are all gone waits `wait` out asleep, never spinning.
    fn next(&self, wait: Duration) -> Option<Wake>;
}

/// One channel's next message within `wait`; asleep for `wait` once its
/// senders are gone (the event threads ended).
fn next_on<T>(rx: &Receiver<T>, wait: Duration) -> Option<T> {
    if wait.is_zero() {
        return rx.try_recv().ok();
    }
    match rx.recv_timeout(wait) {
        Ok(m) => Some(m),
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => {
            thread::sleep(wait);
            None
        }
    }
}

impl Wakes for Receiver<XidEvent> {
    fn next(&self, wait: Duration) -> Option<Wake> {
        next_on(self, wait).map(Wake::Xid)
    }
}

impl Wakes for Receiver<Wake> {
    fn next(&self, wait: Duration) -> Option<Wake> {
        next_on(self, wait)
    }
}

/// The loop: a pass at start, then at every `poll_interval` and as soon as
/// an Xid that may need the node out of service arrives; `tick` runs on every
/// wake-up (at least once a second: the watchdog) and `after_pass` sees each
/// report. Returns when `stop` is set (checked at least once a second).
pub fn serve(
    agent: &mut Agent,
    events: &Receiver<XidEvent>,
    stop: &AtomicBool,
    tick: impl FnMut(),
    after_pass: impl FnMut(&Agent, &Report),
) {
    serve_on(agent, events, stop, tick, after_pass);
}

/// [`serve`], also answering the Epilog gate's requests, which come on the
/// same channel as the Xids (`wakes`). A request is answered by the first
/// pass that starts after it arrived, never by one already under way (whose
/// GPU reads may predate the job's end): a pass of its own
/// ([`Trigger::Gate`]: at once, the counters held, no drain wait), or the
/// poll when that is due ([`Trigger::PollForGate`]). Every request taken in
/// before a pass starts shares its answer, so jobs ending together cost one
/// pass; those that come while it runs share the next, which starts as soon
/// as it ends. Passes for the gate or an Xid keep the poll clock where it is.
pub fn serve_gated(
    agent: &mut Agent,
    wakes: &Receiver<Wake>,
    stop: &AtomicBool,
    tick: impl FnMut(),
    after_pass: impl FnMut(&Agent, &Report),
) {
    serve_on(agent, wakes, stop, tick, after_pass);
}

/// The loop of [`serve`] and [`serve_gated`].
fn serve_on(
    agent: &mut Agent,
    wakes: &impl Wakes,
    stop: &AtomicBool,
    mut tick: impl FnMut(),
    mut after_pass: impl FnMut(&Agent, &Report),
) {
    let interval = agent.cfg.poll_interval;
    let mut next_poll = Instant::now();
    let mut waiting: Vec<gate::Request> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        tick();
        let wait = next_poll.saturating_duration_since(Instant::now()).min(Duration::from_secs(1));
        let urgent = take_in(agent, wakes, &mut waiting, wait);
        let trigger = if Instant::now() >= next_poll {
            if waiting.is_empty() { Trigger::Poll } else { Trigger::PollForGate }
        } else if !waiting.is_empty() {
            Trigger::Gate
        } else if urgent {
            Trigger::Xid
        } else {
            continue;
        };
        // Every request in `waiting` was taken in before this pass starts;
        // those that come while it runs stay on the channel for the next.
        let report = agent.pass_on(true, trigger);
        after_pass(agent, &report);
        if trigger.step() == Step::Advance {
            next_poll = Instant::now() + interval;
        }
        gate::answer_all(&mut waiting, &report, agent.state.drain.is_some());
    }
}

/// Sleeps up to `wait` for a wake-up (none when a request already waits),
/// then takes in every one already there: Xids are recorded (returns whether
/// one may need the node out of service), requests kept in `waiting`.
fn take_in(agent: &mut Agent, wakes: &impl Wakes, waiting: &mut Vec<gate::Request>, wait: Duration) -> bool {
    let mut urgent = false;
    let first = if waiting.is_empty() { wait } else { Duration::ZERO };
    let mut wake = wakes.next(first);
    while let Some(w) = wake {
        match w {
            Wake::Xid(e) => urgent |= agent.record_xid(e),
            Wake::Gate(r) => waiting.push(r),
        }
        wake = wakes.next(Duration::ZERO);
    }
    urgent
}
