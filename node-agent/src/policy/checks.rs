//! Health beyond Xid and ECC errors (issue 15): the PCIe link, the NVLinks,
//! the NVSwitch fabric, clock slowdowns, the ECC and persistence modes. Pure.
//!
//! What NVML answered goes into [`HwSample`] (one per GPU, inside
//! [`GpuSample`]); a reading NVML does not support is `None` and is never a
//! fault: "not supported" means "not checked". [`evaluate`] turns the
//! samples, and what earlier checks saw ([`History`], kept in the state file
//! so `check --act` as a HealthCheckProgram counts too), into
//! [`Fault`]s with the admin's actions; the rules in `decide` do the rest.
//!
//! | check | fault when | reason |
//! | --- | --- | --- |
//! | PCIe link | width below the max; or generation below the GPU's max while the GPU is in P0 (idle GPUs lower the generation to save power) | `gpu: pcie gpu2 x8/16 gen5/5 ...` |
//! | NVLink down | a link that NVML reports and that is not up, on a node where some GPU has a link up (bridgeless PCIe cards report inactive links) | `gpu: nvlink gpu5 l3 down ...` |
//! | NVLink errors | a link's CRC + replay + recovery error counters grew faster than `nvlink_errors_per_minute` since the last check | `gpu: nvlink-err gpu5 l3 ...` |
//! | fabric | state completed with a failure status, or not completed `fabric_timeout` after boot | `gpu: fabric gpu0 ...` |
//! | clock slowdown | hardware slowdown, hardware thermal slowdown or power brake active in [`SLOWDOWN_CHECKS`] consecutive checks | `gpu: slowdown gpu3 ...` |
//! | ECC mode | ECC supported and off | `gpu: ecc-off gpu1 ...` |
//! | persistence | persistence mode off | `gpu: persist gpu1 ...` |

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Policy;
use crate::policy::health::{Class, Fault};
use crate::policy::rows::{self, Step};
pub use crate::policy::sample::{Fabric, FabricState, GpuSample, HwSample, NvLink, Pcie};

/// Consecutive checks with a hardware slowdown before it is a fault.
pub const SLOWDOWN_CHECKS: u32 = 3;

/// NVML's clock event reason bits that count as a hardware slowdown: HW
/// slowdown, HW thermal slowdown, HW power brake. (SW power capping and SW
/// thermal slowdown are the driver's normal control loop under load.)
pub const SLOWDOWN_BITS: &[(u64, &str)] =
    &[(0x8, "hw_slowdown"), (0x40, "hw_thermal_slowdown"), (0x80, "hw_power_brake")];

/// What earlier checks saw, kept in the state file (reset at each boot).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct History {
    /// Consecutive checks with a hardware slowdown, per GPU (NVML index as text).
    pub slowdown: BTreeMap<String, u32>,
    /// NVLink error counters at the last check, per `GPU/link`: (errors, Unix ms).
    pub nvlink: BTreeMap<String, (u64, u64)>,
}

/// When this check runs: for error rates and the fabric's time since boot.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    /// Unix time in milliseconds.
    pub unix_ms: u64,
    /// Time since boot, when known.
    pub uptime: Option<Duration>,
    /// Whether the check is on the poll clock ([`rows`]): only then do the
    /// slowdown counts and the NVLink error bases move on.
    pub step: Step,
}

/// The names of the active slowdown reasons in a clock events mask.
pub fn slowdowns(mask: u64) -> Vec<&'static str> {
    SLOWDOWN_BITS.iter().filter(|(bit, _)| mask & bit != 0).map(|(_, n)| *n).collect()
}

/// Whether a PCIe link is below its maximum, and the detail.
fn pcie_degraded(p: Pcie, pstate: Option<u32>) -> Option<String> {
    let narrow = p.width < p.max_width;
    // Idle GPUs lower the link generation to save power: only a busy one (P0) says.
    let slow = p.r#gen < p.max_gen && pstate == Some(0);
    let (w, g) = (format!("x{}/{}", p.width, p.max_width), format!("gen{}/{}", p.r#gen, p.max_gen));
    match (narrow, slow) {
        (false, false) => None,
        (true, _) => Some(format!("{w} {g}: link trained below the GPU's max; reseat or replace")),
        (false, true) => Some(format!("{g} {w}: link trained below the GPU's max; reseat or replace")),
    }
}

/// The faults of issue 15's checks, and the history to keep for the next check.
pub fn evaluate(samples: &[GpuSample], before: &History, now: Now, policy: &Policy) -> (Vec<Fault>, History) {
    let mut faults = Vec::new();
    let mut after = History::default();
    // Cards whose NVLink bridges are not fitted report their links inactive: a
    // node where no GPU has a link up is taken as a node without NVLink.
    let node_has_nvlink = samples.iter().any(|s| s.hw.nvlinks.iter().flatten().any(|l| l.up));
    for s in samples.iter().filter(|s| !s.lost && !s.reset_required && s.open_error.is_none()) {
        let g = s.index;
        let hw = &s.hw;
        let mut push = |class: Class, action, detail: String| {
            faults.push(Fault { class, gpu: Some(g), action, detail });
        };
        if let Some(detail) = hw.pcie.and_then(|p| pcie_degraded(p, hw.pstate)) {
            push(Class::Pcie, policy.pcie_degraded, detail);
        }
        if let Some(links) = &hw.nvlinks {
            let down: Vec<u32> = links.iter().filter(|l| !l.up).map(|l| l.link).collect();
            if let Some(first) = down.first().filter(|_| node_has_nvlink) {
                push(
                    Class::NvLinkDown,
                    policy.nvlink_down,
                    format!("l{first} down ({} of {} NVLinks down)", down.len(), links.len()),
                );
            }
            let mut over = None;
            for l in links.iter().filter(|l| l.up) {
                let key = format!("{g}/{}", l.link);
                let errors = l.errors();
                let was = before.nvlink.get(&key).copied();
                if let Some((base, at)) = was.filter(|&(_, at)| now.unix_ms > at) {
                    let grew = errors.saturating_sub(base);
                    let ms = now.unix_ms - at;
                    // grew / minutes > limit, in integers.
                    if u128::from(grew) * 60_000
                        > u128::from(policy.nvlink_errors_per_minute) * u128::from(ms)
                        && over.is_none()
                    {
                        over = Some(l.link);
                    }
                    after.nvlink.insert(key, rows::base(was, (errors, now.unix_ms), now.step));
                } else {
                    // No earlier reading (or none older): the older one, or this one, is the base.
                    after.nvlink.insert(key, was.unwrap_or((errors, now.unix_ms)));
                }
            }
            if let Some(link) = over {
                push(
                    Class::NvLinkErrors,
                    policy.nvlink_errors,
                    format!(
                        "l{link} CRC/replay/recovery errors above {}/min",
                        policy.nvlink_errors_per_minute
                    ),
                );
            }
        }
        if let Some(f) = hw.fabric {
            let late = now.uptime.is_some_and(|u| u >= policy.fabric_timeout);
            match f.state {
                FabricState::Completed if f.failed => push(
                    Class::Fabric,
                    policy.fabric_failure,
                    "completed with a failure: NVSwitch fabric unusable; see fabric manager".to_owned(),
                ),
                FabricState::NotStarted | FabricState::InProgress if late => push(
                    Class::Fabric,
                    policy.fabric_failure,
                    format!(
                        "{} past fabric_timeout ({} s) after boot; see fabric manager",
                        f.state.name(),
                        policy.fabric_timeout.as_secs()
                    ),
                ),
                _ => {}
            }
        }
        if let Some(mask) = hw.clock_events {
            let active = slowdowns(mask);
            let n = rows::next(
                before.slowdown.get(&g.to_string()).copied().unwrap_or(0),
                !active.is_empty(),
                now.step,
            );
            if n > 0 {
                after.slowdown.insert(g.to_string(), n);
                if n >= SLOWDOWN_CHECKS {
                    push(
                        Class::Slowdown,
                        policy.clock_slowdown,
                        format!("{} in {SLOWDOWN_CHECKS} checks in a row", active.join("+")),
                    );
                }
            }
        }
        if hw.ecc_mode == Some(false) {
            push(
                Class::EccOff,
                policy.ecc_disabled,
                "ECC mode disabled: nvidia-smi -e 1, then reboot".to_owned(),
            );
        }
        if hw.persistence == Some(false) {
            push(
                Class::PersistenceOff,
                policy.persistence_disabled,
                "persistence mode off: enable nvidia-persistenced".to_owned(),
            );
        }
    }
    (faults, after)
}

/// What a GPU's checks read, one short cell per check for `status`; `n/s`:
/// not supported, not checked.
pub fn cells(s: &GpuSample, history: &History) -> [String; 6] {
    let hw = &s.hw;
    let ns = || "n/s".to_owned();
    let pcie =
        hw.pcie.map_or_else(ns, |p| format!("gen{}/{} x{}/{}", p.r#gen, p.max_gen, p.width, p.max_width));
    let nvlink = hw
        .nvlinks
        .as_ref()
        .map_or_else(ns, |l| format!("{}/{} up", l.iter().filter(|l| l.up).count(), l.len()));
    let fabric = match hw.fabric {
        None | Some(Fabric { state: FabricState::NotSupported, .. }) => ns(),
        Some(f) => format!("{}{}", f.state.name(), if f.failed { "+failure" } else { "" }),
    };
    let clocks = hw.clock_events.map_or_else(ns, |m| {
        let active = slowdowns(m);
        if active.is_empty() {
            "ok".to_owned()
        } else {
            let n = history.slowdown.get(&s.index.to_string()).copied().unwrap_or(0);
            format!("{} {n}/{SLOWDOWN_CHECKS}", active.join("+"))
        }
    });
    let on_off = |v: Option<bool>| v.map_or_else(ns, |on| if on { "on" } else { "OFF" }.to_owned());
    [pcie, nvlink, fabric, clocks, on_off(hw.ecc_mode), on_off(hw.persistence)]
}

/// The checks by name, as `status` heads them and metrics label them.
pub const CHECK_NAMES: [&str; 6] = ["pcie", "nvlink", "fabric", "clocks", "ecc_mode", "persistence"];

/// Whether each check is supported on a GPU (in [`CHECK_NAMES`] order).
pub fn supported(s: &GpuSample) -> [bool; 6] {
    let hw = &s.hw;
    [
        hw.pcie.is_some(),
        hw.nvlinks.is_some(),
        hw.fabric.is_some_and(|f| f.state != FabricState::NotSupported),
        hw.clock_events.is_some(),
        hw.ecc_mode.is_some(),
        hw.persistence.is_some(),
    ]
}

/// The check (in [`CHECK_NAMES`]) a fault class belongs to.
pub fn check_of(class: &Class) -> Option<usize> {
    Some(match class {
        Class::Pcie => 0,
        Class::NvLinkDown | Class::NvLinkErrors => 1,
        Class::Fabric => 2,
        Class::Slowdown => 3,
        Class::EccOff => 4,
        Class::PersistenceOff => 5,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use gpu_health::xid::Action;

    use super::*;

    fn gpu(index: u32, hw: HwSample) -> GpuSample {
        GpuSample { index, hw, ..GpuSample::default() }
    }

    fn links(n: u32) -> Vec<NvLink> {
        (0..n).map(|link| NvLink { link, up: true, ..NvLink::default() }).collect()
    }

    fn hgx() -> HwSample {
        HwSample {
            pcie: Some(Pcie { r#gen: 5, width: 16, max_gen: 5, max_width: 16 }),
            pstate: Some(0),
            nvlinks: Some(links(18)),
            fabric: Some(Fabric { state: FabricState::Completed, failed: false }),
            clock_events: Some(0x4),
            ecc_mode: Some(true),
            persistence: Some(true),
        }
    }

    const T0: Now = Now { unix_ms: 1_000_000, uptime: Some(Duration::from_secs(3600)), step: Step::Advance };

    fn run(samples: &[GpuSample], before: &History, now: Now) -> (Vec<Fault>, History) {
        evaluate(samples, before, now, &Policy::default())
    }

    #[test]
    fn a_healthy_hgx_and_a_pcie_card_have_no_faults() {
        let pcie_card = HwSample { nvlinks: None, fabric: None, ..hgx() };
        let (f, _) =
            run(&[gpu(0, hgx()), gpu(1, pcie_card), gpu(2, HwSample::default())], &History::default(), T0);
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn pcie_width_always_and_generation_only_when_busy() {
        let mut hw = hgx();
        hw.pcie = Some(Pcie { r#gen: 5, width: 8, max_gen: 5, max_width: 16 });
        let (f, _) = run(&[gpu(2, hw.clone())], &History::default(), T0);
        assert_eq!(f[0].action, Action::Drain);
        let r = f[0].reason();
        assert_eq!(&r[..20], "gpu: pcie gpu2 x8/16", "{r}");
        hw.pcie = Some(Pcie { r#gen: 3, width: 16, max_gen: 5, max_width: 16 });
        let (f, _) = run(&[gpu(2, hw.clone())], &History::default(), T0);
        assert!(f[0].reason().starts_with("gpu: pcie gpu2 gen3/5"), "{f:?}");
        for idle in [Some(8), None] {
            hw.pstate = idle;
            let (f, _) = run(&[gpu(2, hw.clone())], &History::default(), T0);
            assert!(f.is_empty(), "{idle:?}: {f:?}");
        }
    }

    #[test]
    fn a_down_nvlink_and_growing_errors() {
        let mut hw = hgx();
        hw.nvlinks.as_mut().unwrap()[3].up = false;
        let (f, h) = run(&[gpu(5, hw.clone())], &History::default(), T0);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].reason(), "gpu: nvlink gpu5 l3 down (1 of 18 NVLinks down)");
        assert_eq!(f[0].action, Action::Drain);
        assert_eq!(h.nvlink.len(), 17, "a base for every up link");
        // A GPU with every link down beside healthy ones is a fault; a node
        // with no link up anywhere is a node without NVLink.
        let mut dead = hgx();
        for l in dead.nvlinks.as_mut().unwrap() {
            l.up = false;
        }
        let (f, _) = run(&[gpu(0, hgx()), gpu(1, dead.clone())], &History::default(), T0);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].reason().starts_with("gpu: nvlink gpu1 l0 down (18 of 18"), "{f:?}");
        let (f, _) = run(&[gpu(0, dead.clone()), gpu(1, dead)], &History::default(), T0);
        assert!(f.is_empty(), "{f:?}");
        // Errors: 59 in a minute is under the default 60/min; 61 is over.
        let mut hw = hgx();
        let (_, h) = run(&[gpu(5, hw.clone())], &History::default(), T0);
        let later = Now { unix_ms: T0.unix_ms + 60_000, ..T0 };
        hw.nvlinks.as_mut().unwrap()[7].crc = 59;
        let (f, h2) = run(&[gpu(5, hw.clone())], &h, later);
        assert!(f.is_empty(), "{f:?}");
        hw.nvlinks.as_mut().unwrap()[7].replay = 2;
        let (f, _) = run(&[gpu(5, hw.clone())], &h, later);
        assert_eq!(f[0].reason(), "gpu: nvlink-err gpu5 l7 CRC/replay/recovery errors above 60/min");
        assert_eq!(f[0].action, Action::Warn);
        // The base moves on: the same counters a minute later are no growth.
        let (f, _) = run(&[gpu(5, hw)], &h2, Now { unix_ms: later.unix_ms + 60_000, ..T0 });
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn fabric_failure_or_not_completed_long_after_boot() {
        let mut hw = hgx();
        hw.fabric = Some(Fabric { state: FabricState::Completed, failed: true });
        let (f, _) = run(&[gpu(0, hw.clone())], &History::default(), T0);
        assert!(f[0].reason().starts_with("gpu: fabric gpu0 completed with a failure"), "{f:?}");
        hw.fabric = Some(Fabric { state: FabricState::InProgress, failed: false });
        let early = Now { uptime: Some(Duration::from_secs(60)), ..T0 };
        for (now, faults) in [(early, 0), (T0, 1), (Now { uptime: None, ..T0 }, 0)] {
            let (f, _) = run(&[gpu(0, hw.clone())], &History::default(), now);
            assert_eq!(f.len(), faults, "{now:?}: {f:?}");
        }
        hw.fabric = Some(Fabric { state: FabricState::NotSupported, failed: false });
        assert!(run(&[gpu(0, hw)], &History::default(), T0).0.is_empty());
    }

    #[test]
    fn a_slowdown_counts_in_three_checks_in_a_row() {
        let mut hw = hgx();
        hw.clock_events = Some(0x40 | 0x4);
        let mut h = History::default();
        for n in 1..=4 {
            let (f, next) = run(&[gpu(3, hw.clone())], &h, T0);
            assert_eq!(f.len(), usize::from(n >= 3), "check {n}: {f:?}");
            h = next;
        }
        let (f, _) = run(&[gpu(3, hw.clone())], &h, T0);
        assert_eq!(f[0].reason(), "gpu: slowdown gpu3 hw_thermal_slowdown in 3 checks in a row");
        // One clean check starts the count over.
        hw.clock_events = Some(0x4 | 0x20);
        let (f, h) = run(&[gpu(3, hw.clone())], &h, T0);
        assert!(f.is_empty() && h.slowdown.is_empty(), "sw power cap and sw thermal are not faults");
    }

    #[test]
    fn checks_off_the_poll_clock_never_add_to_a_slowdown_or_move_a_rate_base() {
        let held = Now { step: Step::Hold, ..T0 };
        let mut hw = hgx();
        hw.clock_events = Some(0x40);
        // One poll, then any number of Epilog passes: still one check in a row.
        let (_, mut h) = run(&[gpu(3, hw.clone())], &History::default(), T0);
        for _ in 0..5 {
            let (f, next) = run(&[gpu(3, hw.clone())], &h, held);
            assert!(f.is_empty(), "{f:?}");
            h = next;
        }
        assert_eq!(h.slowdown.get("3"), Some(&1));
        // At the third poll it counts; a pass off the clock then reports it.
        let (_, h) = run(&[gpu(3, hw.clone())], &h, T0);
        let (f, h) = run(&[gpu(3, hw.clone())], &h, T0);
        assert_eq!(f.len(), 1, "{f:?}");
        let (f, h2) = run(&[gpu(3, hw.clone())], &h, held);
        assert_eq!((f.len(), &h2), (1, &h), "{f:?}");
        // A clean check off the clock ends the run (it only delays a drain).
        hw.clock_events = Some(0);
        assert!(run(&[gpu(3, hw)], &h, held).1.slowdown.is_empty());

        // NVLink: the poll's base stays through passes off the clock.
        let mut hw = hgx();
        let (_, h) = run(&[gpu(5, hw.clone())], &History::default(), T0);
        hw.nvlinks.as_mut().unwrap()[7].crc = 30;
        let soon = Now { unix_ms: T0.unix_ms + 20_000, ..held };
        let (f, h2) = run(&[gpu(5, hw.clone())], &h, soon);
        assert_eq!(f.len(), 1, "30 in 20 s is 90/min, over 60: reported: {f:?}");
        assert_eq!(h2.nvlink, h.nvlink, "the base stays the poll's");
        // The next poll measures from the poll's base: 30 in 60 s is 30/min.
        let (f, h3) = run(&[gpu(5, hw)], &h2, Now { unix_ms: T0.unix_ms + 60_000, ..T0 });
        assert!(f.is_empty(), "{f:?}");
        assert_eq!(h3.nvlink["5/7"], (30, T0.unix_ms + 60_000));
    }

    #[test]
    fn ecc_and_persistence_modes() {
        let mut hw = hgx();
        hw.ecc_mode = Some(false);
        hw.persistence = Some(false);
        let (f, _) = run(&[gpu(1, hw)], &History::default(), T0);
        let r: Vec<String> = f.iter().map(Fault::reason).collect();
        assert!(r[0].starts_with("gpu: ecc-off gpu1 ") && r[1].starts_with("gpu: persist gpu1 "), "{r:?}");
        assert!(f.iter().all(|f| f.action == Action::Warn));
    }

    #[test]
    fn every_reason_names_class_and_gpu_within_20_characters() {
        let mut hw = hgx();
        hw.pcie = Some(Pcie { r#gen: 5, width: 8, max_gen: 5, max_width: 16 });
        hw.nvlinks.as_mut().unwrap()[17].up = false;
        hw.fabric = Some(Fabric { state: FabricState::Completed, failed: true });
        hw.clock_events = Some(0x80);
        hw.ecc_mode = Some(false);
        hw.persistence = Some(false);
        let mut h = History::default();
        h.slowdown.insert("7".into(), 2);
        let (f, _) = run(&[gpu(7, hw)], &h, T0);
        assert_eq!(f.len(), 6, "{f:?}");
        for fault in &f {
            let r = fault.reason();
            let head = format!("{} gpu7", fault.class.name());
            assert!(r[..20].contains(&head), "{r}");
            assert!(crate::policy::health::is_agent_reason(&r), "{r}");
        }
    }

    #[test]
    fn status_cells_say_not_supported() {
        let c = cells(&gpu(0, HwSample::default()), &History::default());
        assert_eq!(c, ["n/s"; 6].map(str::to_owned));
        let c = cells(&gpu(0, hgx()), &History::default());
        assert_eq!(c, ["gen5/5 x16/16", "18/18 up", "completed", "ok", "on", "on"].map(str::to_owned));
    }
}
