//! A node as `scontrol show node` describes it: its state, the reason
//! Slurm keeps for a drain (without Slurm's ` [user@time]` suffix, which is
//! read apart), and the GPUs and MIG slices its `Gres=` names. The agent
//! reads its own node and the fleet with it.

/// One node as `scontrol show node` describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// `NodeName`.
    pub name: String,
    /// `State`, e.g. `IDLE+DRAIN`, `MIXED`, `DOWN+NOT_RESPONDING`.
    pub state: String,
    /// `Reason` without Slurm's ` [user@time]` suffix.
    pub reason: Option<String>,
    /// When the reason was set, from that suffix (`2026-11-29T17:14:37`).
    pub reason_time: Option<String>,
    /// Physical GPUs in `Gres=` (`gpu[:type]:N`); MIG slices are not GPUs.
    pub gres_gpus: Option<u32>,
    /// MIG slices in `Gres=` (`gpu:1g.10gb:28`).
    pub gres_mig: u32,
}

impl NodeInfo {
    /// Whether the node is drained, draining, down or failing: someone took
    /// it out of service.
    pub fn out_of_service(&self) -> bool {
        self.state
            .split('+')
            .any(|f| matches!(f, "DRAIN" | "DRAINED" | "DRAINING" | "DOWN" | "FAIL" | "FAILING"))
    }

    /// Whether the node is drained or draining (by anyone): what the fleet guard counts.
    pub fn drained(&self) -> bool {
        self.state.split('+').any(|f| matches!(f, "DRAIN" | "DRAINED" | "DRAINING" | "FAIL" | "FAILING"))
    }

    /// Whether Slurm configures GPUs (or MIG slices) on the node.
    pub fn has_gpus(&self) -> bool {
        self.gres_gpus.is_some_and(|n| n > 0) || self.gres_mig > 0
    }

    /// Whether a reboot the agent asked for is still waiting.
    pub fn reboot_requested(&self) -> bool {
        self.state.split('+').any(|f| f.starts_with("REBOOT"))
    }
}

/// Parses `scontrol show node` output (one or many nodes, one field per
/// `Key=value` word, `Reason=` running to the end of its line).
pub fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    let mut nodes: Vec<NodeInfo> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("Reason=") {
            let (reason, time) = match rest.rfind(" [") {
                Some(i) if rest.ends_with(']') => {
                    let stamp = rest.get(i + 2..rest.len() - 1).unwrap_or("");
                    (&rest[..i], stamp.split_once('@').map(|(_, t)| t.to_owned()))
                }
                _ => (rest, None),
            };
            if let Some(node) = nodes.last_mut() {
                node.reason = Some(reason.to_owned());
                node.reason_time = time;
            }
            continue;
        }
        for word in line.split_whitespace() {
            if let Some(name) = word.strip_prefix("NodeName=") {
                nodes.push(NodeInfo { name: name.to_owned(), ..NodeInfo::default() });
            } else if let Some(node) = nodes.last_mut() {
                if let Some(state) = word.strip_prefix("State=") {
                    state.clone_into(&mut node.state);
                } else if let Some(gres) = word.strip_prefix("Gres=") {
                    (node.gres_gpus, node.gres_mig) = gres_gpu_count(gres);
                }
            }
        }
    }
    nodes
}

/// Whether a GRES type names a MIG slice (`1g.10gb`, `a100_3g.20gb`,
/// `1g.10gb+me`): NVIDIA's profile names are `<slices>g.<memory>gb`.
fn is_mig_type(ty: &str) -> bool {
    let profile = ty.rsplit('_').next().unwrap_or(ty);
    let Some((slices, rest)) = profile.split_once("g.") else { return false };
    let mem = rest.split('+').next().unwrap_or(rest);
    !slices.is_empty()
        && slices.bytes().all(|b| b.is_ascii_digit())
        && mem.strip_suffix("gb").is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
}

/// Physical GPUs and MIG slices in a `Gres=` value: `gpu:h100:8`,
/// `gpu:8(S:0-1)`, `gpu:a:4,gpu:b:4`, `gpu:1g.10gb:28,gpu:2g.20gb:12`.
fn gres_gpu_count(gres: &str) -> (Option<u32>, u32) {
    let (mut gpus, mut mig) = (None, 0u32);
    for item in gres.split(',') {
        let item = item.split('(').next().unwrap_or(item);
        let parts: Vec<&str> = item.split(':').collect();
        if parts.first() != Some(&"gpu") {
            continue;
        }
        let n = parts.last().and_then(|n| n.parse::<u32>().ok());
        let ty = match parts.len() {
            3 => Some(parts[1]),
            2 if n.is_none() => Some(parts[1]),
            _ => None,
        };
        let n = n.unwrap_or(1);
        if ty.is_some_and(is_mig_type) {
            mig = mig.saturating_add(n);
        } else {
            gpus = Some(gpus.unwrap_or(0u32).saturating_add(n));
        }
    }
    (gpus, mig)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOW: &str = "NodeName=node1 Arch=x86_64 CoresPerSocket=1
   CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.14
   Gres=gpu:h100:8
   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug

NodeName=node2 Arch=x86_64 CoresPerSocket=1
   Gres=gpu:h100:8(S:0)
   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Reason=gpu: xid79 gpu3 GPU has fallen off the bus (nvml) [root@2026-11-29T17:14:37]

NodeName=node3 Arch=x86_64
   State=DOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1
   Reason=bad dimm, ticket 4411 [alice@2026-11-29T10:00:00]
";

    #[test]
    fn parses_nodes_states_and_reasons() {
        let nodes = parse_nodes(SHOW);
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].state, "IDLE");
        assert_eq!(nodes[0].gres_gpus, Some(8));
        assert!(!nodes[0].out_of_service());
        assert_eq!(nodes[1].reason.as_deref(), Some("gpu: xid79 gpu3 GPU has fallen off the bus (nvml)"));
        assert_eq!(nodes[1].reason_time.as_deref(), Some("2026-11-29T17:14:37"));
        assert!(nodes[1].drained() && nodes[1].has_gpus());
        assert_eq!(nodes[2].reason.as_deref(), Some("bad dimm, ticket 4411"));
        assert!(nodes[2].out_of_service() && nodes[2].drained() && !nodes[2].has_gpus());
    }

    #[test]
    fn counts_gpus_in_gres() {
        assert_eq!(gres_gpu_count("gpu:h100:8"), (Some(8), 0));
        assert_eq!(gres_gpu_count("gpu:8(S:0-1)"), (Some(8), 0));
        assert_eq!(gres_gpu_count("gpu:a100:4,gpu:h100:4"), (Some(8), 0));
        assert_eq!(gres_gpu_count("gpu:h100"), (Some(1), 0));
        assert_eq!(gres_gpu_count("(null)"), (None, 0));
    }

    #[test]
    fn mig_slices_are_not_gpus() {
        assert_eq!(gres_gpu_count("gpu:1g.10gb:28,gpu:2g.20gb:12"), (None, 40));
        assert_eq!(gres_gpu_count("gpu:a100_3g.40gb:2(S:0),gpu:a100:6"), (Some(6), 2));
        assert_eq!(gres_gpu_count("gpu:1g.10gb+me:7"), (None, 7));
        let n = &parse_nodes("NodeName=m1\n   Gres=gpu:1g.10gb:28,gpu:2g.20gb:12\n   State=IDLE\n")[0];
        assert!(n.has_gpus() && n.gres_gpus.is_none());
    }
}
