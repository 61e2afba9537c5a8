//! Metrics in node_exporter's textfile format, written atomically.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::agent::{Report, Verdict};
use crate::state::State;

/// The text of the metrics file after a pass.
pub fn render(node: &str, report: &Report, state: &State) -> String {
    let mut m = String::new();
    let node = node.replace(['"', '\\', '\n'], "_");
    let mut gauge = |name: &str, help: &str, kind: &str, rows: &[(String, String)]| {
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
        "gauge",
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
        "gauge",
        &[(String::new(), verdict.to_string())],
    );
    let rows: Vec<(String, String)> = report
        .samples
        .iter()
        .map(|s| {
            let bad = report
                .faults
                .iter()
                .any(|f| f.gpu == Some(s.index) && f.action >= gpu_core::xid::Action::Drain);
            let uuid = s.uuid.as_deref().unwrap_or("").replace(['"', '\\', '\n'], "_");
            (format!("gpu=\"{}\",uuid=\"{uuid}\"", s.index), u8::from(!bad && !s.lost).to_string())
        })
        .collect();
    gauge("gpu_node_agent_gpu_healthy", "1 when the GPU has no fault that needs a drain", "gauge", &rows);
    let mut by_xid: BTreeMap<u32, u64> = BTreeMap::new();
    for x in &state.xids {
        *by_xid.entry(x.xid).or_default() += 1;
    }
    let rows: Vec<(String, String)> =
        by_xid.iter().map(|(x, n)| (format!("xid=\"{x}\""), n.to_string())).collect();
    gauge("gpu_node_agent_xid_events", "Distinct Xid events (per GPU) seen this boot", "gauge", &rows);
    gauge(
        "gpu_node_agent_drains_total",
        "Drains (and reboot requests) made by the agent",
        "counter",
        &[(String::new(), state.drains_total.to_string())],
    );
    gauge(
        "gpu_node_agent_drains_suppressed_total",
        "Drains held back by the fleet guard",
        "counter",
        &[(String::new(), state.suppressed_total.to_string())],
    );
    gauge(
        "gpu_node_agent_resumes_total",
        "Resumes of the agent's own drains",
        "counter",
        &[(String::new(), state.resumes_total.to_string())],
    );
    gauge(
        "gpu_node_agent_drained",
        "1 while the node is drained by the agent",
        "gauge",
        &[(String::new(), u8::from(state.drain.is_some()).to_string())],
    );
    gauge(
        "gpu_node_agent_drain_pending",
        "1 while a decided drain waits for Slurm",
        "gauge",
        &[(String::new(), u8::from(state.pending.is_some()).to_string())],
    );
    m
}

/// Writes `text` to `path` through a temporary file and a rename, so the
/// collector never reads half a file.
///
/// # Errors
/// The file cannot be written.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("prom.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::GpuSample;

    #[test]
    fn renders_textfile_format() {
        let report = Report {
            samples: vec![GpuSample { index: 0, uuid: Some("GPU-a".into()), ..GpuSample::default() }],
            faults: vec![],
            problems: vec![],
            actions: vec![],
            verdict: Verdict::Healthy,
            node: None,
        };
        let text = render("node1", &report, &State::default());
        assert!(text.contains("gpu_node_agent_up{node=\"node1\"} 1\n"), "{text}");
        assert!(
            text.contains("gpu_node_agent_gpu_healthy{node=\"node1\",gpu=\"0\",uuid=\"GPU-a\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE gpu_node_agent_drains_total counter"));
    }
}
