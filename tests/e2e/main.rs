//! End-to-end tests on a real local Slurm cluster (see the `slurm-lab` crate).
//!
//! One cluster is brought up per task plugin setup ([`TaskSetup`]: task/none,
//! task/affinity, task/affinity + task/cgroup), the cases that run under that
//! setup run against it in turn (each [`Case`] says under which setups it
//! runs: most only under task/none, the CPU binding cases under all three),
//! and the cluster is torn down, also when cases fail. When a cluster cannot
//! start, the run fails: these tests are never skipped. The cases that need
//! job accounting (`spank-gpu why`/`autopsy`) run on one more cluster of their
//! own, with MariaDB and slurmdbd (filter `accounting::`).
//!
//! The suite runs on the Slurm release the lab runs (`$SLURM_LAB_SLURM`, see
//! `slurm_lab::release`): on the host's every case; on a newer release (24.11,
//! 26.05, from its Debian root, with the workspace built against its headers)
//! every case whose outcome can depend on the release, that is all but those
//! marked [`Case::host_only`]. A case whose expectation differs between
//! releases asks the lab (`Lab::slurm_at_least`) and cites the Slurm change.
//!
//! Run as root after `cargo build --workspace`:
//! `cargo test -p slurm-lab --test e2e [-- FILTER...]`, where a filter is a
//! substring of `SETUP::NAME` (`affinity_`, `affinity-cgroup::`, `none::hook`).

use std::panic::{self, AssertUnwindSafe};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use slurm_lab::{Lab, LabConfig, Release, TaskSetup, built_plugin, tail};

type CaseResult = Result<(), String>;

/// Fails the case with a message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

mod affinity;
mod agent;
mod apptainer;
mod containers;
mod frameworks;
mod gate;
mod jobs;
mod lint;
mod netif;
mod placement;
mod plugin;
mod prometheus;
mod rdzv;
mod usage;

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn output(cmd: &mut Command) -> Result<Output, String> {
    cmd.output().map_err(|e| format!("{cmd:?}: {e}"))
}

/// Runs a command that must succeed; returns its stdout and stderr.
fn ok(cmd: &mut Command) -> Result<(String, String), String> {
    let out = output(cmd)?;
    let (so, se) = text(&out);
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}{}):\nstdout: {so}\nstderr: {se}",
        out.status,
        slurm_lab::timed_out_note(out.status)
    );
    Ok((so, se))
}

/// A field of the job's one-line `scontrol show job` record (empty when absent).
fn job_field(lab: &Lab, job: u32, key: &str) -> String {
    let out = lab.command("scontrol").args(["show", "job", "-o", &job.to_string()]).output();
    let t = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    slurm_lab::field(&t, key).unwrap_or_default()
}

/// Polls `done` every quarter second until it holds, failing with `what` past `limit`.
fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> Result<bool, String>) -> CaseResult {
    let t = Instant::now();
    while !done()? {
        ensure!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

/// Everything after `from` in the lab's logs, for checks of what one case logged.
struct LogMark {
    files: Vec<(std::path::PathBuf, u64)>,
}

impl LogMark {
    fn new(lab: &Lab) -> LogMark {
        let mut files: Vec<_> = lab.nodes.iter().map(|n| lab.slurmd_log(n)).collect();
        files.push(lab.slurmctld_log());
        LogMark {
            files: files
                .into_iter()
                .map(|f| (f.clone(), std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0)))
                .collect(),
        }
    }

    /// The log text written since the mark, all files together.
    fn since(&self) -> String {
        let mut all = String::new();
        for (file, from) in &self.files {
            let bytes = std::fs::read(file).unwrap_or_default();
            let from = usize::try_from(*from).unwrap_or(0).min(bytes.len());
            all.push_str(&String::from_utf8_lossy(&bytes[from..]));
        }
        all
    }

    /// Waits briefly for `needle` to show up (slurmstepd logs asynchronously to the job's end).
    fn wait_for(&self, needle: &str) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = self.since();
            if let Some(line) = text.lines().find(|l| l.contains(needle)) {
                return Some(line.to_owned());
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn all_idle(lab: &mut Lab) -> CaseResult {
    ensure!(lab.daemons_alive(), "a Slurm daemon died");
    lab.wait_idle(Duration::from_secs(15)).map_err(|e| e.to_string())
}

/// The rendezvous stand-in, built next to this test binary's profile directory.
fn probe() -> String {
    slurm_lab::profile_dir().join("rdzv-probe").display().to_string()
}

/// A process on `node` that holds TCP `port` for `ms` milliseconds, returned
/// once it has bound the port (it says so on its stdout), not after a guess.
fn hold_port(lab: &Lab, node: &str, port: u16, ms: u64) -> Result<std::process::Child, String> {
    use std::io::BufRead;
    let mut holder = lab
        .command_on(node, &probe())
        .map_err(|e| e.to_string())?
        .args(["hold", &port.to_string(), &ms.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    let read = holder.stdout.take().map(|o| std::io::BufReader::new(o).read_line(&mut line));
    if !matches!(read, Some(Ok(_))) || line.trim() != format!("holding {port}") {
        let _ = holder.kill();
        let _ = holder.wait();
        return Err(format!("rdzv-probe hold {port} on {node} did not bind: '{}'", line.trim()));
    }
    Ok(holder)
}

fn run_batch(lab: &Lab, script: &str) -> Result<String, String> {
    let job = lab.sbatch(script, &[]).map_err(|e| e.to_string())?;
    let state = lab.wait_job(job, Duration::from_secs(90)).map_err(|e| e.to_string())?;
    let out = lab.job_output(job);
    ensure!(state == "COMPLETED", "job {job} ended {state}:\n{out}");
    Ok(out)
}

// ----- the runner ---------------------------------------------------------------------

/// One end-to-end case, and where it runs.
struct Case {
    name: &'static str,
    run: fn(&mut Lab) -> CaseResult,
    /// The task plugin setups it runs under: one lab per setup, each case
    /// only under the setups where what it checks can differ.
    setups: &'static [TaskSetup],
    /// It uses the debug build's test-only plugstack keys (`debug_panic`,
    /// `debug_nodelist`), so it cannot run against an installed package.
    debug_only: bool,
    /// It needs job accounting: it runs on the accounting cluster instead.
    accounting: bool,
    /// Its outcome cannot differ between Slurm releases (it checks the
    /// plugin's own parsing or files): it runs on the host's release only.
    host_only: bool,
    /// It needs pyxis and enroot: it runs on a task/none lab with them
    /// (`slurm_lab::containers`), and is reported as not run, by name, where
    /// `../shared/third-party` is absent.
    containers: bool,
    /// It runs `apptainer`: only on a lab whose release root carries it
    /// (Debian sid's, 26.05); elsewhere it is filtered out, not run.
    apptainer: bool,
    /// Started on its lab before any case runs (a slow job, such as one that
    /// must reach its time limit), so it runs while the other cases do. It
    /// belongs to this case alone: no other case uses it, and a failed case's
    /// clean-up never cancels it ([`settle`] cancels only that case's jobs).
    fixture: Option<fn(&Lab) -> CaseResult>,
}

/// Where a case runs unless it says otherwise: the setup where Slurm binds nothing.
const ONE: &[TaskSetup] = &[TaskSetup::None];
/// Every setup: for the cases whose outcome depends on how Slurm binds tasks.
const ALL: &[TaskSetup] = &TaskSetup::ALL;

impl Case {
    const fn new(name: &'static str, run: fn(&mut Lab) -> CaseResult) -> Case {
        Case {
            name,
            run,
            setups: ONE,
            debug_only: false,
            accounting: false,
            host_only: false,
            containers: false,
            apptainer: false,
            fixture: None,
        }
    }

    /// Starts `fixture` on the lab before the cases (see [`Case::fixture`]'s field).
    const fn with_fixture(self, fixture: fn(&Lab) -> CaseResult) -> Case {
        Case { fixture: Some(fixture), ..self }
    }

    /// Runs only where the lab's nodes have Apptainer (see [`Case::apptainer`]'s field).
    const fn apptainer(self) -> Case {
        Case { apptainer: true, ..self }
    }

    /// Runs on the lab with pyxis and enroot (see [`Case::containers`]'s field).
    const fn containers(self) -> Case {
        Case { containers: true, ..self }
    }

    /// Runs on the host's Slurm release only (see [`Case::host_only`]'s field).
    const fn host_only(self) -> Case {
        Case { host_only: true, ..self }
    }

    /// Runs on the cluster with accounting (MariaDB + slurmdbd).
    const fn accounting(self) -> Case {
        Case { accounting: true, ..self }
    }

    /// Runs under these setups instead of [`ONE`].
    const fn on(self, setups: &'static [TaskSetup]) -> Case {
        Case { setups, ..self }
    }

    /// Marks the case as needing the debug build's test-only plugstack keys.
    const fn debug_only(self) -> Case {
        Case { debug_only: true, ..self }
    }
}

const CASES: &[Case] = &[
    Case::new("plugin_exports_only_its_symbols", plugin::plugin_exports_only_its_symbols),
    Case::new("options_in_every_help", plugin::options_in_every_help),
    Case::new(
        "sbatch_option_reaches_batch_step_and_inner_sruns",
        plugin::sbatch_option_reaches_batch_step_and_inner_sruns,
    ),
    Case::new("bad_option_fails_only_the_submit", plugin::bad_option_fails_only_the_submit),
    Case::new(
        "forced_panics_in_remote_hooks_are_contained",
        plugin::forced_panics_in_remote_hooks_are_contained,
    )
    .debug_only(),
    Case::new(
        "bad_plugstack_argument_is_logged_and_jobs_run",
        plugin::bad_plugstack_argument_is_logged_and_jobs_run,
    ),
    Case::new("hook_error_matrix", plugin::hook_error_matrix).debug_only(),
    Case::new(
        "a_failed_binding_leaves_the_rendezvous_whole",
        plugin::a_failed_binding_leaves_the_rendezvous_whole,
    )
    .debug_only(),
    Case::new("ranks_meet_across_nodes_with_no_glue", rdzv::ranks_meet_across_nodes_with_no_glue),
    Case::new("torchrun_style_launch_reads_pet_defaults", rdzv::torchrun_style_launch_reads_pet_defaults),
    Case::new(
        "concurrent_steps_and_jobs_get_distinct_ports",
        rdzv::concurrent_steps_and_jobs_get_distinct_ports,
    ),
    Case::new(
        "user_port_is_kept_and_threads_follow_cpus_per_gpu",
        rdzv::user_port_is_kept_and_threads_follow_cpus_per_gpu,
    ),
    Case::new("uneven_layout_gets_right_ranks", rdzv::uneven_layout_gets_right_ranks),
    Case::new(
        "admin_defaults_apply_where_the_user_set_nothing",
        rdzv::admin_defaults_apply_where_the_user_set_nothing,
    ),
    Case::new("explain_shows_what_the_plugin_set", rdzv::explain_shows_what_the_plugin_set),
    Case::new("verbose_says_what_was_set_and_kept", rdzv::verbose_says_what_was_set_and_kept),
    Case::new("a_taken_port_is_named_on_stderr", rdzv::a_taken_port_is_named_on_stderr),
    // The plugin's own hostlist parser against its own debug key: no Slurm code decides it.
    Case::new(
        "garbage_node_list_sets_nothing_and_the_job_runs",
        rdzv::garbage_node_list_sets_nothing_and_the_job_runs,
    )
    .debug_only()
    .host_only(),
    Case::new("launch_traps_get_one_warning_with_the_fix", rdzv::launch_traps_get_one_warning_with_the_fix),
    Case::new("het_step_ranks_meet_across_components", rdzv::het_step_ranks_meet_across_components),
    Case::new("batch_step_gets_no_ranks", rdzv::batch_step_gets_no_ranks),
    Case::new(
        "an_explicit_port_word_beats_an_inherited_port",
        rdzv::an_explicit_port_word_beats_an_inherited_port,
    ),
    Case::new("reserved_ports_give_the_last_one", rdzv::reserved_ports_give_the_last_one),
    Case::new("explain_agrees_with_the_plugin", rdzv::explain_agrees_with_the_plugin),
    Case::new(
        "master_addr_word_gives_the_first_nodes_addr",
        placement::master_addr_word_gives_the_first_nodes_addr,
    ),
    Case::new(
        "affinity_tasks_bind_to_the_cpus_of_their_gpus",
        affinity::tasks_bind_to_the_cpus_of_their_gpus,
    )
    .on(ALL),
    Case::new(
        "affinity_slurm_index_order_is_followed_when_gres_lists_minors_out_of_order",
        affinity::slurm_index_order_is_followed_when_gres_lists_minors_out_of_order,
    )
    .on(ALL),
    Case::new(
        "affinity_tasks_that_see_every_gpu_take_their_share_in_local_rank_order",
        affinity::tasks_that_see_every_gpu_take_their_share_in_local_rank_order,
    )
    .on(ALL),
    Case::new(
        "affinity_user_cpu_bind_and_a_missing_table_leave_slurms_mask",
        affinity::user_cpu_bind_and_a_missing_table_leave_slurms_mask,
    )
    .on(ALL),
    Case::new(
        "agent_xid79_through_nvml_drains_only_that_node",
        agent::xid79_through_nvml_drains_only_that_node,
    ),
    Case::new("agent_xid79_in_the_kernel_log_drains", agent::xid79_in_the_kernel_log_drains),
    Case::new("agent_application_xids_never_drain", agent::application_xids_never_drain),
    Case::new(
        "agent_ecc_and_remap_faults_drain_or_request_a_reboot",
        agent::ecc_and_remap_faults_drain_or_request_a_reboot,
    ),
    Case::new(
        "agent_admin_drains_are_left_alone_and_own_drains_resumed",
        agent::admin_drains_are_left_alone_and_own_drains_resumed,
    ),
    Case::new(
        "agent_the_fleet_guard_holds_when_agents_see_faults_at_once",
        agent::the_fleet_guard_holds_when_agents_see_faults_at_once,
    ),
    Case::new("agent_a_drain_beats_a_reboot", agent::a_drain_beats_a_reboot),
    Case::new("agent_clear_after_a_gpu_reset", agent::clear_after_a_gpu_reset),
    Case::new("agent_hanging_or_missing_nvml_never_drains", agent::hanging_or_missing_nvml_never_drains),
    Case::new("agent_a_degraded_pcie_link_drains", agent::a_degraded_pcie_link_drains),
    // On the accounting cluster, in this order: the last stops slurmdbd. autopsy_timeout's
    // job starts before them all (its fixture) and times out while they run.
    Case::new("why_held_job", jobs::why_held_job).accounting(),
    Case::new("why_failed_afterok_dependency", jobs::why_failed_afterok_dependency).accounting(),
    Case::new("why_job_needs_a_node_the_agent_drained", jobs::why_job_needs_a_node_the_agent_drained)
        .accounting(),
    Case::new(
        "why_job_pending_for_resources_behind_a_running_one",
        jobs::why_job_pending_for_resources_behind_a_running_one,
    )
    .accounting(),
    Case::new("autopsy_non_zero_exit", jobs::autopsy_non_zero_exit).accounting(),
    Case::new("autopsy_missing_output_directory", jobs::autopsy_missing_output_directory).accounting(),
    Case::new("autopsy_job_whose_node_the_agent_drained", jobs::autopsy_job_whose_node_the_agent_drained)
        .accounting(),
    Case::new("autopsy_host_oom", jobs::autopsy_host_oom).accounting(),
    Case::new(
        "autopsy_names_the_first_failure_and_its_cause",
        jobs::autopsy_names_the_first_failure_and_its_cause,
    )
    .accounting(),
    Case::new("why_gives_the_numbers_of_a_gpu_limit", jobs::why_gives_the_numbers_of_a_gpu_limit)
        .accounting(),
    Case::new("usage_of_a_job_that_uses_half_its_gpus", usage::usage_of_a_job_that_uses_half_its_gpus)
        .accounting(),
    Case::new("usage_is_attributed_per_job_and_step", usage::usage_is_attributed_per_job_and_step)
        .accounting(),
    Case::new(
        "usage_of_each_array_task_and_het_component",
        usage::usage_of_each_array_task_and_het_component,
    )
    .accounting(),
    Case::new("usage_keeps_the_sites_admin_comment", usage::usage_keeps_the_sites_admin_comment).accounting(),
    Case::new("usage_names_the_nodes_no_step_ran_on", usage::usage_names_the_nodes_no_step_ran_on)
        .accounting(),
    Case::new(
        "a_users_lock_on_the_job_map_holds_up_no_job",
        usage::a_users_lock_on_the_job_map_holds_up_no_job,
    ),
    Case::new("autopsy_tells_gpu_oom_from_the_log", jobs::autopsy_tells_gpu_oom_from_the_log).accounting(),
    Case::new("why_autopsy_json_is_the_documented_schema", jobs::json_is_the_documented_schema).accounting(),
    Case::new("autopsy_timeout", jobs::autopsy_timeout).accounting().with_fixture(jobs::start_timeout_job),
    Case::new("why_autopsy_errors_are_one_line_and_fail", jobs::errors_are_one_line_and_fail).accounting(),
    Case::new("why_a_failed_dependency_without_slurmdbd", jobs::why_a_failed_dependency_without_slurmdbd)
        .accounting(),
    Case::new("batch_without_ntasks_gets_addr_and_port", rdzv::a_batch_job_without_ntasks_gets_addr_and_port),
    Case::new(
        "plugin_trouble_is_never_an_error_in_the_job_output",
        plugin::the_plugins_trouble_is_never_an_error_in_the_job_output,
    )
    .debug_only(),
    Case::new(
        "affinity_force_beats_an_explicit_cpu_bind_list",
        affinity::force_beats_an_explicit_cpu_bind_list,
    )
    .on(ALL),
    Case::new(
        "arbitrary_layout_puts_rank_0_on_master_addr",
        placement::arbitrary_layout_puts_rank_0_on_master_addr,
    ),
    Case::new(
        "affinity_the_device_cgroup_names_each_tasks_gpus",
        affinity::the_device_cgroup_names_each_tasks_gpus,
    )
    .on(ALL)
    .debug_only(),
    Case::new(
        "master_addr_reads_the_slurm_conf_slurmd_read",
        placement::master_addr_reads_the_slurm_conf_slurmd_read,
    ),
    // Each release's own Open MPI (the host's 4.1, the roots' 5.0 and 6.0): mpirun's daemons
    // are launched as Slurm steps; the MPI ranks must not inherit their per-rank variables.
    Case::new("mpirun_ranks_inherit_no_per_rank_variables", rdzv::mpirun_ranks_inherit_no_per_rank_variables),
    // What Slurm changed between releases (each case cites the change).
    Case::new("srun_option_against_an_sbatch_option", plugin::srun_option_against_an_sbatch_option),
    Case::new("sbatch_options_and_export_none", plugin::sbatch_options_and_export_none),
    Case::new(
        "agent_the_gpu_index_comes_from_slurmd_with_slurmd_debug_error",
        agent::the_gpu_index_comes_from_slurmd_with_slurmd_debug_error,
    ),
    // Issue 32: the packaged Prometheus rules on a real Prometheus and node_exporter.
    // What it checks (the rules, the agent's metrics) does not depend on Slurm's release.
    Case::new("prometheus_alerts_fire_on_a_real_drain", prometheus::alerts_fire_on_a_real_drain).host_only(),
    // Issue 24.
    Case::new("lint_submit_warns_and_queues", lint::submit_warns_and_queues),
    Case::new("lint_strict_refuses_trap_8", lint::strict_refuses_trap_8),
    Case::new("lint_pipe_scripts_reach_sbatch_whole", lint::pipe_scripts_reach_sbatch_whole),
    Case::new("lint_strict_judges_access_as_the_kernel", lint::strict_judges_access_as_the_kernel)
        .host_only(),
    Case::new("lint_cli_reads_the_lab", lint::cli_reads_the_lab),
    Case::new("lint_preemptible_qos_in_accounting", lint::preemptible_qos_in_accounting).accounting(),
    // A real framework from PyPI (issue 23): JAX's CPU wheels in a venv tests/run makes.
    Case::new(
        "jax_distributed_initialize_in_two_concurrent_steps",
        frameworks::jax_distributed_initialize_in_two_concurrent_steps,
    ),
    Case::new("a_taken_port_fails_the_step_with_strict", frameworks::a_taken_port_fails_the_step_with_strict),
    // Issue 30: NCCL and gloo on the fabric (the lab's second network).
    Case::new(
        "nccl_socket_net_gives_each_node_its_own_interface",
        netif::nccl_socket_net_gives_each_node_its_own_interface,
    ),
    Case::new(
        "a_literal_ifname_is_set_only_where_the_node_has_it",
        netif::a_literal_ifname_is_set_only_where_the_node_has_it,
    ),
    Case::new("agent_status_says_where_the_fabric_is", netif::agent_status_says_where_the_fabric_is),
    // Issue 29: pyxis + enroot. Issue 46: the rendezvous, the concurrent steps'
    // ports and the user's --container-env in both plugstack orders, per release:
    // what slurmstepd lets init_post_opt do differs by release.
    // pyxis built for each release, on 26.05's lab too: its combinations, and the device
    // check (from 23.11 Slurm's variables alone no longer say which GPUs a task has).
    Case::new("container_env_in_every_combination", containers::container_env_in_every_combination)
        .containers(),
    Case::new(
        "container_concurrent_steps_get_distinct_ports",
        containers::container_concurrent_steps_get_distinct_ports,
    )
    .containers(),
    Case::new(
        "container_two_node_rendezvous_on_the_plugins_port",
        containers::container_two_node_rendezvous_on_the_plugins_port,
    )
    .containers(),
    Case::new(
        "container_user_port_wins_with_container_env",
        containers::container_user_port_wins_with_container_env,
    )
    .containers(),
    Case::new(
        "container_explain_tells_who_set_each_value",
        containers::container_explain_tells_who_set_each_value,
    )
    .containers()
    .host_only(),
    Case::new("container_batch_step_in_the_image", containers::container_batch_step_in_the_image)
        .containers()
        .host_only(),
    // The device check runs after pyxis moved the task into the container's mount namespace.
    Case::new(
        "container_gpu_affinity_under_constrain_devices",
        containers::container_gpu_affinity_under_constrain_devices,
    )
    .containers()
    .on(&[TaskSetup::AffinityCgroup])
    .debug_only(),
    // Issue 29: Apptainer, on the release whose root carries it (26.05).
    Case::new("apptainer_rendezvous_meets_with_no_glue", apptainer::apptainer_rendezvous_meets_with_no_glue)
        .apptainer(),
    Case::new(
        "apptainer_cleanenv_gets_the_plugins_values_and_the_binding",
        apptainer::apptainer_cleanenv_gets_the_plugins_values_and_the_binding,
    )
    .apptainer(),
];

/// The cases that run on a lab with a topology plugin (tree, and block from
/// 23.11) whose order is the reverse of the node names: 26.05 numbers tasks in
/// topology order.
const TOPOLOGY_CASES: &[Case] = &[
    Case::new(
        "topology_order_puts_rank_0_on_master_addr",
        placement::topology_order_puts_rank_0_on_master_addr,
    ),
    Case::new("jax_on_a_topology_ordered_layout", frameworks::jax_on_a_topology_ordered_layout),
];

/// The basics with every slurmstepd under valgrind (a cluster of its own):
/// steps and a batch job with both options, and a forced panic, must leave no
/// valgrind error that has a frame in the plugin.
fn valgrind_basics() -> Result<String, String> {
    let cfg = LabConfig { plugin: Some(built_plugin()), valgrind_stepd: true, ..LabConfig::default() };
    let mut lab = start_limited(cfg).map_err(|e| format!("valgrind cluster did not start: {e}"))?;
    let result = (|| -> Result<String, String> {
        for node in lab.nodes.clone() {
            slurm_lab::agents::write_topology(&lab, &node)?;
        }
        let args = ["-N2", "-n4", "--gpus-per-task=1", "--auto-rdzv=verbose", "--gpu-affinity=verbose"];
        ok(lab.command("srun").args(args).arg("true"))?;
        let job = lab
            .sbatch("#!/bin/bash\n#SBATCH -N2\n#SBATCH -n2\n#SBATCH --auto-rdzv\n#SBATCH --gpu-affinity\nsrun true\n", &[])
            .map_err(|e| e.to_string())?;
        let state = lab.wait_job(job, Duration::from_secs(120)).map_err(|e| e.to_string())?;
        ensure!(state == "COMPLETED", "batch job under valgrind: {state}\n{}", lab.job_output(job));
        if std::env::var_os("SLURM_LAB_INSTALLED").is_none() {
            lab.set_plugstack_args(&["debug_panic=user_init+task_init"]).map_err(|e| e.to_string())?;
            ok(lab.command("srun").args(["-N1", "-n1", "--auto-rdzv", "true"]))?;
            lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
        }
        lab.wait_idle(Duration::from_secs(30)).map_err(|e| e.to_string())?;
        let (mut files, mut errors, mut ours) = (0, 0, Vec::new());
        for entry in std::fs::read_dir(lab.dir.join("log")).map_err(|e| e.to_string())?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("valgrind-") {
                continue;
            }
            files += 1;
            let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
            // Error blocks are runs of "==PID== " lines separated by an empty one.
            let mut block = String::new();
            for line in log.lines().chain(std::iter::once("")) {
                let body = line.split_once("== ").map_or("", |(_, b)| b);
                if body.trim().is_empty() {
                    if !block.is_empty() {
                        errors += 1;
                        if block.contains("spank_gpu") {
                            ours.push(block.clone());
                        }
                        block.clear();
                    }
                } else {
                    block.push_str(body);
                    block.push('\n');
                }
            }
        }
        ensure!(files >= 4, "only {files} valgrind logs: slurmstepd did not run under valgrind");
        ensure!(ours.is_empty(), "valgrind errors in the plugin's code:\n{}", ours.join("\n"));
        Ok(format!("({files} slurmstepd runs under valgrind; {errors} reports, none in the plugin)"))
    })();
    if result.is_err() {
        lab.keep_dir_on_stop();
    }
    let _ = lab.stop();
    result
}

/// The suite's last line. Cases that could not run (`not_run`, by name) are
/// neither passed nor failed: they are counted and named on a line of their own.
fn summary(passed: usize, failed: usize, not_run: &[String], filtered: usize) -> i32 {
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    if !not_run.is_empty() {
        println!("\nNOT RUN ({}): {}", not_run.len(), not_run.join(", "));
    }
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; {} not run; 0 ignored; 0 measured; {filtered} filtered out",
        not_run.len()
    );
    i32::from(failed != 0)
}

/// Whether a case runs under `setup` with these command-line filters: each
/// filter is a substring of `SETUP::NAME` (`affinity_` selects the binding
/// cases under every setup, `none::` every case under task/none).
fn wanted(case: &Case, setup: TaskSetup, filters: &[String], installed: bool, release: Release) -> bool {
    let full = format!("{setup}::{}", case.name);
    !case.accounting
        && !case.containers
        && case.setups.contains(&setup)
        && (filters.is_empty() || filters.iter().any(|f| full.contains(f.as_str())))
        && !(installed && case.debug_only)
        && (release.is_host() || !case.host_only)
        && (!case.apptainer || release.has_apptainer())
}

/// The lab for one setup: the plugin, and node2's `gres.conf` listing its
/// device files out of minor order.
fn lab_config(task_setup: TaskSetup) -> LabConfig {
    LabConfig {
        plugin: Some(built_plugin()),
        task_setup,
        node_gres: vec![(
            "node2".to_owned(),
            "File={dir}/cdev/nvidia[4-7]\nFile={dir}/cdev/nvidia[0-3]".to_owned(),
        )],
        ..LabConfig::default()
    }
}

/// Starts one lab (`setup` names it in the output), runs `cases` on it, tears
/// it down. Returns (passed, failed).
fn run_setup(setup: &str, cfg: LabConfig, cases: &[&Case]) -> (usize, usize) {
    let started = Instant::now();
    // The lab's own checks, named apart from the plain lab of the same task setup.
    let lab_name = if cfg.containers.is_some() { format!("{setup}+containers") } else { setup.to_owned() };
    let mut lab = match start_limited(cfg.clone()) {
        Ok(lab) => lab,
        Err(e) => {
            println!(
                "test {lab_name}::cluster_starts ... FAILED\n\nthe local Slurm cluster did not start:\n{e}"
            );
            return (0, 1);
        }
    };
    println!(
        "test {lab_name}::cluster_starts ... ok ({:.1} s to all nodes idle)",
        started.elapsed().as_secs_f64()
    );
    let (mut passed, mut failed) = (1, 0);
    // Each case's fixture first (its slow job runs while the others do); one
    // that cannot start fails its case, not the others.
    let fixtures: Vec<Option<String>> = cases
        .iter()
        .map(|c| c.fixture.and_then(|f| f(&lab).err().map(|e| format!("its fixture did not start: {e}"))))
        .collect();
    for (case, fixture_failed) in cases.iter().zip(fixtures) {
        let t = Instant::now();
        let before = queued_jobs(&lab);
        let result = match fixture_failed {
            Some(e) => Err(e),
            None => panic::catch_unwind(AssertUnwindSafe(|| (case.run)(&mut lab)))
                .unwrap_or_else(|_| Err("panicked".to_owned())),
        };
        match result {
            Ok(()) => {
                passed += 1;
                println!("test {setup}::{} ... ok ({:.1} s)", case.name, t.elapsed().as_secs_f64());
            }
            Err(why) => {
                failed += 1;
                println!("test {setup}::{} ... FAILED\n{why}\n", case.name);
                // A failed case can leave the cluster busy (a job that never
                // ends holds its node): the cases after it get a fresh cluster
                // instead of waiting behind it.
                if let Err(busy) = settle(&mut lab, &before) {
                    println!("the cluster is not idle after {}: {busy}\nstarting a fresh one", case.name);
                    match restart(lab, cfg.clone(), &format!("{setup}-{}", case.name)) {
                        Ok(fresh) => lab = fresh,
                        Err(e) => {
                            println!("test {setup}::cluster_restarts ... FAILED\n{e}");
                            return (passed, failed + 1);
                        }
                    }
                }
            }
        }
    }
    if failed > 0 {
        lab.keep_dir_on_stop();
        println!("logs kept in {}", lab.dir.display());
        println!("--- slurmd node1 log (tail) ---\n{}", tail(&lab.slurmd_log("node1"), 20));
    }
    let teardown = lab.stop();
    let left = lab.leftovers();
    if teardown.is_ok() && left.is_empty() {
        passed += 1;
        println!("test {lab_name}::teardown_leaves_nothing ... ok");
    } else {
        failed += 1;
        println!("test {lab_name}::teardown_leaves_nothing ... FAILED: {teardown:?} left {left:?}");
    }
    println!(
        "setup {lab_name}: {} cases, {:.1} s wall from start to teardown",
        cases.len(),
        started.elapsed().as_secs_f64()
    );
    (passed, failed)
}

/// The longest one command of a case may run: past it, the case fails
/// (`$SLURM_LAB_COMMAND_TIMEOUT` seconds, 300 unless set).
fn command_limit() -> Duration {
    let secs = std::env::var("SLURM_LAB_COMMAND_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    Duration::from_secs(secs)
}

/// A lab whose commands end after [`command_limit`].
fn start_limited(cfg: LabConfig) -> slurm_lab::Result<Lab> {
    let mut lab = Lab::start(cfg)?;
    lab.limit_commands(command_limit());
    Ok(lab)
}

/// The raw ids of the jobs in the queue (an array's tasks and a het job's
/// components each by their own id).
fn queued_jobs(lab: &Lab) -> std::collections::BTreeSet<u32> {
    let out = output(lab.command("squeue").args(["-h", "-o", "%A"]));
    out.map(|o| text(&o).0.lines().filter_map(|l| l.trim().parse().ok()).collect()).unwrap_or_default()
}

/// After a failed case: cancels the jobs it left (those queued now that were
/// not before it: never another case's fixture), then waits (a minute at
/// most) for them to leave the queue and for no node to be completing; with
/// nothing queued before the case, for every node to be idle.
fn settle(lab: &mut Lab, before: &std::collections::BTreeSet<u32>) -> Result<(), String> {
    let started = Instant::now();
    let limit = Duration::from_secs(60);
    let own: Vec<String> = queued_jobs(lab).difference(before).map(u32::to_string).collect();
    if !own.is_empty() {
        let _ = output(lab.command("scancel").arg("--quiet").args(&own));
    }
    loop {
        let (queue, _) = ok(lab.command("squeue").args(["-h", "-o", "%A %T %R"]))?;
        let left: Vec<&str> =
            queue.lines().filter(|l| own.iter().any(|j| l.split_whitespace().next() == Some(j))).collect();
        let (nodes, _) = ok(lab.command("sinfo").args(["-h", "-N", "-o", "%T"]))?;
        if left.is_empty() && !nodes.contains("completing") {
            break;
        }
        if started.elapsed() > limit {
            let reports: Vec<String> = left
                .iter()
                .filter_map(|l| l.split_whitespace().next()?.parse().ok())
                .take(2)
                .map(|j| lab.job_report(j))
                .collect();
            return Err(format!(
                "the case's jobs still queued after {limit:?}:\n{}\n{}",
                left.join("\n"),
                reports.join("\n")
            ));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    if before.is_empty() {
        return lab
            .wait_idle(limit.saturating_sub(started.elapsed()).max(Duration::from_secs(5)))
            .map_err(|e| e.to_string());
    }
    Ok(())
}

/// Stops `lab`, keeps its directory as `DIR.after-SETUP-CASE` (for a look at
/// what went wrong; every lab of the run uses DIR) and starts another with `cfg`.
fn restart(mut lab: Lab, cfg: LabConfig, case: &str) -> Result<Lab, String> {
    lab.keep_dir_on_stop();
    let _ = lab.stop();
    let kept = std::path::PathBuf::from(format!("{}.after-{case}", lab.dir.display()));
    match std::fs::rename(&lab.dir, &kept) {
        Ok(()) => println!("logs of the stopped cluster kept in {}", kept.display()),
        Err(e) => {
            println!("could not keep {}: {e}", lab.dir.display());
            let _ = std::fs::remove_dir_all(&lab.dir);
        }
    }
    drop(lab);
    start_limited(cfg).map_err(|e| format!("the fresh cluster did not start: {e}"))
}

fn main() {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    // Against an installed (release) package, the cases that need the debug
    // build's test-only plugstack keys cannot run; they run against the build tree.
    let installed = std::env::var_os("SLURM_LAB_INSTALLED").is_some();
    let release = match Release::from_env() {
        Ok(r) => r,
        Err(e) => {
            println!("test release_is_known ... FAILED\n{e}");
            std::process::exit(1);
        }
    };
    let mut plan: Vec<(String, LabConfig, Vec<&Case>)> = TaskSetup::ALL
        .into_iter()
        .map(|setup| {
            let cases =
                CASES.iter().filter(|c| wanted(c, setup, &filters, installed, release)).collect::<Vec<_>>();
            (setup.to_string(), lab_config(setup), cases)
        })
        .collect();
    let accounting: Vec<&Case> = CASES
        .iter()
        .filter(|c| {
            let full = format!("accounting::{}", c.name);
            c.accounting
                && (filters.is_empty() || filters.iter().any(|f| full.contains(f.as_str())))
                && (release.is_host() || !c.host_only)
        })
        .collect();
    plan.push((
        "accounting".to_owned(),
        // Three nodes: a 3-node job that leaves two idle (usage_names_the_nodes_no_step_ran_on).
        LabConfig { accounting: true, nodes: 3, ..lab_config(TaskSetup::None) },
        accounting,
    ));
    // A topology plugin whose switch (or block) order is the reverse of the node names:
    // topology/block exists from 23.11.
    let kinds: &[&str] = if release.number() >= (23, 11) { &["tree", "block"] } else { &["tree"] };
    for kind in kinds {
        let name = format!("topology-{kind}");
        let cases: Vec<&Case> = TOPOLOGY_CASES
            .iter()
            .filter(|c| {
                let full = format!("{name}::{}", c.name);
                filters.is_empty() || filters.iter().any(|f| full.contains(f.as_str()))
            })
            .collect();
        let (line, conf) = slurm_lab::reversed_topology(kind);
        let cfg =
            LabConfig { extra_conf: vec![line], topology_conf: Some(conf), ..lab_config(TaskSetup::None) };
        plan.push((name, cfg, cases));
    }
    // The container cases: a lab with pyxis and enroot per task setup they name, on the
    // host's release and on a root that carries enroot's tools (sid's), when the
    // third-party sources are there; else each is reported as not run, by name.
    let mut not_run = Vec::new();
    let mut tools_failed = None;
    let containers: Vec<&Case> = CASES
        .iter()
        .filter(|c| {
            let full = format!("{}::{}", c.setups.first().copied().unwrap_or_default(), c.name);
            c.containers
                && (filters.is_empty() || filters.iter().any(|f| full.contains(f.as_str())))
                && !(installed && c.debug_only)
                && (release.is_host() || !c.host_only)
                && release.runs_containers()
        })
        .collect();
    if !containers.is_empty() {
        let t = Instant::now();
        match slurm_lab::containers::Tools::ensure()
            .and_then(|t| t.map(|t| t.for_release(release)).transpose())
        {
            Ok(Some(tools)) => {
                println!("pyxis, enroot and their images ready in {:.1} s", t.elapsed().as_secs_f64());
                // One lab with containers per task setup that a container case names.
                for setup in TaskSetup::ALL {
                    let cases: Vec<&Case> =
                        containers.iter().copied().filter(|c| c.setups.contains(&setup)).collect();
                    if cases.is_empty() {
                        continue;
                    }
                    let c = slurm_lab::containers::ContainerConfig {
                        tools: tools.clone(),
                        order: slurm_lab::containers::Order::PyxisFirst,
                        pytorch_hook: false,
                    };
                    let cfg = LabConfig { containers: Some(c), ..lab_config(setup) };
                    plan.push((setup.to_string(), cfg, cases));
                }
            }
            Ok(None) => {
                for c in containers {
                    let name = format!("{}::{}", c.setups.first().copied().unwrap_or_default(), c.name);
                    println!("NOT RUN: {name} (../shared/third-party absent)");
                    not_run.push(name);
                }
            }
            Err(e) => tools_failed = Some((format!("{e}"), containers.len())),
        }
    }
    plan.retain(|(_, _, cases)| !cases.is_empty());
    let runs: usize =
        CASES.iter().map(|c| if c.accounting || c.containers { 1 } else { c.setups.len() }).sum::<usize>()
            + TOPOLOGY_CASES.len() * kinds.len();
    let runs = runs.max(plan.iter().map(|(_, _, c)| c.len()).sum());
    let selected: usize = plan.iter().map(|(_, _, c)| c.len()).sum();
    let filtered = runs.saturating_sub(selected + not_run.len() + tools_failed.as_ref().map_or(0, |t| t.1));
    if installed {
        println!("\ntesting the installed package: plugin {}", built_plugin().display());
    }
    // Issue 45: the Epilog health gate, on a 3-node cluster of its own, on every
    // release (expedited requeue from 25.11; before, the job just fails).
    let run_gate = !installed
        && (filters.is_empty()
            || filters
                .iter()
                .any(|f| "the_epilog_gate_requeues_the_job_off_a_bad_node".contains(f.as_str())));
    // valgrind runs the host's slurmstepd; what it checks is the plugin's own memory use.
    let valgrind = release.is_host()
        && (filters.is_empty()
            || filters.iter().any(|f| "plugin_is_clean_under_valgrind".contains(f.as_str())));
    println!(
        "\nrunning {} end-to-end tests on a local Slurm {release} cluster ({}), on {} clusters",
        selected + 2 * plan.len() + usize::from(valgrind) + usize::from(run_gate),
        release.distribution,
        plan.len()
    );

    // Assertion panics inside a case count as a failure of that case, quietly.
    panic::set_hook(Box::new(|info| eprintln!("{info}")));
    let (mut passed, mut failed) = (0, 0);
    if let Some((e, _)) = tools_failed {
        failed += 1;
        println!("test none+containers::pyxis_and_enroot_build ... FAILED\n{e}\n");
    }
    for (setup, cfg, cases) in plan {
        let (p, f) = run_setup(&setup, cfg, &cases);
        passed += p;
        failed += f;
    }
    if run_gate {
        let t = Instant::now();
        match gate::the_epilog_gate_requeues_the_job_off_a_bad_node() {
            Ok(summary) => {
                passed += 1;
                println!(
                    "test the_epilog_gate_requeues_the_job_off_a_bad_node ... ok ({:.1} s) {summary}",
                    t.elapsed().as_secs_f64()
                );
            }
            Err(why) => {
                failed += 1;
                println!("test the_epilog_gate_requeues_the_job_off_a_bad_node ... FAILED\n{why}\n");
            }
        }
    }
    if valgrind {
        let t = Instant::now();
        match valgrind_basics() {
            Ok(summary) => {
                passed += 1;
                println!(
                    "test plugin_is_clean_under_valgrind ... ok ({:.1} s) {summary}",
                    t.elapsed().as_secs_f64()
                );
            }
            Err(why) => {
                failed += 1;
                println!("test plugin_is_clean_under_valgrind ... FAILED\n{why}\n");
            }
        }
    }
    std::process::exit(summary(passed, failed, &not_run, filtered));
}
