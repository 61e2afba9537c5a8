//! Metrics in node_exporter's textfile format, written atomically.

use crate::exposition::label_value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use slurm_formats::pci::PciAddr;

use crate::agent::{Report, Verdict};
use crate::policy::checks;
use crate::policy::health::GpuSample;
use crate::sources::{self, Source};
use crate::store::State;
use crate::store::atomic_file::{self, Options};
use crate::usage::tally::JobDeviceRow;

/// One metric of the textfile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// Its Prometheus type: `gauge` or `counter`.
    pub kind: &'static str,
    /// Its labels besides `node`, in the order they are written.
    pub labels: &'static [&'static str],
}

/// A GPU's labels ([`gpu_labels`]).
const GPU: &[&str] = &["gpu", "UUID", "pci_bus_id"];
/// A running job's GPU (or MIG device, `gpu="5.1"`).
const JOB_GPU: &[&str] = &["job", "gpu", "UUID"];
/// A GPU's labels and the check's name.
const GPU_CHECK: &[&str] = &["gpu", "UUID", "pci_bus_id", "check"];

const fn metric(name: &'static str, kind: &'static str, labels: &'static [&'static str]) -> Metric {
    Metric { name, kind, labels }
}

/// Every metric the agent writes, in the file's order: [`render`]'s, then
/// `release::metrics_text`'s `gpu_node_agent_plugin_release`, then
/// `network::metrics_text`'s `gpu_node_agent_fabric_interfaces` (only with
/// the plugstack line's `nccl_socket_net`), then [`job_text`]'s per-job
/// series (only while `usage_interval` is on; a job's series go with it). [`render`] takes
/// each metric's type from here, a test checks that the file holds exactly these
/// metrics with these labels, and the metrics listed in docs/admin.md and
/// README.md are checked against this list (node-agent/tests/doc_tables.rs).
pub const METRICS: &[Metric] = &[
    metric("gpu_node_agent_up", "gauge", &[]),
    metric("gpu_node_agent_verdict", "gauge", &[]),
    metric("gpu_node_agent_gpu_healthy", "gauge", GPU),
    metric("gpu_node_agent_gpu_check_supported", "gauge", GPU_CHECK),
    metric("gpu_node_agent_gpu_check_ok", "gauge", GPU_CHECK),
    metric("gpu_node_agent_pcie_link_gen", "gauge", GPU),
    metric("gpu_node_agent_pcie_link_gen_max", "gauge", GPU),
    metric("gpu_node_agent_pcie_link_width", "gauge", GPU),
    metric("gpu_node_agent_pcie_link_width_max", "gauge", GPU),
    metric("gpu_node_agent_nvlinks_down", "gauge", GPU),
    metric("gpu_node_agent_clock_slowdown_checks", "gauge", GPU),
    metric("gpu_node_agent_xid_events_total", "counter", &["xid"]),
    metric("gpu_node_agent_xid_ignored_total", "counter", &["xid"]),
    metric("gpu_node_agent_source_up", "gauge", &["source"]),
    metric("gpu_node_agent_last_pass_timestamp_seconds", "gauge", &[]),
    metric("gpu_node_agent_build_info", "gauge", &["version", "nvml_driver"]),
    metric("gpu_node_agent_drains_total", "counter", &[]),
    metric("gpu_node_agent_drains_suppressed_total", "counter", &[]),
    metric("gpu_node_agent_resumes_total", "counter", &[]),
    metric("gpu_node_agent_drained", "gauge", &[]),
    metric("gpu_node_agent_drain_timestamp_seconds", "gauge", &["action"]),
    metric("gpu_node_agent_drain_pending", "gauge", &[]),
    metric("gpu_node_agent_reboot_cap_reached", "gauge", &[]),
    metric("gpu_node_agent_drain_suppressed", "gauge", &["class"]),
    metric("gpu_node_agent_state_ok", "gauge", &[]),
    metric("gpu_node_agent_state_lost", "gauge", &[]),
    metric("gpu_node_agent_state_corrupt_total", "counter", &[]),
    metric("gpu_node_agent_gpu_nvml_hang_seconds", "gauge", GPU),
    metric("gpu_node_agent_gpu_table_ok", "gauge", &[]),
    metric(
        "gpu_node_agent_plugin_release",
        "gauge",
        &["plugin", "plugin_release", "slurmd_release", "install"],
    ),
    metric("gpu_node_agent_fabric_interfaces", "gauge", &["net"]),
    metric("gpu_node_agent_job_gpu_utilization", "gauge", JOB_GPU),
    metric("gpu_node_agent_job_gpu_memory_used_bytes", "gauge", JOB_GPU),
    metric("gpu_node_agent_job_gpu_idle_seconds", "gauge", JOB_GPU),
];

/// The type of the metric `name` in [`METRICS`] (`untyped` for one missing
/// there, which the tests do not let through).
fn kind_of(name: &str) -> &'static str {
    METRICS.iter().find(|m| m.name == name).map_or("untyped", |m| m.kind)
}

/// The text of the metrics file after a pass.
pub fn render(node: &str, report: &Report, state: &State) -> String {
    render_with(node, report, state, crate::reports::topo::table_state())
}

/// [`render`] with the daemon's GPU table state given (`topo::table_state`):
/// also for node-agent/tests/prometheus_rules.rs, which renders every state
/// the alert rules are tested on.
pub fn render_with(node: &str, report: &Report, state: &State, table: Option<bool>) -> String {
    let mut m = String::new();
    let node = label_value(node);
    let mut gauge = |name: &str, help: &str, rows: &[(String, String)]| {
        let kind = kind_of(name);
        let _ = writeln!(m, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in rows {
            let sep = if labels.is_empty() { "" } else { "," };
            let _ = writeln!(m, "{name}{{node=\"{node}\"{sep}{labels}}} {value}");
        }
    };
    let up = u8::from(report.problems.is_empty());
    gauge(
        "gpu_node_agent_up",
        "1 when the agent could check everything (NVML, Slurm, its state file)",
        &[(String::new(), up.to_string())],
    );
    let verdict = match report.verdict {
        Verdict::Healthy => 0,
        Verdict::Unhealthy => 1,
        Verdict::Unknown => 2,
    };
    gauge(
        "gpu_node_agent_verdict",
        "0 healthy, 1 needs draining, 2 cannot tell",
        &[(String::new(), verdict.to_string())],
    );
    let rows: Vec<(String, String)> = report
        .samples
        .iter()
        .map(|s| {
            let bad = report
                .faults
                .iter()
                .any(|f| f.gpu == Some(s.index) && f.action >= gpu_health::xid::Action::Drain);
            (gpu_labels(s), u8::from(!bad && !s.lost && s.hang.is_none()).to_string())
        })
        .collect();
    gauge("gpu_node_agent_gpu_healthy", "1 when the GPU has no fault that needs a drain", &rows);
    check_gauges(&mut gauge, report, state);
    let rows: Vec<(String, String)> =
        xid_counts(state, report).iter().map(|(x, n)| (format!("xid=\"{x}\""), n.to_string())).collect();
    gauge(
        "gpu_node_agent_xid_events_total",
        "Xid events seen this boot that the policy does not ignore, each once however many sources (NVML, kernel log) saw it",
        &rows,
    );
    let rows: Vec<(String, String)> =
        state.xids.ignored.iter().map(|(x, n)| (format!("xid=\"{x}\""), n.to_string())).collect();
    gauge(
        "gpu_node_agent_xid_ignored_total",
        "Xid events the policy ignores (application errors), counted this boot and not kept",
        &rows,
    );
    let rows: Vec<(String, String)> = Source::ALL
        .iter()
        .filter_map(|s| Some((format!("source=\"{}\"", s.name()), u8::from(sources::get(*s)?).to_string())))
        .collect();
    gauge(
        "gpu_node_agent_source_up",
        "1 while the source works: nvml_events (Xid events), kmsg (the kernel log), nvml (GPU counters), nvml_usage (utilization, memory and processes for per-job usage)",
        &rows,
    );
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    gauge(
        "gpu_node_agent_last_pass_timestamp_seconds",
        "When the agent last finished a pass (Unix time)",
        &[(String::new(), format!("{now:.3}"))],
    );
    let build = format!(
        "version=\"{}\",nvml_driver=\"{}\"",
        env!("CARGO_PKG_VERSION"),
        label_value(sources::driver_version().unwrap_or(""))
    );
    gauge(
        "gpu_node_agent_build_info",
        "The agent's version and the NVIDIA driver's (1)",
        &[(build, "1".to_owned())],
    );
    gauge(
        "gpu_node_agent_drains_total",
        "Drains (and reboot requests) made by the agent",
        &[(String::new(), state.drains_total.to_string())],
    );
    gauge(
        "gpu_node_agent_drains_suppressed_total",
        "Drains held back by the fleet guard",
        &[(String::new(), state.suppressed_total.to_string())],
    );
    gauge(
        "gpu_node_agent_resumes_total",
        "Resumes of the agent's own drains",
        &[(String::new(), state.resumes_total.to_string())],
    );
    gauge(
        "gpu_node_agent_drained",
        "1 while the node is drained by the agent",
        &[(String::new(), u8::from(state.drain.is_some()).to_string())],
    );
    let since: Vec<(String, String)> = state
        .drain
        .iter()
        .map(|d| (format!("action=\"{}\"", label_value(&d.action)), d.at.to_string()))
        .collect();
    gauge(
        "gpu_node_agent_drain_timestamp_seconds",
        "When the agent's drain in force was made (Unix time; action: drain, or reboot when it asked Slurm for one); no row without one",
        &since,
    );
    gauge(
        "gpu_node_agent_drain_pending",
        "1 while a decided drain waits for Slurm",
        &[(String::new(), u8::from(state.pending.is_some()).to_string())],
    );
    gauge(
        "gpu_node_agent_reboot_cap_reached",
        "1 while a fault that asks for a reboot is still there after max_reboots of them: drained for a person",
        &[(String::new(), u8::from(report.reboot_cap).to_string())],
    );
    agent_own_gauges(&mut gauge, report, state, table);
    m
}

/// The agent's own trouble: its state file, hung GPUs, drains the fleet
/// guard holds back, the GPU table.
fn agent_own_gauges(
    gauge: &mut impl FnMut(&str, &str, &[(String, String)]),
    report: &Report,
    state: &State,
    table: Option<bool>,
) {
    let suppressed = state.suppressed.as_deref().map(|r| {
        let class = gpu_health::reason::parse(r).map(|p| p.class.name()).unwrap_or_default();
        (format!("class=\"{}\"", label_value(&class)), "1".to_owned())
    });
    gauge(
        "gpu_node_agent_drain_suppressed",
        "1 while the fleet guard holds back a drain this node needs (class: the fault's class); alert on it",
        &[suppressed.unwrap_or_else(|| ("class=\"\"".to_owned(), "0".to_owned()))],
    );
    gauge(
        "gpu_node_agent_state_ok",
        "1 when the agent could keep its state file this pass (lock, read, write); 0: drains only, no reboot, resume or adoption",
        &[(String::new(), u8::from(report.state_ok).to_string())],
    );
    gauge(
        "gpu_node_agent_state_lost",
        "1 when a corrupt state file's history was lost this boot: it is not acted on, no reboots until the next boot or a clear",
        &[(String::new(), u8::from(state.history_lost()).to_string())],
    );
    gauge(
        "gpu_node_agent_state_corrupt_total",
        "Corrupt state files kept aside (state.json.corrupt-<time>)",
        &[(String::new(), state.corrupt_total.to_string())],
    );
    let rows: Vec<(String, String)> =
        report.samples.iter().map(|s| (gpu_labels(s), s.hang.map_or(0, |h| h.secs).to_string())).collect();
    gauge(
        "gpu_node_agent_gpu_nvml_hang_seconds",
        "How long the GPU's NVML calls have not returned (0: it answers)",
        &rows,
    );
    if let Some(ok) = table {
        gauge(
            "gpu_node_agent_gpu_table_ok",
            "1 when the GPU table was written in Slurm's order (from slurmd -G); 0 when it could not be",
            &[(String::new(), u8::from(ok).to_string())],
        );
    }
}

/// Issue 15's checks: per GPU and check, whether it is supported and
/// passes, and the readings behind them.
fn check_gauges(gauge: &mut impl FnMut(&str, &str, &[(String, String)]), report: &Report, state: &State) {
    let mut supported = Vec::new();
    let mut ok = Vec::new();
    let mut readings: [Vec<(String, String)>; 6] = Default::default();
    for s in report.samples.iter().filter(|s| !s.lost && s.open_error.is_none() && !s.reset_required) {
        let labels = gpu_labels(s);
        for (i, (name, on)) in checks::CHECK_NAMES.iter().zip(checks::supported(s)).enumerate() {
            let l = format!("{labels},check=\"{name}\"");
            supported.push((l.clone(), u8::from(on).to_string()));
            if on {
                let bad = report
                    .faults
                    .iter()
                    .any(|f| f.gpu == Some(s.index) && checks::check_of(&f.class) == Some(i));
                ok.push((l, u8::from(!bad).to_string()));
            }
        }
        if let Some(p) = s.hw.pcie {
            for (i, v) in [p.r#gen, p.max_gen, p.width, p.max_width].into_iter().enumerate() {
                readings[i].push((labels.clone(), v.to_string()));
            }
        }
        if let Some(links) = &s.hw.nvlinks {
            readings[4].push((labels.clone(), links.iter().filter(|l| !l.up).count().to_string()));
        }
        if s.hw.clock_events.is_some() {
            let n = state.history.slowdown.get(&s.index.to_string()).copied().unwrap_or(0);
            readings[5].push((labels.clone(), n.to_string()));
        }
    }
    gauge(
        "gpu_node_agent_gpu_check_supported",
        "1 when NVML supports the check on the GPU (pcie, nvlink, fabric, clocks, ecc_mode, persistence); 0: not checked",
        &supported,
    );
    gauge(
        "gpu_node_agent_gpu_check_ok",
        "1 when the supported check passes on the GPU, 0 when it found a fault (whatever its action)",
        &ok,
    );
    let help = [
        ("gpu_node_agent_pcie_link_gen", "The PCIe link's current generation"),
        ("gpu_node_agent_pcie_link_gen_max", "The GPU's maximum PCIe generation"),
        ("gpu_node_agent_pcie_link_width", "The PCIe link's current width (lanes)"),
        ("gpu_node_agent_pcie_link_width_max", "The PCIe link's maximum width (lanes)"),
        ("gpu_node_agent_nvlinks_down", "NVLinks NVML reports that are not up"),
        ("gpu_node_agent_clock_slowdown_checks", "Checks in a row with a hardware slowdown or power brake"),
    ];
    for ((name, text), rows) in help.iter().zip(&readings) {
        gauge(name, text, rows);
    }
}

/// A GPU's labels, named as dcgm-exporter names them: `gpu` (NVML index),
/// `UUID`, `pci_bus_id` (NVML's form).
fn gpu_labels(s: &GpuSample) -> String {
    format!(
        "gpu=\"{}\",UUID=\"{}\",pci_bus_id=\"{}\"",
        s.index,
        label_value(s.uuid.as_deref().unwrap_or("")),
        s.bus_id.map(PciAddr::nvml).unwrap_or_default()
    )
}

/// This boot's Xids by number, each (Xid, GPU) once: a GPU is known by its
/// bus id, or by its NVML index mapped to the bus id through this pass's
/// samples, so an Xid that NVML (index) and the kernel log (bus id) both
/// reported counts once.
pub fn xid_counts(state: &State, report: &Report) -> BTreeMap<u32, u64> {
    let bus_of = |gpu: u32| {
        let s = report.samples.iter().find(|s| s.index == gpu)?;
        s.bus_id.map(PciAddr::kernel)
    };
    // One GPU's records by index and by bus id are one: the largest count.
    let mut per_gpu: BTreeMap<(u32, String), u64> = BTreeMap::new();
    for x in state.xids.records() {
        let gpu = x
            .bus
            .map(PciAddr::kernel)
            .or_else(|| x.gpu.and_then(bus_of))
            .or_else(|| x.gpu.map(|g| format!("gpu{g}")))
            .unwrap_or_default();
        let n = per_gpu.entry((x.xid, gpu)).or_default();
        *n = (*n).max(x.count);
    }
    let mut by_xid = BTreeMap::new();
    for ((xid, _), n) in per_gpu {
        *by_xid.entry(xid).or_default() += n;
    }
    by_xid
}

/// Writes `text` to `path` through a temporary file and a rename, so the
/// collector never reads half a file.
///
/// # Errors
/// The file cannot be written.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    atomic_file::write(path, text.as_bytes(), Options { mode: None, durable: false })
}

/// The running jobs' series: each job's GPUs with their last utilization
/// and memory used and their seconds at 0 % so far.
pub fn job_text(node: &str, rows: &[JobDeviceRow]) -> String {
    type Value<'a> = &'a dyn Fn(&JobDeviceRow) -> Option<String>;
    let node = label_value(node);
    let mut m = String::new();
    let series: [(&str, &str, Value<'_>); 3] = [
        (
            "gpu_node_agent_job_gpu_utilization",
            "The GPU's utilization at the last reading, percent, for the job holding it",
            &|r| r.util.map(|u| u.to_string()),
        ),
        (
            "gpu_node_agent_job_gpu_memory_used_bytes",
            "The GPU's memory used at the last reading, for the job holding it",
            &|r| r.mem_used.map(|b| b.to_string()),
        ),
        (
            "gpu_node_agent_job_gpu_idle_seconds",
            "Seconds the GPU sat at 0 % (a MIG device: with no process) since the job started",
            &|r| Some(r.idle_s.to_string()),
        ),
    ];
    for (name, help, value) in series {
        let _ = writeln!(m, "# HELP {name} {help}\n# TYPE {name} {}", kind_of(name));
        for r in rows {
            if let Some(v) = value(r) {
                let _ = writeln!(
                    m,
                    "{name}{{node=\"{node}\",job=\"{}\",gpu=\"{}\",UUID=\"{}\"}} {v}",
                    r.job,
                    label_value(&r.gpu),
                    label_value(&r.uuid)
                );
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::health::XidSource;
    use crate::store::Occurrence;

    /// A release check that found no plugin and did not ask slurmd.
    fn quiet_release_check() -> crate::slurm::release::ReleaseCheck {
        crate::slurm::release::ReleaseCheck {
            plugstack: "/etc/slurm/plugstack.conf".into(),
            plugins: vec![],
            pyxis: vec![],
            problems: vec![],
            slurmd: Err("not asked".to_owned()),
        }
    }

    fn report(samples: Vec<GpuSample>) -> Report {
        Report {
            samples,
            faults: vec![],
            problems: vec![],
            actions: vec![],
            verdict: Verdict::Healthy,
            node: None,
            state_ok: true,
            reboot_cap: false,
        }
    }

    /// Every metric of [`METRICS`] is written, in its order, with its type and
    /// its labels, by a pass where every metric has rows (the daemon's file:
    /// [`render`], `release::metrics_text`, `network::metrics_text`, then
    /// [`job_text`]), and
    /// nothing else is.
    #[test]
    fn the_file_holds_exactly_the_listed_metrics() {
        use crate::policy::checks::{HwSample, NvLink, Pcie};
        let gpu = GpuSample {
            index: 0,
            uuid: Some("GPU-a".into()),
            bus_id: PciAddr::parse("00000000:1B:00.0").ok(),
            hw: HwSample {
                pcie: Some(Pcie { r#gen: 4, width: 16, max_gen: 5, max_width: 16 }),
                nvlinks: Some(vec![NvLink { link: 0, up: true, ..NvLink::default() }]),
                clock_events: Some(0),
                ecc_mode: Some(true),
                persistence: Some(true),
                ..HwSample::default()
            },
            ..GpuSample::default()
        };
        let mut state = State::default();
        state.xids.ignore(43);
        state.xids.add(
            &Occurrence {
                xid: 79,
                gpu: Some(0),
                bus: None,
                source: XidSource::Nvml,
                kmsg_us: None,
                at: 1,
                fatal: None,
            },
            |_| true,
        );
        state.drain = Some(crate::store::DrainRecord {
            reason: "gpu: xid79 gpu0 GPU has fallen off the bus (nvml)".into(),
            action: "drain".into(),
            needs_reboot: true,
            boot_id: String::new(),
            at: 1_700_000_000,
        });
        // One source known, for `source_up`'s rows (the other tests leave this slot alone).
        if sources::get(Source::Nvml).is_none() {
            let _ = sources::set(Source::Nvml, true);
        }
        let check = quiet_release_check();
        let nets = task_plan::netif::parse_nets("10.1.0.0/16").unwrap();
        let text = render_with("n", &report(vec![gpu]), &state, Some(true))
            + &crate::slurm::release::metrics_text("n", &check)
            + &crate::sources::network::metrics_text("n", &nets, &Ok(vec![]))
            + &job_text(
                "n",
                &[JobDeviceRow {
                    job: 42,
                    gpu: "5.1".into(),
                    uuid: "MIG-a".into(),
                    util: Some(95),
                    mem_used: Some(1 << 30),
                    idle_s: 0,
                }],
            );
        let typed: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .collect();
        let listed: Vec<(&str, &str)> = METRICS.iter().map(|m| (m.name, m.kind)).collect();
        assert_eq!(typed, listed, "the file's metrics (# TYPE lines) vs METRICS\n{text}");
        for m in METRICS {
            let rows: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!("{}{{", m.name))).collect();
            assert!(!rows.is_empty(), "{}: no row\n{text}", m.name);
            for row in rows {
                let labels = row.split_once('{').and_then(|(_, r)| r.rsplit_once('}')).map_or("", |(l, _)| l);
                let names: Vec<&str> =
                    labels.split("\",").filter_map(|kv| kv.split_once('=')).map(|(k, _)| k).collect();
                let want: Vec<&str> = std::iter::once("node").chain(m.labels.iter().copied()).collect();
                assert_eq!(names, want, "{}: labels of {row}", m.name);
            }
        }
    }

    #[test]
    fn renders_textfile_format() {
        let gpu = GpuSample {
            index: 0,
            uuid: Some("GPU-a".into()),
            bus_id: PciAddr::parse("00000000:1B:00.0").ok(),
            ..GpuSample::default()
        };
        let text = render("node1", &report(vec![gpu]), &State::default());
        assert!(text.contains("gpu_node_agent_up{node=\"node1\"} 1\n"), "{text}");
        assert!(
            text.contains(
                "gpu_node_agent_gpu_healthy{node=\"node1\",gpu=\"0\",UUID=\"GPU-a\",pci_bus_id=\"00000000:1B:00.0\"} 1\n"
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE gpu_node_agent_drains_total counter"));
        assert!(text.contains("# TYPE gpu_node_agent_xid_events_total counter"));
        assert!(text.contains(&format!(
            "gpu_node_agent_build_info{{node=\"node1\",version=\"{}\",nvml_driver=",
            env!("CARGO_PKG_VERSION")
        )));
        let stamp = text
            .lines()
            .find_map(|l| l.strip_prefix("gpu_node_agent_last_pass_timestamp_seconds{node=\"node1\"} "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        assert!(stamp > 1.7e9, "{text}");
        // Every sample line is `name{labels} value`.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = l.rsplit_once("} ").unwrap_or_default();
            assert!(value.parse::<f64>().is_ok(), "{l}");
        }
    }

    #[test]
    fn xids_are_counted_per_xid_and_gpu_and_ignored_ones_apart() {
        let seen = |xid, gpu, bus: Option<&str>, source: XidSource| Occurrence {
            xid,
            gpu,
            bus: bus.map(|b| PciAddr::parse(b).unwrap()),
            source,
            kmsg_us: None,
            at: 1,
            fatal: None,
        };
        let mut state = State::default();
        for o in [
            // `check` gets NVML's events without a bus id; the kernel log has only the bus id.
            seen(79, Some(3), None, XidSource::Nvml),
            seen(79, None, Some("0000:61:00"), XidSource::Kmsg),
            seen(79, None, Some("0000:61:00"), XidSource::Kmsg),
            seen(79, Some(4), Some("0000:62:00"), XidSource::Nvml),
            seen(48, Some(4), Some("0000:62:00"), XidSource::Nvml),
        ] {
            state.xids.add(&o, |_| true);
        }
        for _ in 0..5 {
            state.xids.ignore(43);
        }
        let gpu =
            |index, bus: &str| GpuSample { index, bus_id: PciAddr::parse(bus).ok(), ..GpuSample::default() };
        let r = report(vec![gpu(3, "00000000:61:00.0"), gpu(4, "00000000:62:00.0")]);
        let counts = xid_counts(&state, &r);
        assert_eq!(counts.into_iter().collect::<Vec<_>>(), vec![(48, 1), (79, 3)]);
        let text = render("n", &r, &state);
        assert!(text.contains("gpu_node_agent_xid_events_total{node=\"n\",xid=\"79\"} 3\n"), "{text}");
        assert!(text.contains("gpu_node_agent_xid_ignored_total{node=\"n\",xid=\"43\"} 5\n"), "{text}");
    }

    #[test]
    fn the_agents_own_trouble_shows() {
        let hung = GpuSample {
            index: 2,
            hang: Some(crate::policy::health::Hang { secs: 42, polls: 2 }),
            ..GpuSample::default()
        };
        let mut r = report(vec![GpuSample::default(), hung]);
        r.state_ok = false;
        let state = State {
            suppressed: Some("gpu: xid79 gpu3 GPU has fallen off the bus (nvml)".into()),
            lost: Some(crate::store::LostHistory { history_lost: true, ..Default::default() }),
            corrupt_total: 2,
            ..State::default()
        };
        r.reboot_cap = true;
        let text = render("n", &r, &state);
        for want in [
            "gpu_node_agent_reboot_cap_reached{node=\"n\"} 1\n",
            "gpu_node_agent_drain_suppressed{node=\"n\",class=\"xid79\"} 1\n",
            "gpu_node_agent_state_ok{node=\"n\"} 0\n",
            "gpu_node_agent_state_lost{node=\"n\"} 1\n",
            "gpu_node_agent_state_corrupt_total{node=\"n\"} 2\n",
            "gpu_node_agent_gpu_nvml_hang_seconds{node=\"n\",gpu=\"2\",UUID=\"\",pci_bus_id=\"\"} 42\n",
            "gpu_node_agent_gpu_nvml_hang_seconds{node=\"n\",gpu=\"0\",UUID=\"\",pci_bus_id=\"\"} 0\n",
            "gpu_node_agent_gpu_healthy{node=\"n\",gpu=\"2\",UUID=\"\",pci_bus_id=\"\"} 0\n",
        ] {
            assert!(text.contains(want), "{want}\n{text}");
        }
        let quiet = render("n", &report(vec![]), &State::default());
        assert!(quiet.contains("gpu_node_agent_drain_suppressed{node=\"n\",class=\"\"} 0\n"), "{quiet}");
        assert!(quiet.contains("gpu_node_agent_reboot_cap_reached{node=\"n\"} 0\n"), "{quiet}");
        assert!(!quiet.contains("gpu_node_agent_drain_timestamp_seconds{"), "no drain, no row:\n{quiet}");
    }

    type Labels = Vec<(String, String)>;

    /// One sample line read as Prometheus's text parser reads it (the
    /// exposition format: `name{label="value",...} number`, a label value
    /// ended by the first unescaped `"`, with `\\`, `\"` and `\n` its only
    /// escapes): the name, the labels with their values unescaped, the
    /// number. `None` where that parser rejects the line.
    fn parse_sample(line: &str) -> Option<(String, Labels, f64)> {
        let is_name = |c: char, first: bool| {
            c == '_' || c == ':' || c.is_ascii_alphabetic() || (!first && c.is_ascii_digit())
        };
        let mut chars = line.chars().peekable();
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if !is_name(c, name.is_empty()) {
                break;
            }
            name.push(c);
            chars.next();
        }
        let mut labels = Vec::new();
        if chars.peek() == Some(&'{') {
            chars.next();
            loop {
                if chars.peek() == Some(&'}') {
                    chars.next();
                    break;
                }
                let mut key = String::new();
                while let Some(&c) = chars.peek() {
                    if c == ':' || !is_name(c, key.is_empty()) {
                        break;
                    }
                    key.push(c);
                    chars.next();
                }
                if key.is_empty() || chars.next() != Some('=') || chars.next() != Some('"') {
                    return None;
                }
                let mut value = String::new();
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\n' => return None,
                        '\\' => match chars.next()? {
                            '\\' => value.push('\\'),
                            '"' => value.push('"'),
                            'n' => value.push('\n'),
                            _ => return None,
                        },
                        c => value.push(c),
                    }
                }
                labels.push((key, value));
                match chars.next()? {
                    ',' => {}
                    '}' => break,
                    _ => return None,
                }
            }
        }
        if name.is_empty() || chars.next() != Some(' ') {
            return None;
        }
        let value: f64 = chars.collect::<String>().parse().ok()?;
        Some((name, labels, value))
    }

    #[test]
    fn label_values_are_escaped_as_the_exposition_format_says() {
        assert_eq!(label_value("node1"), "node1");
        assert_eq!(label_value("a\\b"), "a\\\\b");
        assert_eq!(label_value("say \"hi\""), "say \\\"hi\\\"");
        assert_eq!(label_value("two\nlines"), "two\\nlines");
        assert_eq!(label_value("tab\tand é"), "tab\tand é", "only the three are escaped");
        for v in ["", "plain", "\\", "\"", "\n", "\\\"", "\\n", "a\"},b=\"c", "end\\", "x\r\ny", "ü\u{1F600}"]
        {
            let line = format!("m{{node=\"{}\",b=\"2\"}} 1", label_value(v));
            let parsed = parse_sample(&line);
            let want = vec![("node".to_owned(), v.to_owned()), ("b".to_owned(), "2".to_owned())];
            assert_eq!(parsed, Some(("m".to_owned(), want, 1.0)), "{v:?} as {line:?}");
        }
        // The parser is the format's: unescaped quotes or unknown escapes fail.
        assert_eq!(parse_sample("m{node=\"a\"b\"} 1"), None);
        assert_eq!(parse_sample("m{node=\"a\\tb\"} 1"), None);
    }

    /// A node name, driver version, plugin path and package with the three
    /// characters: every line of the daemon's file reads, and each value is
    /// the one given.
    #[test]
    fn every_line_of_the_file_reads_with_any_text_in_its_labels() {
        let node = "n\"1\\x\ny";
        let gpu = GpuSample { index: 0, uuid: Some("GPU-\"\\\n".into()), ..GpuSample::default() };
        let check = quiet_release_check();
        let nets = task_plan::netif::parse_nets("10.1.0.0/16").unwrap();
        let text = render_with(node, &report(vec![gpu]), &State::default(), Some(true))
            + &crate::slurm::release::metrics_text(node, &check)
            + &crate::sources::network::metrics_text(node, &nets, &Ok(vec![]));
        let mut samples = 0;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, labels, _) = parse_sample(line).unwrap_or_else(|| panic!("does not read: {line:?}"));
            assert_eq!(labels.first(), Some(&("node".to_owned(), node.to_owned())), "{line}");
            if name == "gpu_node_agent_gpu_healthy" {
                assert!(labels.contains(&("UUID".to_owned(), "GPU-\"\\\n".to_owned())), "{line}");
            }
            samples += 1;
        }
        assert!(samples > 20, "{text}");
    }
}
