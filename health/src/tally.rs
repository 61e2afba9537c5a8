//! Per-job GPU use as it runs: each reading of the node's GPUs (the agent's
//! sampler takes them from NVML) added to the jobs that hold each GPU (the
//! plugin's job records, [`task_plan::jobmap`]), pure: readings and records
//! in, summaries ([`crate::usage::NodeUsage`]) out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use task_plan::jobmap::{HeldGpu, JobRecord};

use crate::usage::{GpuUsage, NodeUsage};

/// One GPU or MIG device at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceReading {
    /// NVML's index of the GPU.
    pub gpu: u32,
    /// NVML's index of the MIG device in the GPU.
    pub mig: Option<u32>,
    /// `GPU-…` or `MIG-…`, when NVML answered.
    pub uuid: Option<String>,
    /// Percent of the last sample period a kernel ran (`None`: not reported).
    pub util: Option<u32>,
    /// Memory used, in bytes.
    pub mem_used: Option<u64>,
    /// Memory, in bytes.
    pub mem_total: Option<u64>,
    /// Power drawn, in milliwatts (the whole GPU).
    pub power_mw: Option<u32>,
    /// SM clock, in MHz (the whole GPU).
    pub sm_mhz: Option<u32>,
    /// NVML's energy counter, millijoules since the driver was loaded (the
    /// whole GPU: `None` on a MIG device, which has no counter of its own).
    pub energy_mj: Option<u64>,
    /// Compute processes: pid and memory used (`None`: not reported).
    pub procs: Option<Vec<(u32, u64)>>,
}

/// Every GPU at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reading {
    /// Unix seconds.
    pub at: u64,
    /// Each GPU, and each MIG device of a GPU in MIG mode.
    pub devices: Vec<DeviceReading>,
    /// NVML could not be loaded or could not count the GPUs (why).
    pub error: Option<String>,
    /// How long the reading took.
    pub took: Duration,
}

/// Most jobs summed at once on a node; past it one is taken out, its
/// summary handed back to be reported ([`Tally::add`]), so memory stays
/// bounded whatever the job count and uptime.
pub const MAX_JOBS: usize = 256;
/// Most GPUs and MIG devices per job.
const MAX_DEVICES: usize = 512;
/// More power than any GPU draws (a B200 is rated 1 kW), in watts: an
/// energy counter that advances faster between two readings misread, and
/// that step is not counted.
const MAX_GPU_WATTS: u64 = 5_000;

/// The energy a GPU used while a job held it: the sum of the steps of
/// NVML's energy counter between the job's consecutive readings of it. A
/// reading without the counter (its call failed) adds nothing, and the next
/// one's step spans the gap, the counter being cumulative.
#[derive(Clone, Copy, Debug, Default)]
struct Energy {
    /// The last reading: when (Unix seconds) and the counter (mJ).
    last: Option<(u64, u64)>,
    /// The steps so far, mJ.
    sum_mj: u64,
    /// Steps taken (two readings or more: the energy is known).
    steps: u64,
}

impl Energy {
    fn add(&mut self, at: u64, counter_mj: u64) {
        if let Some((then, before)) = self.last {
            self.steps += 1;
            self.sum_mj =
                self.sum_mj.saturating_add(energy_step(before, counter_mj, at.saturating_sub(then)));
        }
        self.last = Some((at, counter_mj));
    }

    /// Joules, once two readings were taken.
    fn joules(&self) -> Option<u64> {
        (self.steps > 0).then(|| self.sum_mj.saturating_add(500) / 1000)
    }
}

/// The energy (mJ) a GPU used between two readings of its counter `secs`
/// apart. The counter counts from the driver's load: one lower than before
/// was reloaded in between (a GPU reset, a driver upgrade), and what it
/// reads now is what the GPU used since, a lower bound. A step beyond
/// [`MAX_GPU_WATTS`] is a misreading: 0.
fn energy_step(before_mj: u64, now_mj: u64, secs: u64) -> u64 {
    let step = now_mj.checked_sub(before_mj).unwrap_or(now_mj);
    let most = MAX_GPU_WATTS.saturating_mul(1000).saturating_mul(secs.saturating_add(2));
    if step > most { 0 } else { step }
}

/// One device of one job.
#[derive(Clone, Debug, Default)]
struct DeviceTally {
    uuid: String,
    util_sum: u64,
    util_n: u64,
    util_max: Option<u32>,
    mem_max: u64,
    mem_total: u64,
    idle: u64,
    samples: u64,
    procs_max: u32,
    shared: bool,
    /// The last reading's figures, for the metrics.
    last_util: Option<u32>,
    last_mem: Option<u64>,
    energy: Energy,
}

/// One job on this node.
#[derive(Clone, Debug, Default)]
struct JobTally {
    from: u64,
    to: u64,
    /// Readings in a row in which every device of the job was idle.
    idle_run: u64,
    longest_idle_run: u64,
    devices: BTreeMap<(u32, Option<u32>), DeviceTally>,
}

/// The summaries of the jobs on this node.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// The node's Slurm name.
    pub node: String,
    /// Seconds between readings.
    pub interval_s: u64,
    jobs: BTreeMap<u32, JobTally>,
}

fn idle(d: &DeviceReading) -> Option<bool> {
    match (d.util, &d.procs) {
        (Some(u), _) => Some(u == 0),
        (None, Some(p)) => Some(p.is_empty()),
        (None, None) => None,
    }
}

fn find<'a>(reading: &'a Reading, g: &HeldGpu) -> Option<&'a DeviceReading> {
    if !g.uuid.is_empty() {
        if let Some(d) = reading.devices.iter().find(|d| d.uuid.as_deref() == Some(g.uuid.as_str())) {
            return Some(d);
        }
    }
    reading.devices.iter().find(|d| d.gpu == g.nvml && d.mig == g.mig)
}

impl Tally {
    /// An empty tally for `node`, readings `interval_s` apart.
    pub fn new(node: &str, interval_s: u64) -> Tally {
        Tally { node: node.to_owned(), interval_s: interval_s.max(1), jobs: BTreeMap::new() }
    }

    /// Jobs being summed.
    pub fn jobs(&self) -> impl Iterator<Item = u32> + '_ {
        self.jobs.keys().copied()
    }

    /// Adds a reading to the jobs the records say hold each device. A job
    /// seen for the first time starts its summary; past [`MAX_JOBS`] one is
    /// taken out to make room ([`Tally::evict`]): its final summary is
    /// returned, to be reported as an ended job's.
    pub fn add(&mut self, reading: &Reading, records: &[JobRecord]) -> Vec<(u32, NodeUsage)> {
        let mut holders: BTreeMap<(u32, Option<u32>), u32> = BTreeMap::new();
        for r in records {
            for g in &r.gpus {
                *holders.entry((g.nvml, g.mig)).or_default() += 1;
            }
        }
        let held: BTreeSet<u32> = records.iter().map(|r| r.job).collect();
        let mut dropped = Vec::new();
        for r in records {
            if !self.jobs.contains_key(&r.job) && self.jobs.len() >= MAX_JOBS {
                dropped.extend(self.evict(&held));
            }
            let job = self
                .jobs
                .entry(r.job)
                .or_insert_with(|| JobTally { from: reading.at, ..JobTally::default() });
            job.to = reading.at;
            let mut all_idle = !r.gpus.is_empty();
            for g in r.gpus.iter().take(MAX_DEVICES) {
                let t = job.devices.entry((g.nvml, g.mig)).or_default();
                if t.uuid.is_empty() {
                    t.uuid.clone_from(&g.uuid);
                }
                t.shared |= holders.get(&(g.nvml, g.mig)).copied().unwrap_or(0) > 1;
                let Some(d) = find(reading, g) else {
                    all_idle = false;
                    continue;
                };
                if t.uuid.is_empty() {
                    t.uuid = d.uuid.clone().unwrap_or_default();
                }
                t.samples += 1;
                if let Some(u) = d.util {
                    t.util_sum += u64::from(u);
                    t.util_n += 1;
                    t.util_max = Some(t.util_max.map_or(u, |m| m.max(u)));
                }
                if let Some(m) = d.mem_used {
                    t.mem_max = t.mem_max.max(m);
                }
                if let Some(m) = d.mem_total {
                    t.mem_total = m;
                }
                if let Some(p) = &d.procs {
                    t.procs_max = t.procs_max.max(u32::try_from(p.len()).unwrap_or(u32::MAX));
                }
                t.last_util = d.util;
                t.last_mem = d.mem_used;
                if let Some(mj) = d.energy_mj {
                    t.energy.add(reading.at, mj);
                }
                match idle(d) {
                    Some(true) => t.idle += 1,
                    Some(false) => all_idle = false,
                    None => all_idle = false,
                }
            }
            if all_idle {
                job.idle_run += 1;
                job.longest_idle_run = job.longest_idle_run.max(job.idle_run);
            } else {
                job.idle_run = 0;
            }
        }
        dropped
    }

    /// Takes out one job to make room: the earliest begun of those not in
    /// `held` (the jobs of this reading's records: one not there has ended,
    /// or waits past the records' cap), else the earliest begun of all (more
    /// jobs hold records than the tally sums: its caller keeps no more than
    /// [`MAX_JOBS`] records, so this does not happen); its final summary.
    fn evict(&mut self, held: &BTreeSet<u32>) -> Option<(u32, NodeUsage)> {
        let earliest = |only_gone: bool| {
            self.jobs
                .iter()
                .filter(|(k, _)| !only_gone || !held.contains(k))
                .min_by_key(|(k, j)| (j.from, **k))
                .map(|(k, _)| *k)
        };
        let job = earliest(true).or_else(|| earliest(false))?;
        let usage = self.summary(job);
        self.jobs.remove(&job);
        usage.map(|u| (job, u))
    }

    /// Starts the summary of a job that has no reading yet (its record just
    /// appeared), so a job shorter than the interval still has one.
    pub fn open(&mut self, record: &JobRecord, now: u64) {
        if self.jobs.contains_key(&record.job) || self.jobs.len() >= MAX_JOBS {
            return;
        }
        let mut job = JobTally { from: now, to: now, ..JobTally::default() };
        for g in record.gpus.iter().take(MAX_DEVICES) {
            job.devices
                .insert((g.nvml, g.mig), DeviceTally { uuid: g.uuid.clone(), ..DeviceTally::default() });
        }
        self.jobs.insert(record.job, job);
    }

    /// Job `job`'s summary on this node so far.
    pub fn summary(&self, job: u32) -> Option<NodeUsage> {
        let j = self.jobs.get(&job)?;
        let gpus = j
            .devices
            .iter()
            .map(|((gpu, mig), t)| GpuUsage {
                gpu: *gpu,
                mig: *mig,
                uuid: t.uuid.clone(),
                util_mean: (t.util_n > 0).then(|| mean(t.util_sum, t.util_n)),
                util_max: t.util_max,
                mem_max_bytes: t.mem_max,
                mem_total_bytes: t.mem_total,
                idle_samples: t.idle,
                samples: t.samples,
                procs_max: t.procs_max,
                shared: t.shared,
                energy_j: t.energy.joules(),
            })
            .collect();
        Some(NodeUsage {
            node: self.node.clone(),
            interval_s: self.interval_s,
            from: j.from,
            to: j.to,
            longest_idle_s: j.longest_idle_run * self.interval_s,
            gpus,
        })
    }

    /// Takes out the jobs whose records are gone (their epilog ran): their
    /// final summaries.
    pub fn ended(&mut self, live: &BTreeSet<u32>) -> Vec<(u32, NodeUsage)> {
        let gone: Vec<u32> = self.jobs.keys().copied().filter(|j| !live.contains(j)).collect();
        let mut out = Vec::new();
        for j in gone {
            if let Some(u) = self.summary(j) {
                out.push((j, u));
            }
            self.jobs.remove(&j);
        }
        out
    }

    /// The metrics' rows: per job and device, the last utilization and
    /// memory used, and the seconds at 0 %.
    pub fn metric_rows(&self) -> Vec<JobDeviceRow> {
        let mut rows = Vec::new();
        for (job, j) in &self.jobs {
            for ((gpu, mig), t) in &j.devices {
                rows.push(JobDeviceRow {
                    job: *job,
                    gpu: mig.map_or_else(|| gpu.to_string(), |m| format!("{gpu}.{m}")),
                    uuid: t.uuid.clone(),
                    util: t.last_util,
                    mem_used: t.last_mem,
                    idle_s: t.idle * self.interval_s,
                });
            }
        }
        rows
    }
}

/// One job's device in the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobDeviceRow {
    /// The job id.
    pub job: u32,
    /// `3`, or `5.1` for a MIG device.
    pub gpu: String,
    /// Its UUID.
    pub uuid: String,
    /// Last utilization, percent.
    pub util: Option<u32>,
    /// Last memory used, bytes.
    pub mem_used: Option<u64>,
    /// Seconds at 0 % so far.
    pub idle_s: u64,
}

#[allow(clippy::cast_precision_loss)]
fn mean(sum: u64, n: u64) -> f64 {
    (sum as f64 / n as f64 * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(gpu: u32, util: Option<u32>, procs: usize) -> DeviceReading {
        DeviceReading {
            gpu,
            mig: None,
            uuid: Some(format!("GPU-{gpu}")),
            util,
            mem_used: Some(u64::from(util.unwrap_or(0)) << 20),
            mem_total: Some(80 << 30),
            power_mw: None,
            sm_mhz: None,
            energy_mj: None,
            procs: Some(vec![(100, 1 << 20); procs]),
        }
    }

    fn held(gpu: u32) -> HeldGpu {
        HeldGpu { nvml: gpu, mig: None, uuid: format!("GPU-{gpu}") }
    }

    fn reading(at: u64, busy: &[u32], n: u32) -> Reading {
        Reading {
            at,
            devices: (0..n)
                .map(|g| if busy.contains(&g) { dev(g, Some(95), 1) } else { dev(g, Some(0), 0) })
                .collect(),
            ..Reading::default()
        }
    }

    #[test]
    fn eight_gpus_half_busy() {
        let mut t = Tally::new("node1", 10);
        let rec = JobRecord { job: 7, uid: 1000, gpus: (0..8).map(held).collect() };
        t.open(&rec, 100);
        for at in [100, 110, 120] {
            t.add(&reading(at, &[0, 1, 2, 3], 8), std::slice::from_ref(&rec));
        }
        let u = t.summary(7).unwrap_or_default();
        assert_eq!(u.gpus.len(), 8);
        assert_eq!(u.gpus[0].util_mean, Some(95.0));
        assert_eq!(u.gpus[7].util_mean, Some(0.0));
        assert!(u.gpus[7].never_used() && !u.gpus[3].never_used());
        assert_eq!((u.from, u.to, u.gpus[0].samples), (100, 120, 3));
        assert_eq!(u.longest_idle_s, 0, "not every GPU was idle");
        let ended = t.ended(&BTreeSet::new());
        assert_eq!(ended.len(), 1);
        assert_eq!(t.jobs().count(), 0);
    }

    #[test]
    fn two_jobs_on_one_node_and_a_shared_gpu() {
        let mut t = Tally::new("node1", 10);
        let a = JobRecord { job: 1, uid: 1, gpus: vec![held(0), held(1)] };
        let b = JobRecord { job: 2, uid: 2, gpus: vec![held(1), held(2)] };
        t.add(&reading(10, &[0], 4), &[a, b]);
        let ua = t.summary(1).unwrap_or_default();
        let ub = t.summary(2).unwrap_or_default();
        assert_eq!(ua.gpus.iter().map(|g| g.gpu).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(ub.gpus.iter().map(|g| g.gpu).collect::<Vec<_>>(), vec![1, 2]);
        assert!(!ua.gpus[0].shared && ua.gpus[1].shared && ub.gpus[0].shared && !ub.gpus[1].shared);
        // Job 2 was idle on both of its GPUs.
        assert_eq!(ub.longest_idle_s, 10);
        assert_eq!(ua.longest_idle_s, 0);
        assert_eq!(t.metric_rows().len(), 4);
    }

    #[test]
    fn mig_devices_are_attributed_by_uuid_and_idle_by_processes() {
        let mut t = Tally::new("node1", 10);
        let mig = |m: u32, procs: usize| DeviceReading {
            gpu: 5,
            mig: Some(m),
            uuid: Some(format!("MIG-{m}")),
            util: None,
            mem_used: Some(1 << 30),
            mem_total: Some(10 << 30),
            procs: Some(vec![(1, 1); procs]),
            ..DeviceReading::default()
        };
        let r = Reading { at: 5, devices: vec![mig(0, 1), mig(1, 0)], ..Reading::default() };
        // The record's MIG number may differ from NVML's: the UUID decides.
        let a =
            JobRecord { job: 1, uid: 1, gpus: vec![HeldGpu { nvml: 5, mig: Some(1), uuid: "MIG-0".into() }] };
        let b =
            JobRecord { job: 2, uid: 1, gpus: vec![HeldGpu { nvml: 5, mig: Some(0), uuid: "MIG-1".into() }] };
        t.add(&r, &[a, b]);
        let ua = t.summary(1).unwrap_or_default();
        let ub = t.summary(2).unwrap_or_default();
        assert_eq!((ua.gpus[0].procs_max, ua.gpus[0].idle_samples, ua.gpus[0].util_mean), (1, 0, None));
        assert_eq!((ub.gpus[0].procs_max, ub.gpus[0].idle_samples), (0, 1));
        assert!(ub.gpus[0].never_used());
    }

    #[test]
    fn the_job_count_is_bounded() {
        let mut t = Tally::new("node1", 10);
        let mut dropped = Vec::new();
        for job in 1..=(u32::try_from(MAX_JOBS).unwrap_or(0) + 5) {
            let rec = JobRecord { job, uid: 1, gpus: vec![held(0)] };
            dropped.extend(t.add(&reading(u64::from(job), &[], 1), &[rec]).into_iter().map(|(j, _)| j));
        }
        assert_eq!(t.jobs().count(), MAX_JOBS);
        assert_eq!(dropped, vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn past_the_cap_a_job_whose_record_is_gone_makes_room_and_its_summary_comes_back() {
        let cap = u32::try_from(MAX_JOBS).unwrap_or(0);
        let mut t = Tally::new("node1", 10);
        let recs: Vec<JobRecord> =
            (1..=cap).map(|job| JobRecord { job, uid: 1, gpus: vec![held(job % 8)] }).collect();
        for (at, r) in (1u64..).zip(&recs) {
            t.add(&reading(at, &[], 8), std::slice::from_ref(r));
        }
        // Every job read again at 1000: each has a summary with samples.
        t.add(&reading(1000, &[], 8), &recs);
        assert_eq!(t.jobs().count(), MAX_JOBS);
        // Job 100's record is gone, a new job's appears: job 100 makes room,
        // not job 1 (begun first, its record still there).
        let mut now: Vec<JobRecord> = recs.iter().filter(|r| r.job != 100).cloned().collect();
        now.push(JobRecord { job: 5000, uid: 1, gpus: vec![held(0)] });
        let out = t.add(&reading(1010, &[], 8), &now);
        assert_eq!(out.iter().map(|(j, _)| *j).collect::<Vec<_>>(), vec![100]);
        assert_eq!((out[0].1.from, out[0].1.to, out[0].1.gpus[0].samples), (100, 1000, 2));
        assert!(t.jobs().any(|j| j == 1) && t.jobs().any(|j| j == 5000) && !t.jobs().any(|j| j == 100));
        // More jobs with records than the tally sums: the earliest begun
        // makes room, and its summary is still handed back.
        now.push(JobRecord { job: 5001, uid: 1, gpus: vec![held(0)] });
        let out = t.add(&reading(1020, &[], 8), &now);
        assert_eq!(out.iter().map(|(j, _)| *j).collect::<Vec<_>>(), vec![1]);
        assert_eq!(out[0].1.gpus[0].samples, 4, "its readings up to now, this one too");
        assert_eq!(t.jobs().count(), MAX_JOBS);
    }

    #[test]
    fn a_device_missing_from_a_reading_counts_no_sample() {
        let mut t = Tally::new("node1", 10);
        let rec = JobRecord { job: 3, uid: 1, gpus: vec![held(0), held(9)] };
        t.add(&reading(1, &[], 1), std::slice::from_ref(&rec));
        let u = t.summary(3).unwrap_or_default();
        assert_eq!(u.gpus[0].samples, 1);
        assert_eq!(u.gpus[1].samples, 0);
        assert_eq!(u.longest_idle_s, 0);
    }

    /// A reading at `at` of GPUs 0..n, busy, with these energy counters.
    fn energy_reading(at: u64, counters: &[Option<u64>]) -> Reading {
        let devices = (0u32..)
            .zip(counters)
            .map(|(g, mj)| DeviceReading { energy_mj: *mj, ..dev(g, Some(90), 1) })
            .collect();
        Reading { at, devices, ..Reading::default() }
    }

    fn energies(t: &Tally, job: u32) -> Vec<Option<u64>> {
        t.summary(job).unwrap_or_default().gpus.iter().map(|g| g.energy_j).collect()
    }

    #[test]
    fn energy_is_the_counters_steps_while_the_job_held_the_gpu() {
        let mut t = Tally::new("node1", 10);
        let rec = JobRecord { job: 5, uid: 1, gpus: vec![held(0), held(1), held(2)] };
        t.open(&rec, 100);
        // GPU 0 at 300 W; GPU 1's energy call fails every time (or it predates
        // Volta); GPU 2's fails once, and the next step spans the gap.
        let steps = [
            (100, [Some(1_000_000), None, Some(50_000_000)]),
            (110, [Some(4_000_000), None, None]),
            (120, [Some(7_000_000), None, Some(56_000_000)]),
        ];
        for (at, counters) in steps {
            t.add(&energy_reading(at, &counters), std::slice::from_ref(&rec));
            if at == 100 {
                assert_eq!(energies(&t, 5), [None, None, None], "one reading: no energy yet");
            }
        }
        assert_eq!(energies(&t, 5), [Some(6_000), None, Some(6_000)]);
        // Nothing else lost on the GPU without energy.
        let u = t.summary(5).unwrap_or_default();
        assert_eq!((u.gpus[1].samples, u.gpus[1].util_mean), (3, Some(90.0)));
        // The summary's word carries it, and it reads back.
        let back = crate::usage::NodeUsage::parse_word(&u.to_word()).unwrap_or_default();
        assert_eq!(back.gpus.iter().map(|g| g.energy_j).collect::<Vec<_>>(), energies(&t, 5));
    }

    #[test]
    fn a_counter_that_goes_back_was_reloaded_and_a_wild_step_is_not_counted() {
        let mut t = Tally::new("node1", 10);
        let rec = JobRecord { job: 6, uid: 1, gpus: vec![held(0)] };
        // 3 kJ, then the driver reloaded (0.5 kJ since), then 3 kJ.
        for (at, mj) in [(10, 10_000_000), (20, 13_000_000), (30, 500_000), (40, 3_500_000)] {
            t.add(&energy_reading(at, &[Some(mj)]), std::slice::from_ref(&rec));
        }
        assert_eq!(energies(&t, 6), [Some(6_500)]);
        // A counter that jumps by more than any GPU draws in 10 s is a misreading.
        t.add(&energy_reading(50, &[Some(1 << 50)]), std::slice::from_ref(&rec));
        t.add(&energy_reading(60, &[Some((1 << 50) + 2_000_000)]), std::slice::from_ref(&rec));
        assert_eq!(energies(&t, 6), [Some(8_500)]);
        assert_eq!(energy_step(0, 5_000 * 1000 * 12, 10), 60_000_000, "5 kW for 12 s: counted");
        assert_eq!(energy_step(0, 5_000 * 1000 * 12 + 1, 10), 0);
        assert_eq!(energy_step(u64::MAX, 7, 10), 7, "reloaded: what it counted since");
    }

    #[test]
    fn a_shared_gpus_energy_is_the_whole_gpus_and_a_mig_device_has_none() {
        let mut t = Tally::new("node1", 10);
        let a = JobRecord { job: 1, uid: 1, gpus: vec![held(0)] };
        let b = JobRecord { job: 2, uid: 2, gpus: vec![held(0)] };
        for (at, mj) in [(10, 0), (20, 2_000_000)] {
            t.add(&energy_reading(at, &[Some(mj)]), &[a.clone(), b.clone()]);
        }
        for job in [1, 2] {
            let u = t.summary(job).unwrap_or_default();
            assert_eq!((u.gpus[0].energy_j, u.gpus[0].shared), (Some(2_000), true), "job {job}");
        }
        // A MIG device reads no counter (NVML's is the whole GPU's).
        let mig =
            DeviceReading { gpu: 3, mig: Some(0), uuid: Some("MIG-a".into()), ..DeviceReading::default() };
        let whole = DeviceReading { gpu: 3, energy_mj: Some(9), ..DeviceReading::default() };
        let c =
            JobRecord { job: 3, uid: 1, gpus: vec![HeldGpu { nvml: 3, mig: Some(0), uuid: "MIG-a".into() }] };
        for at in [10, 20] {
            let r = Reading { at, devices: vec![whole.clone(), mig.clone()], ..Reading::default() };
            t.add(&r, std::slice::from_ref(&c));
        }
        assert_eq!(energies(&t, 3), [None]);
    }
}
