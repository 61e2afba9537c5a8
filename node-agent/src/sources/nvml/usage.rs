//! What each GPU is doing, for the jobs that hold it: utilization, memory,
//! power, the energy counter, the SM clock and the compute processes, read
//! every `usage_interval` on a thread of its own.
//!
//! The health checks never wait for these calls: the sampler has its own NVML
//! thread and hands readings to the daemon's loop over a channel, which the
//! loop only empties. A call that hangs holds only this thread; the loop sees
//! no reading for a while, says so once, and `source_up{source="nvml_usage"}`
//! turns 0. A call that fails leaves its figure out of the reading (a GPU
//! whose utilization NVML does not report, as on MIG devices, reads as
//! `None`; so does the energy of a GPU before Volta, or of one whose energy
//! call fails, the other figures of the reading kept).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::thread;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml};

use super::load;
use crate::time::now_unix;

/// NVML's `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLED: u32 = 1;

pub use gpu_health::tally::{DeviceReading, Reading};

fn device_reading(gpu: u32, mig: Option<u32>, d: &Device<'_>, whole: bool) -> DeviceReading {
    let procs = d.running_compute_processes().ok().map(|ps| {
        ps.into_iter()
            .map(|p| {
                let mem = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b,
                    UsedGpuMemory::Unavailable => 0,
                };
                (p.pid, mem)
            })
            .collect()
    });
    let mem = d.memory_info().ok();
    DeviceReading {
        gpu,
        mig,
        uuid: d.uuid().ok(),
        // NVML does not report a MIG device's utilization, nor that of a GPU
        // in MIG mode (NOT_SUPPORTED): it is asked only of whole GPUs.
        util: if whole { d.utilization_rates().ok().map(|u| u.gpu.min(100)) } else { None },
        mem_used: mem.as_ref().map(|m| m.used),
        mem_total: mem.as_ref().map(|m| m.total),
        power_mw: if mig.is_none() { d.power_usage().ok() } else { None },
        sm_mhz: if mig.is_none() { d.clock_info(Clock::SM).ok() } else { None },
        // Volta and later; NOT_SUPPORTED on older GPUs and on MIG devices.
        energy_mj: if mig.is_none() { d.total_energy_consumption().ok() } else { None },
        procs,
    }
}

/// Reads every GPU (and MIG device) once.
pub fn read_all(nvml: &Nvml) -> Reading {
    let started = Instant::now();
    let mut out = Reading { at: now_unix(), ..Reading::default() };
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => {
            out.error = Some(format!("device count: {e}"));
            return out;
        }
    };
    for gpu in 0..count {
        let Ok(d) = nvml.device_by_index(gpu) else { continue };
        let mig_on = d.mig_mode().is_ok_and(|m| m.current == MIG_ENABLED);
        if !mig_on {
            out.devices.push(device_reading(gpu, None, &d, true));
            continue;
        }
        // The GPU's own power, energy and clock, then each MIG device.
        let mut whole = device_reading(gpu, None, &d, false);
        whole.procs = None;
        whole.mem_used = None;
        out.devices.push(whole);
        let n = d.mig_device_count().unwrap_or(0);
        for m in 0..n {
            if let Ok(md) = d.mig_device_by_index(m) {
                out.devices.push(device_reading(gpu, Some(m), &md, false));
            }
        }
    }
    out.took = started.elapsed();
    out
}

/// Starts the sampler: a reading every `interval` sent to `tx` (dropped when
/// the loop has not taken the last ones), until `stop` is set.
///
/// # Errors
/// The thread cannot be started.
pub fn spawn(
    lib: PathBuf,
    interval: Duration,
    tx: SyncSender<Reading>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    thread::Builder::new().name("nvml-usage".to_owned()).spawn(move || {
        let mut nvml: Option<Nvml> = None;
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now < next {
                thread::sleep((next - now).min(Duration::from_millis(200)));
                continue;
            }
            next = now + interval;
            if nvml.is_none() {
                match load(&lib) {
                    Ok(n) => nvml = Some(n),
                    Err(e) => {
                        let r = Reading { at: now_unix(), error: Some(e.to_string()), ..Reading::default() };
                        let _ = tx.try_send(r);
                        continue;
                    }
                }
            }
            if let Some(n) = &nvml {
                let _ = tx.try_send(read_all(n));
            }
        }
    })?;
    Ok(())
}
