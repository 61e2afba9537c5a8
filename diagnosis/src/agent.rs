//! The GPU agent's drain reasons, decoded for users (the grammar is
//! [`gpu_health::reason`]).

use gpu_health::reason::Class;
use gpu_health::xid;

/// A drain reason written by gpu-node-agent, decoded: `gpu: CLASS [gpuN] DETAIL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentDrain {
    /// The class word: `xid79`, `ecc-dbe`, `remap-pend`, `lost`, ...
    pub class: String,
    /// The GPU's index on the node, when the reason names one.
    pub gpu: Option<u32>,
    /// The Xid, for an `xidNN` class.
    pub xid: Option<u32>,
    /// The rest of the reason.
    pub detail: String,
    /// One sentence for the user.
    pub meaning: String,
}

/// Decodes a drain reason written by the GPU agent on `node` (its grammar is
/// [`gpu_health::reason`]); `None` for any other reason (an admin's own
/// `gpu: RMA ticket 42` included). A trailing `[user@time]` that `scontrol`
/// adds is ignored.
pub fn decode_agent_reason(node: &str, reason: &str) -> Option<AgentDrain> {
    let reason = reason.trim();
    let reason = match reason.rfind(" [") {
        Some(i) if reason.ends_with(']') && reason[i..].contains('@') => &reason[..i],
        _ => reason,
    };
    let parsed = gpu_health::reason::parse(reason)?;
    let which = parsed.gpu.map_or_else(|| "a GPU".to_owned(), |g| format!("GPU {g}"));
    let what = match &parsed.class {
        Class::Xid(x) => format!("{which} on {node} failed with Xid {x} ({})", xid::describe(*x)),
        Class::EccUncorrectable => format!("{which} on {node} has uncorrectable memory (ECC) errors"),
        Class::RemapPending => format!("{which} on {node} needs a reset to remap a bad memory row"),
        Class::RemapFailure => {
            format!("{which} on {node} could not remap a bad memory row and must be replaced")
        }
        Class::Lost => format!("{which} on {node} fell off the bus"),
        Class::Missing => format!("{node} shows fewer GPUs than Slurm expects"),
        Class::ResetRequired => format!("{which} on {node} needs a reset"),
        Class::Unusable => format!("{which} on {node} cannot be used"),
        Class::DriverMismatch => {
            format!("the GPU driver on {node} was upgraded without a reboot; every GPU job there fails")
        }
        Class::RecoveryAction(a) => format!(
            "the driver on {node} asks for recovery ({}) of {which}",
            xid::recovery_action_name(*a).unwrap_or("unknown action")
        ),
        Class::Pcie => format!("the PCIe link of {which} on {node} runs below its speed"),
        Class::NvLinkDown => format!("an NVLink of {which} on {node} is down"),
        Class::NvLinkErrors => format!("an NVLink of {which} on {node} keeps failing"),
        Class::Fabric => format!("{which} on {node} is not in the NVSwitch fabric"),
        Class::Slowdown => format!("{which} on {node} is held back by a hardware slowdown"),
        Class::EccOff => format!("{which} on {node} runs with ECC off"),
        Class::PersistenceOff => format!("{which} on {node} runs without persistence mode"),
        Class::NvmlHang => format!("{which} on {node} stopped answering the driver"),
    };
    Some(AgentDrain {
        class: parsed.class.name(),
        gpu: parsed.gpu,
        xid: match parsed.class {
            Class::Xid(x) => Some(x),
            _ => None,
        },
        detail: parsed.detail.trim().to_owned(),
        meaning: format!("{what}; the GPU agent drained the node, an admin must repair it. Not your code"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drained_node_reason_is_decoded() {
        let node = super::super::parse_record(include_str!("../tests/fixtures/jobinfo/22.05/node2.scontrol"));
        let reason = node.get("Reason").cloned().unwrap_or_default();
        let a = decode_agent_reason("node2", &reason).expect("the agent's reason");
        assert_eq!((a.class.as_str(), a.gpu, a.xid), ("xid79", Some(3), Some(79)));
        assert_eq!(a.detail, "GPU has fallen off the bus (kmsg)");
        assert!(a.meaning.starts_with("GPU 3 on node2 failed with Xid 79"), "{}", a.meaning);
        let sinfo = include_str!("../tests/fixtures/jobinfo/22.05/node2.sinfo");
        let sinfo = sinfo.trim().splitn(3, '|').nth(2).unwrap_or("");
        assert_eq!(decode_agent_reason("node2", sinfo), Some(a));
    }

    #[test]
    fn other_reasons_are_not_the_agents() {
        assert_eq!(decode_agent_reason("n", "gpu: RMA ticket 42"), None);
        // Every class the agent writes is the agent's, the link checks' included.
        let pcie = decode_agent_reason("n", "gpu: pcie gpu2 x8/16 gen5/5: link trained below the GPU's max")
            .expect("a PCIe drain is the agent's");
        assert_eq!((pcie.class.as_str(), pcie.gpu), ("pcie", Some(2)));
        assert!(
            pcie.meaning.starts_with("the PCIe link of GPU 2 on n runs below its speed"),
            "{}",
            pcie.meaning
        );
        assert_eq!(decode_agent_reason("n", "maintenance"), None);
        assert_eq!(decode_agent_reason("n", "gpu:xid79 gpu3"), None);
        let lost = decode_agent_reason("n", "gpu: lost gpu1 NVML: GPU is lost (fallen off the bus)");
        assert_eq!(lost.map(|a| (a.gpu, a.xid)), Some((Some(1), None)));
        let missing = decode_agent_reason("n", "gpu: missing 7/8 GPUs visible, Slurm expects 8");
        assert!(missing.is_some_and(|a| a.gpu.is_none() && a.meaning.contains("fewer GPUs")));
        let rec = decode_agent_reason("n", "gpu: recovery2 gpu0 driver asks for a node reboot");
        assert!(rec.is_some_and(|a| a.meaning.contains("node reboot")));
    }
}
