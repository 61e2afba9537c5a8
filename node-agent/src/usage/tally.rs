//! The running summaries: each reading added to the jobs that hold each
//! GPU, pure (readings and records in, summaries out).

use std::collections::{BTreeMap, BTreeSet};

use gpu_health::usage::{GpuUsage, NodeUsage};
use task_plan::jobmap::{HeldGpu, JobRecord};

use crate::sources::nvml::usage::{DeviceReading, Reading};

/// Most jobs summed at once on a node; past it the oldest is dropped (a
/// record its epilog never removed), so memory stays bounded whatever the
/// job count and uptime.
pub const MAX_JOBS: usize = 256;
/// Most GPUs and MIG devices per job.
const MAX_DEVICES: usize = 512;

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
    /// seen for the first time starts its summary; past [`MAX_JOBS`] the
    /// oldest is dropped (its id is returned).
    pub fn add(&mut self, reading: &Reading, records: &[JobRecord]) -> Vec<u32> {
        let mut holders: BTreeMap<(u32, Option<u32>), u32> = BTreeMap::new();
        for r in records {
            for g in &r.gpus {
                *holders.entry((g.nvml, g.mig)).or_default() += 1;
            }
        }
        let mut dropped = Vec::new();
        for r in records {
            if !self.jobs.contains_key(&r.job) && self.jobs.len() >= MAX_JOBS {
                let oldest = self.jobs.iter().min_by_key(|(_, j)| j.from).map(|(k, _)| *k);
                if let Some(k) = oldest {
                    self.jobs.remove(&k);
                    dropped.push(k);
                }
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
            dropped.extend(t.add(&reading(u64::from(job), &[], 1), &[rec]));
        }
        assert_eq!(t.jobs().count(), MAX_JOBS);
        assert_eq!(dropped, vec![1, 2, 3, 4, 5]);
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
}
