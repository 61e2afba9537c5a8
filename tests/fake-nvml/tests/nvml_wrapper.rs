//! The fake library driven through nvml-wrapper's own loading path, the way
//! the node agent uses NVML.
//!
//! NVML's state is per process and `FAKE_NVML_STATE` is read at `nvmlInit`,
//! so each test runs its body in a child process of this test binary, with
//! its own state file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;

const CHILD_ENV: &str = "FAKE_NVML_TEST_CHILD";

/// The fake as cargo built it for this test run: beside this test binary in
/// `target/<profile>/deps/`.
fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.with_file_name("libfake_nvml.so")
}

fn ready_state(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("states").join(format!("{name}.json"));
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn init() -> Result<Nvml, NvmlError> {
    let lib = fake_library();
    Nvml::builder().lib_path(lib.as_os_str()).init()
}

/// Writes a state file atomically, as tests and the demo should.
fn write_state(path: &Path, json: &str) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, json).unwrap();
    fs::rename(&tmp, path).unwrap();
}

/// Runs `body` in a child process whose `FAKE_NVML_STATE` names a file
/// holding `state` (or nothing at all when `state` is `None`). Returns the
/// child's stderr.
fn isolated(name: &str, state: Option<&str>, body: fn(&Path)) -> String {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        let path = std::env::var_os("FAKE_NVML_STATE").map(PathBuf::from).unwrap_or_default();
        body(&path);
        // The child's work is done; the parent's checks after this call are not its business.
        std::process::exit(0);
    }
    assert!(fake_library().is_file(), "{} not built", fake_library().display());
    let dir = std::env::temp_dir().join(format!("fake-nvml-{name}-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"]).env(CHILD_ENV, name);
    match state {
        Some(json) => {
            write_state(&path, json);
            cmd.env("FAKE_NVML_STATE", &path);
        }
        None => {
            cmd.env_remove("FAKE_NVML_STATE");
        }
    }
    let out = cmd.output().unwrap();
    let _ = fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "child for {name} failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

#[test]
fn counts_and_finds_devices_by_index_uuid_and_bus_id() {
    isolated(
        "counts_and_finds_devices_by_index_uuid_and_bus_id",
        Some(&ready_state("h100x8-healthy")),
        |_| {
            let nvml = init().unwrap();
            assert_eq!(nvml.sys_driver_version().unwrap(), "580.95.05");
            assert_eq!(nvml.device_count().unwrap(), 8);

            let d3 = nvml.device_by_index(3).unwrap();
            assert_eq!(d3.name().unwrap(), "NVIDIA H100 80GB HBM3");
            assert_eq!(d3.minor_number().unwrap(), 3);
            assert_eq!(d3.index().unwrap(), 3);
            let uuid = d3.uuid().unwrap();
            assert_eq!(nvml.device_by_uuid(uuid.as_str()).unwrap().index().unwrap(), 3);

            let pci = d3.pci_info().unwrap();
            assert_eq!(pci.bus_id, "00000000:61:00.0");
            assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x61, 0));
            for form in ["00000000:61:00.0", "0000:61:00.0", "61:00.0"] {
                assert_eq!(nvml.device_by_pci_bus_id(form).unwrap().index().unwrap(), 3, "{form}");
            }
            assert!(matches!(nvml.device_by_pci_bus_id("0000:62:00.0"), Err(NvmlError::NotFound)));
            assert!(matches!(nvml.device_by_uuid("GPU-nope"), Err(NvmlError::NotFound)));
            assert!(nvml.device_by_index(8).is_err());
        },
    );
}

#[test]
fn answers_cpu_affinity_and_numa_queries() {
    isolated("answers_cpu_affinity_and_numa_queries", Some(&ready_state("h100x8-healthy")), |_| {
        let nvml = init().unwrap();
        let d5 = nvml.device_by_index(5).unwrap();
        let words: Vec<u64> = d5.cpu_affinity(4).unwrap();
        assert_eq!(slurm_formats::cpuset::CpuSet::from_words(&words).to_string(), "56-111,168-223");
        assert_eq!(d5.numa_node_id().unwrap(), 1);
        let d0 = nvml.device_by_index(0).unwrap();
        assert_eq!(d0.numa_node_id().unwrap(), 0);
    });
}

#[test]
fn reports_ecc_counters() {
    isolated("reports_ecc_counters", Some(&ready_state("h100x8-ecc-uncorrectable-gpu2")), |_| {
        let nvml = init().unwrap();
        let count = |i: u32, e: MemoryError, c: EccCounter| {
            nvml.device_by_index(i).unwrap().total_ecc_errors(e, c).unwrap()
        };
        assert_eq!(count(2, MemoryError::Uncorrected, EccCounter::Volatile), 2);
        assert_eq!(count(2, MemoryError::Uncorrected, EccCounter::Aggregate), 2);
        assert_eq!(count(2, MemoryError::Corrected, EccCounter::Volatile), 0);
        assert_eq!(count(0, MemoryError::Uncorrected, EccCounter::Volatile), 0);
    });
}

#[test]
fn reports_remapped_rows_as_field_values() {
    isolated(
        "reports_remapped_rows_as_field_values",
        Some(&ready_state("h100x8-remap-pending-gpu5")),
        |_| {
            let nvml = init().unwrap();
            // NVML_FI_DEV_REMAPPED_COR/UNC/PENDING/FAILURE and the recovery action.
            let ids = [FieldId(142), FieldId(143), FieldId(144), FieldId(145), FieldId(230)];
            let values = |i: u32| -> Vec<Option<u32>> {
                let samples = nvml.device_by_index(i).unwrap().field_values_for(&ids).unwrap();
                samples
                    .into_iter()
                    .map(|s| match s.unwrap().value {
                        Ok(SampleValue::U32(v)) => Some(v),
                        _ => None,
                    })
                    .collect()
            };
            assert_eq!(values(5), vec![Some(0), Some(1), Some(1), Some(0), None]);
            assert_eq!(values(4), vec![Some(0), Some(0), Some(0), Some(0), None]);
        },
    );
}

#[test]
fn a_lost_gpu_answers_gpu_is_lost_and_the_others_work() {
    let mut state: serde_json::Value = serde_json::from_str(&ready_state("h100x8-healthy")).unwrap();
    state["gpus"][1]["lost"] = true.into();
    state["gpus"][2]["recovery_action"] = "drain_and_reset".into();
    isolated("a_lost_gpu_answers_gpu_is_lost_and_the_others_work", Some(&state.to_string()), |_| {
        let nvml = init().unwrap();
        assert_eq!(nvml.device_count().unwrap(), 8);
        assert!(matches!(nvml.device_by_index(1), Err(NvmlError::GpuLost)));
        let d2 = nvml.device_by_index(2).unwrap();
        let action = d2.field_values_for(&[FieldId(230)]).unwrap().remove(0).unwrap().value;
        assert!(matches!(action, Ok(SampleValue::U32(4))), "{action:?}");
    });
}

#[test]
fn init_fails_with_the_error_the_state_names() {
    let state = r#"{"init_error": "DRIVER_NOT_LOADED", "gpus": []}"#;
    isolated("init_fails_with_the_error_the_state_names", Some(state), |_| {
        assert!(matches!(init(), Err(NvmlError::DriverNotLoaded)));
    });
}

#[test]
fn a_malformed_state_file_fails_init_with_a_clear_message() {
    let stderr =
        isolated("a_malformed_state_file_fails_init_with_a_clear_message", Some("{ \"gpus\": [ "), |_| {
            assert!(matches!(init(), Err(NvmlError::Unknown)));
        });
    assert!(
        stderr.contains("fake-nvml: cannot load the state file:") && stderr.contains("line 1"),
        "{stderr}"
    );
}

#[test]
fn no_state_file_fails_init_with_a_clear_message() {
    let stderr = isolated("no_state_file_fails_init_with_a_clear_message", None, |_| {
        assert!(init().is_err());
    });
    assert!(stderr.contains("FAKE_NVML_STATE is not set"), "{stderr}");
}

#[test]
fn a_hanging_gpu_delays_every_call_on_it_only() {
    let mut state: serde_json::Value = serde_json::from_str(&ready_state("h100x8-healthy")).unwrap();
    state["gpus"][0]["hang_ms"] = 300.into();
    isolated("a_hanging_gpu_delays_every_call_on_it_only", Some(&state.to_string()), |_| {
        let nvml = init().unwrap();
        let t = Instant::now();
        let d1 = nvml.device_by_index(1).unwrap();
        d1.uuid().unwrap();
        assert!(t.elapsed() < Duration::from_millis(250), "healthy GPU slow: {:?}", t.elapsed());
        let t = Instant::now();
        let d0 = nvml.device_by_index(0).unwrap();
        d0.uuid().unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(600),
            "two calls on the hanging GPU took {:?}",
            t.elapsed()
        );
    });
}

#[test]
fn the_state_file_is_reread_when_it_changes() {
    isolated("the_state_file_is_reread_when_it_changes", Some(&ready_state("h100x8-healthy")), |path| {
        let nvml = init().unwrap();
        let device = nvml.device_by_index(2).unwrap();
        assert_eq!(device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).unwrap(), 0);
        write_state(path, &ready_state("h100x8-ecc-uncorrectable-gpu2"));
        assert_eq!(device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).unwrap(), 2);
    });
}

#[test]
fn an_xid_appended_while_a_thread_waits_is_delivered_once_to_each_set() {
    let stderr = isolated(
        "an_xid_appended_while_a_thread_waits_is_delivered_once_to_each_set",
        Some(&ready_state("h100x8-healthy")),
        |path| {
            let nvml = init().unwrap();
            let d3 = nvml.device_by_index(3).unwrap();
            let d4 = nvml.device_by_index(4).unwrap();
            let set =
                d3.register_events(EventTypes::CRITICAL_XID_ERROR, nvml.create_event_set().unwrap()).unwrap();
            let other =
                d3.register_events(EventTypes::CRITICAL_XID_ERROR, nvml.create_event_set().unwrap()).unwrap();
            let only_gpu4 =
                d4.register_events(EventTypes::CRITICAL_XID_ERROR, nvml.create_event_set().unwrap()).unwrap();

            assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
            let writer_path = path.to_owned();
            let injected = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                let mut state: serde_json::Value =
                    serde_json::from_str(&ready_state("h100x8-healthy")).unwrap();
                state["events"] = serde_json::json!([{"gpu": 3, "xid": 79}]);
                write_state(&writer_path, &state.to_string());
                Instant::now()
            });
            let event = set.wait(5000).unwrap();
            let received = Instant::now();
            let written = injected.join().unwrap();
            eprintln!("xid delivered {:?} after the state file was written", received - written);
            assert!(received - written < Duration::from_secs(1));
            assert_eq!(event.device.index().unwrap(), 3);
            assert!(event.event_type.contains(EventTypes::CRITICAL_XID_ERROR));
            assert!(matches!(event.event_data, Some(XidError::Value(79))));

            assert!(matches!(set.wait(100), Err(NvmlError::Timeout)), "delivered twice");
            assert!(matches!(other.wait(100).unwrap().event_data, Some(XidError::Value(79))));
            assert!(
                matches!(only_gpu4.wait(100), Err(NvmlError::Timeout)),
                "event for GPU 3 reached GPU 4's set"
            );
        },
    );
    // The measured delay, for the record (`cargo test -- --nocapture`).
    for line in stderr.lines().filter(|l| l.contains("xid delivered")) {
        println!("{line}");
    }
}

#[test]
fn a_system_without_events_refuses_registration_with_not_supported() {
    let mut state: serde_json::Value = serde_json::from_str(&ready_state("h100x8-healthy")).unwrap();
    state["events_supported"] = serde_json::json!(false);
    isolated(
        "a_system_without_events_refuses_registration_with_not_supported",
        Some(&state.to_string()),
        |_| {
            let nvml = init().unwrap();
            let device = nvml.device_by_index(0).unwrap();
            let refused =
                device.register_events(EventTypes::CRITICAL_XID_ERROR, nvml.create_event_set().unwrap());
            assert!(matches!(refused.map_err(|e| e.error), Err(NvmlError::NotSupported)));
            assert!(device.supported_event_types().unwrap().is_empty());
            // Everything else still answers.
            assert_eq!(device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).unwrap(), 0);
        },
    );
}

// --- issue 15: PCIe link, NVLinks, fabric, clock events, ECC and persistence modes ---

/// The fabric state and status through the raw symbol (nvml-wrapper 0.13
/// has no call for it), as NVML's `nvmlGpuFabricInfo_t` says.
fn fabric_of(nvml: &Nvml, index: u32) -> Result<(u8, u32), u32> {
    let device = nvml.device_by_index(index).unwrap();
    let sym =
        nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref().expect("the fake exports nvmlDeviceGetGpuFabricInfo");
    let mut info = nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_t {
        clusterUuid: [0; 16],
        status: 0,
        cliqueId: 0,
        state: 0,
    };
    // SAFETY: the handle comes from this `Nvml`, which outlives the call; `info` is a valid out struct.
    let rc = unsafe { sym(device.handle(), &mut info) };
    if rc == 0 { Ok((info.state, info.status)) } else { Err(rc) }
}

/// The fabric state through `nvmlDeviceGetGpuFabricInfoV` with a v2 or v3
/// struct (its `version` word: size | version << 24), and the bytes past a v2.
fn fabric_v_of(nvml: &Nvml, index: u32, v: u32) -> (u32, u8, u8) {
    use nvml_wrapper_sys::bindings::{nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t};
    let device = nvml.device_by_index(index).unwrap();
    let sym = nvml
        .lib()
        .nvmlDeviceGetGpuFabricInfoV
        .as_ref()
        .expect("the fake exports nvmlDeviceGetGpuFabricInfoV");
    let size = if v == 3 { size_of::<nvmlGpuFabricInfo_v3_t>() } else { size_of::<nvmlGpuFabricInfo_v2_t>() };
    // A v3 struct whose last byte (past a v2) is a canary.
    let mut info = nvmlGpuFabricInfo_v3_t {
        version: u32::try_from(size).unwrap() | (v << 24),
        clusterUuid: [0; 16],
        status: 0,
        cliqueId: 0,
        state: 0,
        healthMask: 0,
        healthSummary: 0xAA,
    };
    // SAFETY: the handle comes from this `Nvml`; `info` is a valid v3 struct, big enough for either version.
    let rc = unsafe { sym(device.handle(), &mut info) };
    (rc, info.state, info.healthSummary)
}

#[test]
fn the_versioned_fabric_call_answers_v2_and_v3() {
    isolated("the_versioned_fabric_call_answers_v2_and_v3", Some(&ready_state("hgx-h100x8-healthy")), |_| {
        let nvml = init().unwrap();
        assert_eq!(fabric_v_of(&nvml, 0, 3), (0, 3, 0), "v3: completed, summary written");
        assert_eq!(fabric_v_of(&nvml, 0, 2), (0, 3, 0xAA), "v2: completed, nothing written past it");
        assert_eq!(fabric_v_of(&nvml, 0, 7).0, 25, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH");
    });
}

#[test]
fn the_hgx_state_has_18_nvlinks_a_completed_fabric_and_every_mode_on() {
    isolated(
        "the_hgx_state_has_18_nvlinks_a_completed_fabric_and_every_mode_on",
        Some(&ready_state("hgx-h100x8-healthy")),
        |_| {
            use nvml_wrapper::enum_wrappers::device::PerformanceState;
            use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
            use nvml_wrapper::enums::device::PcieLinkMaxSpeed;
            let nvml = init().unwrap();
            for i in 0..8 {
                let d = nvml.device_by_index(i).unwrap();
                assert_eq!(
                    (d.current_pcie_link_gen().unwrap(), d.current_pcie_link_width().unwrap()),
                    (5, 16)
                );
                assert_eq!((d.max_pcie_link_gen().unwrap(), d.max_pcie_link_width().unwrap()), (5, 16));
                assert_eq!(d.max_pcie_link_speed().unwrap(), PcieLinkMaxSpeed::MegaTransfersPerSecond32000);
                for link in 0..18 {
                    let l = d.link_wrapper_for(link);
                    assert!(l.is_active().unwrap(), "gpu {i} link {link}");
                    assert_eq!(l.error_counter(ErrorCounter::DlCrcFlit).unwrap(), 0);
                }
                assert!(matches!(d.link_wrapper_for(18).is_active(), Err(NvmlError::InvalidArg)));
                assert!(d.current_throttle_reasons().unwrap().is_empty());
                assert!(d.is_ecc_enabled().unwrap().currently_enabled);
                assert!(d.is_in_persistent_mode().unwrap());
                assert_eq!(d.performance_state().unwrap(), PerformanceState::Zero);
                assert_eq!(fabric_of(&nvml, i), Ok((3, 0)), "NVML_GPU_FABRIC_STATE_COMPLETED, success");
            }
        },
    );
}

#[test]
fn the_pcie_state_has_no_nvlink_and_no_fabric() {
    isolated("the_pcie_state_has_no_nvlink_and_no_fabric", Some(&ready_state("pcie-l40sx4-healthy")), |_| {
        let nvml = init().unwrap();
        assert_eq!(nvml.device_count().unwrap(), 4);
        let d = nvml.device_by_index(0).unwrap();
        assert_eq!((d.current_pcie_link_gen().unwrap(), d.max_pcie_link_width().unwrap()), (4, 16));
        assert!(matches!(d.link_wrapper_for(0).is_active(), Err(NvmlError::NotSupported)));
        assert_eq!(fabric_of(&nvml, 0), Ok((0, 0)), "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED");
    });
}

#[test]
fn absent_keys_are_not_supported() {
    isolated("absent_keys_are_not_supported", Some(&ready_state("h100x8-healthy")), |_| {
        let nvml = init().unwrap();
        let d = nvml.device_by_index(0).unwrap();
        assert!(matches!(d.current_pcie_link_gen(), Err(NvmlError::NotSupported)));
        assert!(matches!(d.link_wrapper_for(0).is_active(), Err(NvmlError::NotSupported)));
        assert!(matches!(d.current_throttle_reasons(), Err(NvmlError::NotSupported)));
        assert!(matches!(d.is_ecc_enabled(), Err(NvmlError::NotSupported)));
        assert!(matches!(d.is_in_persistent_mode(), Err(NvmlError::NotSupported)));
        assert!(matches!(d.performance_state(), Err(NvmlError::NotSupported)));
        assert_eq!(fabric_of(&nvml, 0), Err(3), "NVML_ERROR_NOT_SUPPORTED");
    });
}

#[test]
fn degraded_links_and_modes_answer_as_nvml_would() {
    let mut state: serde_json::Value = serde_json::from_str(&ready_state("hgx-h100x8-healthy")).unwrap();
    let g = &mut state["gpus"][2];
    g["pcie"] = serde_json::json!({"max_gen": 5, "max_width": 16, "gen": 5, "width": 8, "slot_max_gen": 4});
    g["nvlinks"][3]["state"] = "down".into();
    g["nvlinks"][4]["replay_errors"] = 7.into();
    g["nvlinks"][4]["recovery_errors"] = 2.into();
    g["nvlinks"][4]["crc_errors"] = 40.into();
    g["fabric"] = serde_json::json!({"state": "completed", "status": "failure"});
    g["clock_events"] = serde_json::json!(["hw_slowdown", "sw_power_cap", "hw_power_brake"]);
    g["ecc_mode"] = "disabled".into();
    g["persistence"] = false.into();
    g["pstate"] = 8.into();
    isolated("degraded_links_and_modes_answer_as_nvml_would", Some(&state.to_string()), |_| {
        use nvml_wrapper::bitmasks::device::ThrottleReasons;
        use nvml_wrapper::enum_wrappers::device::PerformanceState;
        use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
        use nvml_wrapper::enums::device::PcieLinkMaxSpeed;
        let nvml = init().unwrap();
        let d = nvml.device_by_index(2).unwrap();
        assert_eq!(d.current_pcie_link_width().unwrap(), 8);
        // The slot's limit lowers NVML's "max"; the GPU's own maximum stays gen 5.
        assert_eq!(d.max_pcie_link_gen().unwrap(), 4);
        assert_eq!(d.max_pcie_link_speed().unwrap(), PcieLinkMaxSpeed::MegaTransfersPerSecond32000);
        assert!(!d.link_wrapper_for(3).is_active().unwrap());
        let l4 = d.link_wrapper_for(4);
        let count = |c| l4.error_counter(c).unwrap();
        assert_eq!(
            (
                count(ErrorCounter::DlCrcFlit),
                count(ErrorCounter::DlCrcData),
                count(ErrorCounter::DlReplay),
                count(ErrorCounter::DlRecovery)
            ),
            (40, 0, 7, 2)
        );
        assert_eq!(
            d.current_throttle_reasons().unwrap(),
            ThrottleReasons::HW_SLOWDOWN
                | ThrottleReasons::SW_POWER_CAP
                | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN
        );
        let ecc = d.is_ecc_enabled().unwrap();
        assert!(!ecc.currently_enabled && !ecc.pending_enabled);
        assert!(!d.is_in_persistent_mode().unwrap());
        assert_eq!(d.performance_state().unwrap(), PerformanceState::Eight);
        let (state, status) = fabric_of(&nvml, 2).unwrap();
        assert!(state == 3 && status != 0, "completed with a failure status: {state} {status}");
        // The other GPUs are untouched.
        assert!(nvml.device_by_index(1).unwrap().link_wrapper_for(3).is_active().unwrap());
    });
}

#[test]
fn a_bad_word_in_the_link_keys_fails_init_with_a_clear_message() {
    let mut state: serde_json::Value = serde_json::from_str(&ready_state("hgx-h100x8-healthy")).unwrap();
    state["gpus"][0]["clock_events"] = serde_json::json!(["hw_slowdwn"]);
    let stderr = isolated(
        "a_bad_word_in_the_link_keys_fails_init_with_a_clear_message",
        Some(&state.to_string()),
        |_| {
            assert!(init().is_err());
        },
    );
    assert!(stderr.contains("clock_events: unknown 'hw_slowdwn'"), "{stderr}");
}

#[test]
fn mig_devices_answer_through_nvml_wrappers_mig_calls() {
    isolated(
        "mig_devices_answer_through_nvml_wrappers_mig_calls",
        Some(&ready_state("h100x8-mig")),
        |path| {
            let nvml = init().unwrap();
            let d0 = nvml.device_by_index(0).unwrap();
            assert_eq!((d0.mig_mode().unwrap().current, d0.mig_mode().unwrap().pending), (1, 1));
            assert_eq!(d0.mig_device_count().unwrap(), 7);
            assert!(!d0.mig_is_mig_device_handle().unwrap());
            assert!(matches!(d0.mig_parent_device(), Err(NvmlError::InvalidArg)), "a GPU has no parent");
            let uuids: Vec<String> =
                (0..3).map(|i| d0.mig_device_by_index(i).unwrap().uuid().unwrap()).collect();
            assert_eq!(uuids[1], "MIG-1d2c3b4a-0001-5a6b-8c7d-000000000000");
            assert!(uuids.iter().all(|u| u.starts_with("MIG-")));
            assert!(matches!(d0.mig_device_by_index(3), Err(NvmlError::NotFound)), "a free slot");
            assert!(matches!(d0.mig_device_by_index(7), Err(NvmlError::InvalidArg)), "past the most");

            let m = d0.mig_device_by_index(2).unwrap();
            assert!(m.mig_is_mig_device_handle().unwrap());
            assert_eq!(m.mig_parent_device().unwrap().uuid().unwrap(), d0.uuid().unwrap());
            // GPU functions do not take a MIG handle here.
            assert!(matches!(m.minor_number(), Err(NvmlError::InvalidArg)));

            // GPU 5's devices have a gap in their indices.
            let d5 = nvml.device_by_index(5).unwrap();
            assert!(matches!(d5.mig_device_by_index(1), Err(NvmlError::NotFound)));
            let m53 = d5.mig_device_by_index(3).unwrap();
            assert_eq!(m53.uuid().unwrap(), "MIG-1d2c3b4a-0503-5a6b-8c7d-000000000005");
            assert_eq!(m53.mig_parent_device().unwrap().index().unwrap(), 5);

            // MIG supported but off: mode 0, no devices.
            let d1 = nvml.device_by_index(1).unwrap();
            assert_eq!(d1.mig_mode().unwrap().current, 0);
            assert_eq!(d1.mig_device_count().unwrap(), 0);
            assert!(matches!(d1.mig_device_by_index(0), Err(NvmlError::NotFound)));

            // The parent's faults reach its MIG devices; a device that is gone
            // leaves its handle invalid.
            let mut state: serde_json::Value = serde_json::from_str(&ready_state("h100x8-mig")).unwrap();
            state["gpus"][0]["lost"] = true.into();
            state["gpus"][5]["mig"]["enabled"] = false.into();
            write_state(path, &state.to_string());
            assert!(matches!(m.uuid(), Err(NvmlError::GpuLost)));
            assert!(matches!(m53.uuid(), Err(NvmlError::InvalidArg)));
            assert_eq!(d5.mig_mode().unwrap().current, 0);
        },
    );
}

#[test]
fn a_gpu_without_mig_support_says_not_supported() {
    isolated("a_gpu_without_mig_support_says_not_supported", Some(&ready_state("h100x8-healthy")), |_| {
        let nvml = init().unwrap();
        let d = nvml.device_by_index(0).unwrap();
        assert!(matches!(d.mig_mode(), Err(NvmlError::NotSupported)));
        assert_eq!(d.mig_device_count().unwrap(), 0, "NVML: zero when MIG is not supported");
        assert!(matches!(d.mig_device_by_index(0), Err(NvmlError::NotSupported)));
        assert!(!d.mig_is_mig_device_handle().unwrap());
    });
}

// --- usage, for the per-job sampler: utilization, memory, power, clock, processes ---

/// A ready state with `edit` applied to it.
fn edited(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut state: serde_json::Value = serde_json::from_str(&ready_state(name)).unwrap();
    edit(&mut state);
    state.to_string()
}

/// (pid, used memory, GPU instance, compute instance) of each compute process.
type Proc = (u32, Option<u64>, Option<u32>, Option<u32>);

fn processes_of(device: &nvml_wrapper::Device<'_>) -> Result<Vec<Proc>, NvmlError> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    Ok(device
        .running_compute_processes()?
        .into_iter()
        .map(|p| {
            let used = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            };
            (p.pid, used, p.gpu_instance_id, p.compute_instance_id)
        })
        .collect())
}

/// `nvmlDeviceGetComputeRunningProcesses_v3` called raw with room for `room`
/// entries (NULL when 0): its return code, the count it set, the pids written.
fn raw_processes(nvml: &Nvml, index: u32, room: u32) -> (u32, u32, Vec<u32>) {
    use nvml_wrapper_sys::bindings::nvmlProcessInfo_t;
    let device = nvml.device_by_index(index).unwrap();
    let sym = nvml.lib().nvmlDeviceGetComputeRunningProcesses_v3.as_ref().unwrap();
    let empty = nvmlProcessInfo_t { pid: 0, usedGpuMemory: 0, gpuInstanceId: 0, computeInstanceId: 0 };
    let mut infos = vec![empty; room as usize];
    let ptr = if room == 0 { std::ptr::null_mut() } else { infos.as_mut_ptr() };
    let mut count = room;
    // SAFETY: the handle comes from this `Nvml`; `ptr` is NULL or holds `count` entries.
    let rc = unsafe { sym(device.handle(), &mut count, ptr) };
    let written = if rc == 0 { count.min(room) as usize } else { 0 };
    (rc, count, infos.iter().take(written).map(|p| p.pid).collect())
}

/// `nvmlDeviceGetMemoryInfo` (the v1 struct) called raw: (total, free, used).
fn memory_v1_of(nvml: &Nvml, index: u32) -> Result<(u64, u64, u64), u32> {
    let device = nvml.device_by_index(index).unwrap();
    let sym = nvml.lib().nvmlDeviceGetMemoryInfo.as_ref().unwrap();
    let mut m = nvml_wrapper_sys::bindings::nvmlMemory_t { total: 0, free: 0, used: 0 };
    // SAFETY: the handle comes from this `Nvml`; `m` is a valid out struct.
    let rc = unsafe { sym(device.handle(), &mut m) };
    if rc == 0 { Ok((m.total, m.free, m.used)) } else { Err(rc) }
}

#[test]
fn usage_calls_answer_the_state_and_see_it_change() {
    let state = edited("h100x8-healthy", |s| {
        s["gpus"][3]["utilization"] = serde_json::json!({"gpu": 87, "memory": 41});
        s["gpus"][3]["memory_used"] = (30_u64 << 30).into();
        s["gpus"][3]["power_usage_mw"] = 512_000.into();
        s["gpus"][3]["sm_clock_mhz"] = 1980.into();
        s["gpus"][3]["processes"] = serde_json::json!([
            {"pid": 4100, "used_memory": 10_u64 << 30},
            {"pid": 4101, "used_memory": 20_u64 << 30},
            {"pid": 4102}]);
    });
    isolated("usage_calls_answer_the_state_and_see_it_change", Some(&state), |path| {
        use nvml_wrapper::enum_wrappers::device::Clock;
        let nvml = init().unwrap();
        let d3 = nvml.device_by_index(3).unwrap();
        let u = d3.utilization_rates().unwrap();
        assert_eq!((u.gpu, u.memory), (87, 41));
        let m = d3.memory_info().unwrap();
        assert_eq!((m.total, m.used, m.free, m.reserved), (80 << 30, 30 << 30, 50 << 30, 0));
        assert_eq!(memory_v1_of(&nvml, 3), Ok((80 << 30, 50 << 30, 30 << 30)));
        assert_eq!(d3.power_usage().unwrap(), 512_000);
        assert_eq!(d3.clock_info(Clock::SM).unwrap(), 1980);
        assert_eq!(d3.clock_info(Clock::Graphics).unwrap(), 1980);
        assert!(matches!(d3.clock_info(Clock::Memory), Err(NvmlError::NotSupported)));
        assert_eq!(
            processes_of(&d3).unwrap(),
            vec![
                (4100, Some(10 << 30), None, None),
                (4101, Some(20 << 30), None, None),
                (4102, None, None, None)
            ],
            "all three, through nvml-wrapper's count-then-fetch"
        );
        assert_eq!(d3.running_compute_processes_count().unwrap(), 3);

        // The two-call protocol itself.
        assert_eq!(raw_processes(&nvml, 3, 0), (7, 3, vec![]), "NULL: INSUFFICIENT_SIZE and the count");
        assert_eq!(raw_processes(&nvml, 3, 2), (7, 3, vec![]), "too little room: the same");
        assert_eq!(raw_processes(&nvml, 3, 3), (0, 3, vec![4100, 4101, 4102]));
        assert_eq!(raw_processes(&nvml, 3, 8), (0, 3, vec![4100, 4101, 4102]), "room to spare");
        assert_eq!(raw_processes(&nvml, 0, 0), (0, 0, vec![]), "no processes: SUCCESS and 0");

        // A GPU the state says nothing of answers the defaults.
        let d0 = nvml.device_by_index(0).unwrap();
        let u = d0.utilization_rates().unwrap();
        assert_eq!((u.gpu, u.memory), (0, 0));
        let m = d0.memory_info().unwrap();
        assert_eq!((m.total, m.used, m.free), (85_899_345_920, 0, 85_899_345_920));
        assert_eq!((d0.power_usage().unwrap(), d0.clock_info(Clock::SM).unwrap()), (0, 0));
        assert!(processes_of(&d0).unwrap().is_empty());

        // A new state file is seen by the loaded library.
        write_state(
            path,
            &edited("h100x8-healthy", |s| {
                s["gpus"][3]["utilization"] = serde_json::json!({"gpu": 3, "memory": 1});
                s["gpus"][3]["memory_total"] = 1000.into();
                s["gpus"][3]["memory_used"] = 999.into();
                s["gpus"][3]["power_usage_mw"] = 70_000.into();
                s["gpus"][3]["sm_clock_mhz"] = 345.into();
                s["gpus"][3]["processes"] = serde_json::json!([{"pid": 7, "used_memory": 999}]);
            }),
        );
        let u = d3.utilization_rates().unwrap();
        assert_eq!((u.gpu, u.memory), (3, 1));
        let m = d3.memory_info().unwrap();
        assert_eq!((m.total, m.used, m.free), (1000, 999, 1));
        assert_eq!((d3.power_usage().unwrap(), d3.clock_info(Clock::SM).unwrap()), (70_000, 345));
        assert_eq!(processes_of(&d3).unwrap(), vec![(7, Some(999), None, None)]);
    });
}

#[test]
fn each_usage_call_fails_with_the_error_its_state_names() {
    let state = edited("h100x8-healthy", |s| {
        s["gpus"][2]["fail"] = serde_json::json!({
            "utilization": "UNKNOWN", "memory": "NOT_SUPPORTED", "processes": "GPU_IS_LOST",
            "power": "NO_PERMISSION", "clock": "TIMEOUT"});
        s["gpus"][2]["processes"] = serde_json::json!([{"pid": 1, "used_memory": 1}]);
    });
    isolated("each_usage_call_fails_with_the_error_its_state_names", Some(&state), |path| {
        use nvml_wrapper::enum_wrappers::device::Clock;
        let nvml = init().unwrap();
        let d2 = nvml.device_by_index(2).unwrap();
        assert!(matches!(d2.utilization_rates(), Err(NvmlError::Unknown)));
        assert!(matches!(d2.memory_info(), Err(NvmlError::NotSupported)));
        assert_eq!(memory_v1_of(&nvml, 2), Err(3), "both memory calls");
        assert!(matches!(d2.running_compute_processes(), Err(NvmlError::GpuLost)));
        assert_eq!(raw_processes(&nvml, 2, 0).0, 15, "the count call too");
        assert!(matches!(d2.power_usage(), Err(NvmlError::NoPermission)));
        assert!(matches!(d2.clock_info(Clock::SM), Err(NvmlError::Timeout)));
        // Only those calls, only on that GPU.
        assert!(d2.uuid().is_ok());
        assert_eq!(d2.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).unwrap(), 0);
        let d1 = nvml.device_by_index(1).unwrap();
        assert!(d1.utilization_rates().is_ok() && d1.memory_info().is_ok() && d1.power_usage().is_ok());

        // One failure at a time, cleared by rewriting the file.
        write_state(
            path,
            &edited("h100x8-healthy", |s| s["gpus"][2]["fail"] = serde_json::json!({"power": "UNKNOWN"})),
        );
        assert!(d2.utilization_rates().is_ok() && d2.memory_info().is_ok());
        assert!(d2.running_compute_processes().unwrap().is_empty());
        assert!(matches!(d2.power_usage(), Err(NvmlError::Unknown)));
        assert_eq!(d2.clock_info(Clock::SM).unwrap(), 0);
    });
}

#[test]
fn a_mig_gpu_has_no_utilization_and_its_mig_devices_answer_memory_and_processes() {
    let state = edited("h100x8-mig", |s| {
        s["gpus"][0]["memory_used"] = (25_u64 << 30).into();
        s["gpus"][0]["processes"] =
            serde_json::json!([{"pid": 11, "used_memory": 5}, {"pid": 12, "used_memory": 6}]);
        s["gpus"][0]["fail"] = serde_json::json!({"processes": "NO_PERMISSION"});
        let m1 = &mut s["gpus"][0]["mig"]["instances"][1];
        m1["memory_total"] = (20_u64 << 30).into();
        m1["memory_used"] = (5_u64 << 30).into();
        m1["processes"] = serde_json::json!([
            {"pid": 11, "used_memory": 5}, {"pid": 12, "used_memory": 6}, {"pid": 13, "gpu_instance_id": 9}]);
        m1["fail"] = serde_json::json!({"processes": "SUCCESS"});
        s["gpus"][0]["mig"]["instances"][2]["fail"] = serde_json::json!({"memory": "UNKNOWN"});
    });
    isolated(
        "a_mig_gpu_has_no_utilization_and_its_mig_devices_answer_memory_and_processes",
        Some(&state),
        |_| {
            let nvml = init().unwrap();
            let d0 = nvml.device_by_index(0).unwrap();
            assert!(matches!(d0.utilization_rates(), Err(NvmlError::NotSupported)), "MIG mode on");
            let m = d0.memory_info().unwrap();
            assert_eq!((m.total, m.used), (80 << 30, 25 << 30), "the whole GPU's memory");
            assert!(matches!(d0.running_compute_processes(), Err(NvmlError::NoPermission)));
            assert!(nvml.device_by_index(1).unwrap().utilization_rates().is_ok(), "MIG supported but off");

            let m1 = d0.mig_device_by_index(1).unwrap();
            assert!(matches!(m1.utilization_rates(), Err(NvmlError::NotSupported)));
            assert!(matches!(m1.power_usage(), Err(NvmlError::NotSupported)));
            let m = m1.memory_info().unwrap();
            assert_eq!((m.total, m.used, m.free), (20 << 30, 5 << 30, 15 << 30));
            assert_eq!(
                processes_of(&m1).unwrap(),
                vec![
                    (11, Some(5), Some(1), Some(0)),
                    (12, Some(6), Some(1), Some(0)),
                    (13, None, Some(9), Some(0))
                ],
                "the MIG device's own processes; its SUCCESS overrides the GPU's failure"
            );

            // MIG device 0 says nothing: defaults, and the GPU's processes failure.
            let m0 = d0.mig_device_by_index(0).unwrap();
            let m = m0.memory_info().unwrap();
            assert_eq!((m.total, m.used), (10 << 30, 0));
            assert!(matches!(m0.running_compute_processes(), Err(NvmlError::NoPermission)));
            // MIG device 2's own failure.
            assert!(matches!(d0.mig_device_by_index(2).unwrap().memory_info(), Err(NvmlError::Unknown)));
        },
    );
}

#[test]
fn a_hang_on_the_usage_calls_leaves_the_health_calls_answering() {
    let state = edited("h100x8-mig", |s| {
        s["gpus"][1]["hang_calls_ms"] = serde_json::json!({"utilization": 300, "processes": 300});
        s["gpus"][0]["hang_calls_ms"] = serde_json::json!({"memory": 300});
        s["gpus"][2]["hang_ms"] = 200.into();
    });
    isolated("a_hang_on_the_usage_calls_leaves_the_health_calls_answering", Some(&state), |_| {
        let nvml = init().unwrap();
        let timed = |f: &dyn Fn()| {
            let t = Instant::now();
            f();
            t.elapsed()
        };
        let d1 = nvml.device_by_index(1).unwrap();
        let fast = timed(&|| {
            d1.uuid().unwrap();
            d1.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).unwrap();
            d1.memory_info().unwrap();
            d1.power_usage().unwrap();
        });
        assert!(fast < Duration::from_millis(250), "health and unhung usage calls: {fast:?}");
        let slow = timed(&|| {
            d1.utilization_rates().unwrap();
        });
        assert!(slow >= Duration::from_millis(300), "hung utilization: {slow:?}");
        assert!(
            timed(&|| assert!(d1.running_compute_processes().unwrap().is_empty()))
                >= Duration::from_millis(300)
        );

        // A GPU's per-call hang reaches its MIG devices.
        let m0 = nvml.device_by_index(0).unwrap().mig_device_by_index(0).unwrap();
        assert!(
            timed(&|| {
                m0.memory_info().unwrap();
            }) >= Duration::from_millis(300)
        );
        // `hang_ms` delays the usage calls too.
        let d2 = nvml.device_by_index(2).unwrap();
        assert!(
            timed(&|| {
                d2.power_usage().unwrap();
            }) >= Duration::from_millis(200)
        );
    });
}

#[test]
fn the_energy_counter_answers_per_gpu_fails_and_hangs_on_its_own() {
    let state = edited("h100x8-mig", |s| {
        s["gpus"][0]["total_energy_mj"] = 5_000_000.into();
        s["gpus"][1]["total_energy_mj"] = 123_456_789_012_u64.into();
        s["gpus"][2]["total_energy_mj"] = 1.into();
        s["gpus"][2]["fail"] = serde_json::json!({"energy": "UNKNOWN"});
        s["gpus"][3]["total_energy_mj"] = 1.into();
        s["gpus"][3]["hang_calls_ms"] = serde_json::json!({"energy": 300});
        s["gpus"][0]["mig"]["instances"][0]["fail"] = serde_json::json!({"energy": "SUCCESS"});
    });
    isolated("the_energy_counter_answers_per_gpu_fails_and_hangs_on_its_own", Some(&state), |path| {
        let nvml = init().unwrap();
        let d1 = nvml.device_by_index(1).unwrap();
        assert_eq!(d1.total_energy_consumption().unwrap(), 123_456_789_012, "a u64 of millijoules");
        // MIG mode on: the parent GPU's handle answers the whole GPU's counter; a MIG
        // device has none of its own (NOT_SUPPORTED, even where its failure is cleared).
        let d0 = nvml.device_by_index(0).unwrap();
        assert_eq!(d0.total_energy_consumption().unwrap(), 5_000_000);
        let m0 = d0.mig_device_by_index(0).unwrap();
        assert!(matches!(m0.total_energy_consumption(), Err(NvmlError::NotSupported)));
        // Its own failure, on that GPU and that call only.
        let d2 = nvml.device_by_index(2).unwrap();
        assert!(matches!(d2.total_energy_consumption(), Err(NvmlError::Unknown)));
        assert!(d2.power_usage().is_ok() && d2.memory_info().is_ok());
        // No key: not supported (a GPU before Volta).
        let d4 = nvml.device_by_index(4).unwrap();
        assert!(matches!(d4.total_energy_consumption(), Err(NvmlError::NotSupported)));
        // Its own hang.
        let d3 = nvml.device_by_index(3).unwrap();
        let t = Instant::now();
        d3.power_usage().unwrap();
        assert!(t.elapsed() < Duration::from_millis(250), "power is not hung: {:?}", t.elapsed());
        let t = Instant::now();
        assert_eq!(d3.total_energy_consumption().unwrap(), 1);
        assert!(t.elapsed() >= Duration::from_millis(300), "hung energy: {:?}", t.elapsed());
        // The counter moves with the state file, and goes back as after a driver reload.
        write_state(path, &edited("h100x8-mig", |s| s["gpus"][1]["total_energy_mj"] = 7.into()));
        assert_eq!(d1.total_energy_consumption().unwrap(), 7);
    });
}
