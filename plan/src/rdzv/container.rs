//! Values a container runtime put in the task's environment after the tasks
//! forked, and who put them there (issue 29).
//!
//! With pyxis listed before spank_gpu in `plugstack.conf`, pyxis's
//! `task_init` runs first: it starts the enroot container and copies the
//! container's environment over the task's (`spank_import_container_env`,
//! with overwrite, except names given in `--container-env` or
//! `PYXIS_CONTAINER_ENV`), and for a PyTorch image (one whose environment has
//! `PYTORCH_VERSION`) then sets `RANK=$SLURM_PROCID` and
//! `LOCAL_RANK=$SLURM_LOCALID`, overwriting (`pytorch_setup`). The
//! container's environment is the image's (`/etc/environment`), enroot's
//! `environ.d` and its hooks': enroot's `50-slurm-pytorch.sh`, for PyTorch
//! images, writes `MASTER_ADDR` (the step's first node), `MASTER_PORT`
//! (`SLURM_JOB_ID % 4536 + 61000`, one port for every step of the job),
//! `WORLD_SIZE` (`SLURM_NTASKS`) and `OMP_NUM_THREADS=1` (when the step has
//! more tasks than nodes) unless the names are already in enroot's environ
//! file (they are when listed in `--container-env`).
//!
//! So spank_gpu's `task_init` then sees values that neither the user nor
//! the plugin set. `user_init` (before the fork, before pyxis's import) keeps
//! a [`Snapshot`] of the names the plugin sets; in `task_init`, [`changed`]
//! lists the names whose value differs from it, each with who most likely
//! set it ([`Setter`], recognised by the hook's and pyxis's formulas). Such a
//! value is treated like one from an enclosing step: the plugin plans the
//! task against the snapshot ([`Changed::before`]), so a value the user had
//! set before (their own export, which pyxis may have overwritten) wins
//! again, and every other is recomputed. A name the user listed in
//! `--container-env` keeps its job value through pyxis, so it is not changed.
//!
//! With spank_gpu listed before pyxis, SPANK runs spank_gpu's `task_init`
//! first: the plugin sets its values, then pyxis imports the container's
//! environment over them (a name in `--container-env` excepted) and, for a
//! PyTorch image, sets `RANK`/`LOCAL_RANK` from `SLURM_PROCID`/`SLURM_LOCALID`
//! whatever `--container-env` says. Nothing the plugin does can undo that;
//! it says so. The hook tells this order in the task ([`pyxis_runs_after`]):
//! pyxis runs the step in a container ([`PyxisStep`], from pyxis's options
//! as `user_init` reads them) and the task is still in slurmstepd's mount
//! namespace ([`MountNs`], kept by `user_init`), which pyxis's `task_init`
//! leaves (`setns(CLONE_NEWNS)`) before the plugin's runs in the other
//! order. Then the `verbose` line says which of its values the container
//! may replace and what keeps them ([`pyxis_after_words`]), and the slurmd
//! log gets one line per step ([`pyxis_after_log`]). Where the namespaces
//! differ for another reason (a job container plugin that joined the task to
//! the job's namespace after `user_init`, as job_container/tmpfs does unless
//! `user_init` runs inside it), or one cannot be read, the plugin cannot
//! tell and says nothing.

use slurm_formats::hostlist;

/// The names' values in the job's environment before the tasks forked
/// (`None`: unset), as `user_init` saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    vars: Vec<(String, Option<String>)>,
}

impl Snapshot {
    /// The values of `names` as `env` answers them now.
    pub fn take<'a>(
        names: impl IntoIterator<Item = &'a str>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Snapshot {
        let mut vars: Vec<(String, Option<String>)> = Vec::new();
        for name in names {
            if !vars.iter().any(|(n, _)| n == name) {
                vars.push((name.to_owned(), env(name)));
            }
        }
        Snapshot { vars }
    }

    /// The snapshot's value of `name`: `None` when it was unset or is not in the snapshot.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.iter().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref())
    }

    /// Whether `name` is one the snapshot holds.
    pub fn holds(&self, name: &str) -> bool {
        self.vars.iter().any(|(n, _)| n == name)
    }

    /// The names the snapshot holds, in the order taken.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.vars.iter().map(|(n, _)| n.as_str())
    }
}

/// Who put a value in the task's environment between `user_init` and `task_init`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setter {
    /// enroot's `50-slurm-pytorch.sh` hook (its formula matched).
    PytorchHook,
    /// pyxis for a PyTorch image: `RANK=$SLURM_PROCID`, `LOCAL_RANK=$SLURM_LOCALID`.
    PyxisPytorch,
    /// Something else in the container's environment (the image's own
    /// `/etc/environment`, enroot's `environ.d`, another hook), or another
    /// plugin listed before spank_gpu.
    Container,
}

impl Setter {
    /// In words, for `verbose` and `explain`.
    pub fn words(self) -> &'static str {
        match self {
            Setter::PytorchHook => "enroot's PyTorch hook",
            Setter::PyxisPytorch => "pyxis for a PyTorch image",
            Setter::Container => "the container's environment",
        }
    }
}

/// The step's facts the hook's and pyxis's formulas use, from the task's environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// `SLURM_JOB_ID`.
    pub job_id: Option<u32>,
    /// `SLURM_STEP_NODELIST` (the hook takes its first host as `MASTER_ADDR`).
    pub step_node_list: Option<String>,
    /// `SLURM_NTASKS` (the hook's `WORLD_SIZE`).
    pub ntasks: Option<String>,
    /// `SLURM_STEP_NUM_TASKS` and `SLURM_STEP_NUM_NODES` (the hook's `OMP_NUM_THREADS=1` test).
    pub step_tasks: Option<u32>,
    pub step_nodes: Option<u32>,
    /// `SLURM_PROCID` and `SLURM_LOCALID` (pyxis's `RANK` and `LOCAL_RANK`).
    pub procid: Option<String>,
    pub localid: Option<String>,
    /// Whether the task's environment now has `PYTORCH_VERSION` (a PyTorch image).
    pub pytorch: bool,
}

impl Facts {
    /// The facts from the task's environment.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Facts {
        let num = |n: &str| env(n).and_then(|v| v.trim().parse().ok());
        Facts {
            job_id: num("SLURM_JOB_ID"),
            step_node_list: env("SLURM_STEP_NODELIST"),
            ntasks: env("SLURM_NTASKS"),
            step_tasks: num("SLURM_STEP_NUM_TASKS"),
            step_nodes: num("SLURM_STEP_NUM_NODES"),
            procid: env("SLURM_PROCID"),
            localid: env("SLURM_LOCALID"),
            pytorch: env("PYTORCH_VERSION").is_some(),
        }
    }

    /// enroot's PyTorch hook's `MASTER_PORT` for this job.
    pub fn hook_port(&self) -> Option<u32> {
        self.job_id.map(|j| j % 4536 + 61000)
    }

    /// Who most likely set `name` to `now`.
    pub fn setter(&self, name: &str, now: &str) -> Setter {
        if !self.pytorch {
            return Setter::Container;
        }
        let is = |v: Option<&str>| v.is_some_and(|v| v.trim() == now.trim());
        let hook = match name {
            "MASTER_PORT" => is(self.hook_port().map(|p| p.to_string()).as_deref()),
            "MASTER_ADDR" => {
                let first = self.step_node_list.as_deref().and_then(|l| hostlist::first(l).ok());
                is(first.as_deref())
            }
            "WORLD_SIZE" => is(self.ntasks.as_deref()),
            "OMP_NUM_THREADS" => {
                now.trim() == "1" && self.step_tasks.unwrap_or(1) > self.step_nodes.unwrap_or(1)
            }
            _ => false,
        };
        let pyxis = match name {
            "RANK" => is(self.procid.as_deref()),
            "LOCAL_RANK" => is(self.localid.as_deref()),
            _ => false,
        };
        if pyxis {
            Setter::PyxisPytorch
        } else if hook {
            Setter::PytorchHook
        } else {
            Setter::Container
        }
    }
}

/// One name the container changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changed {
    /// The name.
    pub name: String,
    /// Its value before the tasks forked (`None`: unset).
    pub before: Option<String>,
    /// Its value now.
    pub now: String,
    /// Who most likely set it.
    pub by: Setter,
}

/// The names of `snapshot` whose value in `env` now differs from it (set or
/// changed; a name the container unset is not listed: the plugin sets it anyway).
pub fn changed(snapshot: &Snapshot, env: &dyn Fn(&str) -> Option<String>, facts: &Facts) -> Vec<Changed> {
    snapshot
        .vars
        .iter()
        .filter_map(|(name, before)| {
            let now = env(name)?;
            (before.as_deref() != Some(now.as_str())).then(|| Changed {
                name: name.clone(),
                before: before.clone(),
                by: facts.setter(name, &now),
                now,
            })
        })
        .collect()
}

/// The environment the plugin plans against: `env`, except that a name the
/// container changed has its value from before the fork.
pub fn before_container<'a>(
    changed: &'a [Changed],
    env: &'a dyn Fn(&str) -> Option<String>,
) -> impl Fn(&str) -> Option<String> + 'a {
    move |name: &str| match changed.iter().find(|c| c.name == name) {
        Some(c) => c.before.clone(),
        None => env(name),
    }
}

/// The `verbose` words for what the plugin replaced: `replaced MASTER_PORT=61004
/// (enroot's PyTorch hook) RANK=1 (pyxis for a PyTorch image)`; empty when nothing.
pub fn replaced_words(changed: &[Changed]) -> String {
    if changed.is_empty() {
        return String::new();
    }
    let items: Vec<String> =
        changed.iter().map(|c| format!("{}={} ({})", c.name, c.now, c.by.words())).collect();
    format!("replaced {}", items.join(" "))
}

/// A pyxis option the plugin reads in slurmstepd, and the job's environment
/// variable pyxis reads in its place when the option was not given (pyxis's
/// args.c, `pyxis_args_check_environment_variables`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyxisOption {
    /// The option's name, as pyxis registers it (`container-image`).
    pub name: &'static str,
    /// The variable (`PYXIS_CONTAINER_IMAGE`).
    pub env: &'static str,
}

/// `--container-image`: with it (or `--container-name`) pyxis runs the step in a container.
pub const PYXIS_IMAGE: PyxisOption = PyxisOption { name: "container-image", env: "PYXIS_CONTAINER_IMAGE" };
/// `--container-name`.
pub const PYXIS_NAME: PyxisOption = PyxisOption { name: "container-name", env: "PYXIS_CONTAINER_NAME" };
/// `--container-env`: the names whose job value pyxis's import keeps.
pub const PYXIS_ENV: PyxisOption = PyxisOption { name: "container-env", env: "PYXIS_CONTAINER_ENV" };
/// Every pyxis option the plugin reads.
pub const PYXIS_OPTIONS: [PyxisOption; 3] = [PYXIS_IMAGE, PYXIS_NAME, PYXIS_ENV];

/// What pyxis was asked for a step, as slurmstepd's `user_init` can tell.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PyxisStep {
    /// pyxis runs the step's tasks in an enroot container: `--container-image`
    /// or `--container-name` was given (or `PYXIS_CONTAINER_IMAGE`/`_NAME`),
    /// what pyxis's `pyxis_args_enabled` checks.
    pub container: bool,
    /// The names of `--container-env` (or `PYXIS_CONTAINER_ENV`): pyxis's
    /// import keeps their job values (`spank_setenv` without overwrite).
    pub keeps: Vec<String>,
}

impl PyxisStep {
    /// From pyxis's options (`option`: its argument, `None` when not given)
    /// and, for one not given, the job's variable pyxis reads instead (`env`).
    /// An empty argument is no argument: pyxis refuses it.
    pub fn from_options(
        option: &dyn Fn(PyxisOption) -> Option<String>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> PyxisStep {
        let value = |o: PyxisOption| option(o).or_else(|| env(o.env)).filter(|v| !v.is_empty());
        PyxisStep {
            container: value(PYXIS_IMAGE).is_some() || value(PYXIS_NAME).is_some(),
            keeps: value(PYXIS_ENV)
                .map(|v| v.split(',').filter(|n| !n.is_empty()).map(str::to_owned).collect())
                .unwrap_or_default(),
        }
    }
}

/// A mount namespace: the device and inode of `/proc/self/ns/mnt`
/// (namespaces(7): two processes share a namespace when both match).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountNs {
    pub dev: u64,
    pub ino: u64,
}

/// Whether pyxis runs after spank_gpu in this task (plugstack.conf lists
/// spank_gpu first): pyxis runs the step in a container, and the task is
/// still in the mount namespace slurmstepd was in at `user_init`
/// (`before_fork`), which pyxis's `task_init` leaves with
/// `setns(CLONE_NEWNS)`. A namespace that could not be read (`None`), or
/// another (pyxis listed first, or a job container plugin that moved the
/// task): cannot tell, so no.
pub fn pyxis_runs_after(pyxis: &PyxisStep, before_fork: Option<MountNs>, in_task: Option<MountNs>) -> bool {
    pyxis.container && before_fork.is_some() && before_fork == in_task
}

/// The names pyxis sets from `SLURM_*` for a PyTorch image after its
/// import, overwriting (pyxis_slurmstepd.c `pytorch_setup`), whatever
/// `--container-env` says.
const PYXIS_PYTORCH: [(&str, &str); 2] = [("RANK", "SLURM_PROCID"), ("LOCAL_RANK", "SLURM_LOCALID")];

/// The `verbose` clause when pyxis runs after spank_gpu ([`pyxis_runs_after`]):
/// which of the names the line gives a value for (`claimed`) pyxis may
/// still replace inside the container, and what keeps them. pyxis's import
/// replaces a name only where the container's environment sets it (the
/// image's, enroot's hooks'), so the words say "any of these that ...";
/// `keeps` (`--container-env`) keeps a name through the import, but not a
/// PyTorch image's `RANK`/`LOCAL_RANK`. `by_plugin`: `keeps` is the list the
/// plugin set as `PYXIS_CONTAINER_ENV` in `init_post_opt` (issue 46), said
/// as such. `None` when nothing can be replaced (and the list is the user's).
pub fn pyxis_after_words(claimed: &[&str], keeps: &[String], by_plugin: bool) -> Option<String> {
    let at_risk: Vec<&str> = claimed.iter().copied().filter(|n| !keeps.iter().any(|k| k == n)).collect();
    let remap: Vec<String> = PYXIS_PYTORCH
        .iter()
        .filter(|(n, _)| claimed.contains(n))
        .map(|(n, from)| format!("{n}=${from}"))
        .collect();
    let remap_words =
        (!remap.is_empty()).then(|| format!("for a PyTorch image pyxis sets {}", remap.join(" ")));
    let order = "pyxis runs after spank-gpu here (plugstack.conf lists spank_gpu first)";
    let admin = "ask your admin to list spank_gpu after pyxis";
    if by_plugin && at_risk.is_empty() {
        let kept = format!("{order}: spank-gpu set PYXIS_CONTAINER_ENV, so pyxis's import keeps its values");
        return Some(match remap_words {
            Some(remap) => format!("{kept}, but {remap} (the same values unless RANK follows node order)"),
            None => kept,
        });
    }
    if at_risk.is_empty() {
        let remap = remap_words?;
        return Some(format!(
            "{order}: your --container-env keeps these through its import, but {remap}; {admin}"
        ));
    }
    let mut words = format!(
        "{order}: inside the container, the container's value replaces any of {} that its \
         environment sets (enroot's PyTorch hook sets MASTER_ADDR MASTER_PORT WORLD_SIZE, and \
         OMP_NUM_THREADS=1 with more tasks than nodes)",
        at_risk.join(" ")
    );
    if let Some(remap) = remap_words {
        words.push_str(&format!(", and {remap}, which --container-env does not keep"));
    }
    let keep: Vec<&str> = keeps.iter().map(String::as_str).chain(at_risk.iter().copied()).collect();
    words.push_str(&format!("; {admin}, or pass --container-env={} to keep these", keep.join(",")));
    Some(words)
}

/// The line logged once per step and node when pyxis runs after spank_gpu.
pub fn pyxis_after_log(job_id: u32, step: &str) -> String {
    format!(
        "--auto-rdzv: step {job_id}.{step} runs in a pyxis container and pyxis runs after spank_gpu \
         (plugstack.conf lists spank_gpu first): the container's environment replaces inside it \
         the rendezvous values spank_gpu sets (enroot's PyTorch hook's MASTER_ADDR MASTER_PORT \
         WORLD_SIZE OMP_NUM_THREADS, pyxis's RANK LOCAL_RANK for PyTorch images); list spank_gpu \
         after pyxis in plugstack.conf"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    }

    const NAMES: &[&str] =
        &["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "OMP_NUM_THREADS"];

    /// The task of job 42, step 0 (-N1 -n2), local 1, after pyxis imported a
    /// PyTorch image's environment with enroot's hook on.
    const AFTER_PYXIS: &[(&str, &str)] = &[
        ("SLURM_JOB_ID", "42"),
        ("SLURM_STEP_NODELIST", "node[1-2]"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_STEP_NUM_TASKS", "2"),
        ("SLURM_STEP_NUM_NODES", "1"),
        ("SLURM_PROCID", "1"),
        ("SLURM_LOCALID", "1"),
        ("PYTORCH_VERSION", "2.5.0"),
        ("MASTER_ADDR", "node1"),
        ("MASTER_PORT", "61042"),
        ("WORLD_SIZE", "2"),
        ("RANK", "1"),
        ("LOCAL_RANK", "1"),
        ("OMP_NUM_THREADS", "1"),
    ];

    #[test]
    fn the_hooks_and_pyxiss_values_are_named_by_their_formulas() {
        let before = Snapshot::take(NAMES.iter().copied(), &env_of(&[]));
        let env = env_of(AFTER_PYXIS);
        let facts = Facts::from_env(&env);
        assert_eq!(facts.hook_port(), Some(61042));
        let got: Vec<(String, Setter)> =
            changed(&before, &env, &facts).into_iter().map(|c| (c.name, c.by)).collect();
        assert_eq!(
            got,
            vec![
                ("MASTER_ADDR".to_owned(), Setter::PytorchHook),
                ("MASTER_PORT".to_owned(), Setter::PytorchHook),
                ("WORLD_SIZE".to_owned(), Setter::PytorchHook),
                ("RANK".to_owned(), Setter::PyxisPytorch),
                ("LOCAL_RANK".to_owned(), Setter::PyxisPytorch),
                ("OMP_NUM_THREADS".to_owned(), Setter::PytorchHook),
            ]
        );
    }

    #[test]
    fn values_off_the_formulas_or_without_pytorch_are_the_containers() {
        let before = Snapshot::take(NAMES.iter().copied(), &env_of(&[]));
        // Another port, and one task per node: the hook sets no OMP_NUM_THREADS.
        let mut pairs: Vec<(&str, &str)> = AFTER_PYXIS.to_vec();
        for (n, v) in &mut pairs {
            match *n {
                "MASTER_PORT" => *v = "29500",
                "SLURM_STEP_NUM_NODES" => *v = "2",
                _ => {}
            }
        }
        let env = env_of(&pairs);
        let by = |name: &str| {
            changed(&before, &env, &Facts::from_env(&env)).into_iter().find(|c| c.name == name).map(|c| c.by)
        };
        assert_eq!(by("MASTER_PORT"), Some(Setter::Container));
        assert_eq!(by("OMP_NUM_THREADS"), Some(Setter::Container));
        assert_eq!(by("WORLD_SIZE"), Some(Setter::PytorchHook));
        // A plain image: whatever it set is the container's.
        let plain: Vec<(&str, &str)> =
            pairs.iter().copied().filter(|(n, _)| *n != "PYTORCH_VERSION").collect();
        let env = env_of(&plain);
        let facts = Facts::from_env(&env);
        let changes = changed(&before, &env, &facts);
        assert_eq!(changes.len(), NAMES.len());
        assert!(changes.iter().all(|c| c.by == Setter::Container));
    }

    #[test]
    fn unchanged_values_are_not_listed_and_the_plan_sees_the_values_before_the_fork() {
        // The user exported MASTER_PORT=23456 and listed it in --container-env: pyxis kept
        // it. They also exported RANK=7, which pyxis's PyTorch remap overwrote.
        let job = [("MASTER_PORT", "23456"), ("RANK", "7")];
        let before = Snapshot::take(NAMES.iter().copied(), &env_of(&job));
        let mut pairs: Vec<(&str, &str)> = AFTER_PYXIS.to_vec();
        for (n, v) in &mut pairs {
            if *n == "MASTER_PORT" {
                *v = "23456";
            }
        }
        let env = env_of(&pairs);
        let facts = Facts::from_env(&env);
        let changes = changed(&before, &env, &facts);
        assert!(!changes.iter().any(|c| c.name == "MASTER_PORT"), "{changes:?}");
        let rank = changes.iter().find(|c| c.name == "RANK").expect("RANK changed");
        assert_eq!((rank.before.as_deref(), rank.now.as_str()), (Some("7"), "1"));
        let planned = before_container(&changes, &env);
        assert_eq!(planned("RANK").as_deref(), Some("7"));
        assert_eq!(planned("MASTER_PORT").as_deref(), Some("23456"));
        assert_eq!(planned("WORLD_SIZE"), None);
        assert_eq!(planned("SLURM_PROCID").as_deref(), Some("1"));
        assert_eq!(
            replaced_words(&changes[..1]),
            "replaced MASTER_ADDR=node1 (enroot's PyTorch hook)".to_owned()
        );
        assert_eq!(replaced_words(&[]), "");
    }

    #[test]
    fn nothing_changed_when_the_plugin_runs_first() {
        let env = env_of(AFTER_PYXIS);
        let before = Snapshot::take(NAMES.iter().copied(), &env);
        assert!(changed(&before, &env, &Facts::from_env(&env)).is_empty());
        assert!(before.holds("RANK") && !before.holds("SLURM_PROCID"));
        assert_eq!(before.get("MASTER_PORT"), Some("61042"));
    }

    fn pyxis(image: Option<&str>, keeps: Option<&str>, env: &[(&str, &str)]) -> PyxisStep {
        let option = |o: PyxisOption| match o.name {
            "container-image" => image.map(str::to_owned),
            "container-env" => keeps.map(str::to_owned),
            _ => None,
        };
        PyxisStep::from_options(&option, &env_of(env))
    }

    #[test]
    fn pyxis_runs_after_only_with_a_container_and_the_same_mount_namespace() {
        let host = MountNs { dev: 4, ino: 4_026_531_841 };
        let container = MountNs { dev: 4, ino: 4_026_532_900 };
        let with = pyxis(Some("nvcr.io#nvidia/pytorch:24.05-py3"), None, &[]);
        assert!(with.container && with.keeps.is_empty());
        // spank_gpu first: the task is still where slurmstepd was.
        assert!(pyxis_runs_after(&with, Some(host), Some(host)));
        // pyxis first: its task_init moved the task into the container's namespace.
        assert!(!pyxis_runs_after(&with, Some(host), Some(container)));
        // Cannot tell: either namespace unknown.
        assert!(!pyxis_runs_after(&with, None, Some(host)));
        assert!(!pyxis_runs_after(&with, Some(host), None));
        assert!(!pyxis_runs_after(&with, None, None));
        // No container: pyxis does nothing in task_init.
        let without = pyxis(None, Some("MASTER_PORT"), &[]);
        assert!(!without.container);
        assert!(!pyxis_runs_after(&without, Some(host), Some(host)));
    }

    #[test]
    fn pyxis_options_fall_back_to_its_variables_and_empty_is_none() {
        let by_env = pyxis(None, None, &[("PYXIS_CONTAINER_NAME", "mine"), ("PYXIS_CONTAINER_ENV", "A,,B")]);
        assert_eq!(by_env, PyxisStep { container: true, keeps: vec!["A".into(), "B".into()] });
        // The option wins over the variable, as in pyxis.
        let both = pyxis(None, Some("MASTER_PORT"), &[("PYXIS_CONTAINER_ENV", "A")]);
        assert_eq!(both.keeps, vec!["MASTER_PORT".to_owned()]);
        assert!(!pyxis(Some(""), None, &[("PYXIS_CONTAINER_IMAGE", "")]).container);
        assert_eq!(PYXIS_OPTIONS.map(|o| o.name), ["container-image", "container-name", "container-env"]);
    }

    #[test]
    fn the_pyxis_after_clause_names_what_may_be_replaced_and_what_keeps_it() {
        let claimed = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS"];
        let words = pyxis_after_words(&claimed, &[], false).expect("a clause");
        assert_eq!(
            words,
            "pyxis runs after spank-gpu here (plugstack.conf lists spank_gpu first): inside the \
             container, the container's value replaces any of MASTER_ADDR MASTER_PORT RANK WORLD_SIZE \
             LOCAL_RANK OMP_NUM_THREADS that its environment sets (enroot's PyTorch hook sets \
             MASTER_ADDR MASTER_PORT WORLD_SIZE, and OMP_NUM_THREADS=1 with more tasks than nodes), \
             and for a PyTorch image pyxis sets RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID, which \
             --container-env does not keep; ask your admin to list spank_gpu after pyxis, or pass \
             --container-env=MASTER_ADDR,MASTER_PORT,RANK,WORLD_SIZE,LOCAL_RANK,OMP_NUM_THREADS to keep these"
        );
        // What the user already keeps is not at risk; their list is kept in the advice.
        let keeps = vec!["HOME".to_owned(), "MASTER_PORT".to_owned()];
        let words = pyxis_after_words(&["MASTER_ADDR", "MASTER_PORT"], &keeps, false).expect("a clause");
        assert!(words.contains("replaces any of MASTER_ADDR that"), "{words}");
        assert!(!words.contains("PyTorch image pyxis sets"), "no RANK claimed: {words}");
        assert!(words.ends_with("--container-env=HOME,MASTER_PORT,MASTER_ADDR to keep these"), "{words}");
        // Everything kept but a PyTorch image's ranks.
        let keeps: Vec<String> = claimed.iter().map(|n| (*n).to_owned()).collect();
        let words = pyxis_after_words(&claimed, &keeps, false).expect("a clause");
        assert_eq!(
            words,
            "pyxis runs after spank-gpu here (plugstack.conf lists spank_gpu first): your \
             --container-env keeps these through its import, but for a PyTorch image pyxis sets \
             RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID; ask your admin to list spank_gpu after pyxis"
        );
        assert_eq!(pyxis_after_words(&["MASTER_PORT"], &["MASTER_PORT".to_owned()], false), None);
        assert_eq!(pyxis_after_words(&[], &[], false), None);
        // The plugin's own list (issue 46): kept, said so; a PyTorch image's RANK still pyxis's.
        let ours: Vec<String> = ["MASTER_ADDR", "MASTER_PORT", "RANK"].map(str::to_owned).to_vec();
        let words =
            pyxis_after_words(&["MASTER_ADDR", "MASTER_PORT", "RANK"], &ours, true).expect("a clause");
        assert!(
            words.contains("spank-gpu set PYXIS_CONTAINER_ENV, so pyxis's import keeps its values, but"),
            "{words}"
        );
        assert!(words.contains("RANK=$SLURM_PROCID"), "{words}");
        let words = pyxis_after_words(&["MASTER_PORT"], &ours, true).expect("a clause");
        assert!(words.ends_with("keeps its values"), "{words}");
        assert!(pyxis_after_log(77, "0").starts_with("--auto-rdzv: step 77.0 runs in a pyxis container"));
    }
}
