//! `gpu-node-agent run`: the daemon loop, in the library so that it can be
//! run (and tested) in-process.
//!
//! [`run`] starts the event sources (an NVML event set and the kernel log,
//! both on their own threads, feeding one channel) and the GPU table's
//! thread, then hands over to [`serve`]: one loop that sleeps on the channel
//! until an Xid that may need the node out of service arrives, the Epilog
//! gate asks, or the next poll is due, runs a pass ([`Agent::pass_on`] with
//! `act`), and reports it.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
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
    // NVML events and kernel-log Xids arrive on one channel; the loop sleeps
    // on it until an event or the next poll.
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
    // The Epilog health gate's socket: requests reach the loop on a channel.
    let (gate_tx, gate_rx) = mpsc::channel();
    if let Err(e) = gate::listen(&cfg.run_dir, gate_tx, Arc::clone(stop)) {
        tracing::error!(error = %e, "cannot open the epilog gate's socket: `gpu-node-agent epilog` will pass every node");
    }
    serve_gated(
        &mut agent,
        &xid_rx,
        Some(&gate_rx),
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
    serve_gated(agent, events, None, stop, tick, after_pass);
}

/// How often the loop looks for the Epilog gate's requests while it waits.
const GATE_LOOK: Duration = Duration::from_millis(20);

/// [`serve`], also answering the Epilog gate's requests (`gate`). A request
/// gets the first pass that ends after it arrived: a pass of its own
/// ([`Trigger::Gate`]: at once, the counters held, no drain wait) when none
/// runs, else the one under way; every request waiting when a pass ends
/// shares its answer, so jobs ending together cost one pass. Passes for
/// the gate or an Xid keep the poll clock where it is. A request that comes
/// while a poll waits out `drain_jitter` waits with it, within the gate's
/// [`gate::CONNECTION_DEADLINE`].
pub fn serve_gated(
    agent: &mut Agent,
    events: &Receiver<XidEvent>,
    gate: Option<&Receiver<gate::Request>>,
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
        let urgent = wait_for(agent, events, gate, &mut waiting, wait);
        let trigger = if Instant::now() >= next_poll {
            if waiting.is_empty() { Trigger::Poll } else { Trigger::PollForGate }
        } else if !waiting.is_empty() {
            Trigger::Gate
        } else if urgent {
            Trigger::Xid
        } else {
            continue;
        };
        let report = agent.pass_on(true, trigger);
        after_pass(agent, &report);
        if trigger.step() == Step::Advance {
            next_poll = Instant::now() + interval;
        }
        if let Some(g) = gate {
            waiting.extend(g.try_iter());
            gate::answer_all(&mut waiting, &report, agent.state.drain.is_some());
        }
    }
}

/// Waits up to `wait` for an event (taking in all that came; returns
/// whether one may need the node out of service) or a gate request (kept in
/// `waiting`).
fn wait_for(
    agent: &mut Agent,
    events: &Receiver<XidEvent>,
    gate: Option<&Receiver<gate::Request>>,
    waiting: &mut Vec<gate::Request>,
    wait: Duration,
) -> bool {
    let until = Instant::now() + wait;
    let mut urgent = false;
    loop {
        if let Some(g) = gate {
            waiting.extend(g.try_iter());
        }
        let left = until.saturating_duration_since(Instant::now());
        if !waiting.is_empty() {
            break;
        }
        let slice = if gate.is_some() { left.min(GATE_LOOK) } else { left };
        if let Ok(e) = events.recv_timeout(slice) {
            urgent |= agent.record_xid(e);
            break;
        }
        if Instant::now() >= until {
            break;
        }
    }
    for e in events.try_iter() {
        urgent |= agent.record_xid(e);
    }
    urgent
}
