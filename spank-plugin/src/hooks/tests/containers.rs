//! pyxis and its container: values it changed, the order of the plugins.

use super::super::fake::FakeSpank;
use super::*;

/// pyxis listed before spank_gpu: between user_init and task_init pyxis copies
/// a PyTorch image's environment (with enroot's hook on) over the task's and
/// sets RANK=SLURM_PROCID. The plugin recomputes those values, names who set
/// them, and gives back the user's own export the import overwrote.
#[test]
fn values_a_container_set_after_the_fork_are_recomputed_and_named() {
    let mut sp = FakeSpank::task(0, 1, 1);
    sp.options.insert("auto-rdzv", "verbose".into());
    for (k, v) in [("SLURM_JOB_ID", "77"), ("SLURM_NTASKS", "4"), ("SLURM_STEP_NUM_TASKS", "4")] {
        sp.env.insert(k.into(), v.into());
    }
    sp.env.insert("SLURM_STEP_NUM_NODES".into(), "2".into());
    // The user's own export, before the fork.
    sp.env.insert("OMP_NUM_THREADS".into(), "6".into());
    let st = user_init(&mut sp, &[]).unwrap();
    // A plain run of the same task: the plugin's own values.
    let mut plain = FakeSpank::task(0, 1, 1);
    plain.options.insert("auto-rdzv", String::new());
    task_init(&mut plain, &[], None).unwrap();
    let mine = plain.var("MASTER_PORT").unwrap().to_owned();
    assert_ne!(mine, "61077");
    // pyxis's import and remap.
    sp.env.insert("SLURM_PROCID".into(), "1".into());
    sp.env.insert("SLURM_LOCALID".into(), "1".into());
    for (k, v) in [
        ("PYTORCH_VERSION", "2.5.0"),
        ("MASTER_ADDR", "node1"),
        ("MASTER_PORT", "61077"),
        ("WORLD_SIZE", "4"),
        ("OMP_NUM_THREADS", "1"),
        ("RANK", "1"),
        ("LOCAL_RANK", "1"),
    ] {
        sp.env.insert(k.into(), v.into());
    }
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.var("MASTER_PORT"), Some(mine.as_str()));
    assert_eq!(sp.var("OMP_NUM_THREADS"), Some("6"), "the user's export wins again");
    assert_eq!(sp.var("RANK"), Some("1"));
    let err = sp.stderr.borrow().join("\n");
    assert!(err.contains(&format!("MASTER_PORT={mine} (job 77 step 0")), "{err}");
    assert!(err.contains("replaced MASTER_PORT=61077 (enroot's PyTorch hook)"), "{err}");
    // The hook's MASTER_ADDR is the value user_init set before the fork: nothing was replaced.
    assert!(!err.contains("replaced MASTER_ADDR"), "{err}");
    assert!(err.contains("RANK=1 (pyxis for a PyTorch image)"), "{err}");
    assert!(err.contains("OMP_NUM_THREADS=6 (set by you"), "{err}");
    assert!(!err.contains("MASTER_PORT=61077 (set by you"), "{err}");

    // Without a snapshot (the plugin before pyxis, or no container) nothing is replaced.
    let mut sp = FakeSpank::task(0, 1, 1);
    sp.options.insert("auto-rdzv", "verbose".into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert!(!sp.stderr.borrow().join("\n").contains("replaced"));
}

/// Task `local` (global `local`) on node 1 with `--auto-rdzv=verbose`, given
/// pyxis's options (`pyxis`), through user_init and task_init; `between`
/// runs between the two (pyxis's task_init, when pyxis is listed first).
fn with_pyxis(local: u32, pyxis: &[(&'static str, &str)], between: impl FnOnce(&mut FakeSpank)) -> FakeSpank {
    let mut sp = FakeSpank::task(0, local, local);
    sp.options.insert("auto-rdzv", "verbose".into());
    for (name, value) in pyxis {
        sp.foreign_options.insert(name, (*value).to_owned());
    }
    let st = user_init(&mut sp, &[]).unwrap();
    between(&mut sp);
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    sp
}

/// The variables the plugin sets for task `local` without pyxis.
fn plain_values(local: u32) -> Vec<(String, String)> {
    values(&with_pyxis(local, &[], |_| {}))
}

/// The task's environment after task_init, pyxis's own variables aside.
fn values(sp: &FakeSpank) -> Vec<(String, String)> {
    sp.env.iter().filter(|(k, _)| !k.starts_with("PYXIS_")).map(|(k, v)| (k.clone(), v.clone())).collect()
}

const IMAGE: (&str, &str) = ("container-image", "nvcr.io#nvidia/pytorch:24.05-py3");

#[test]
fn spank_gpu_before_pyxis_says_the_container_may_replace_its_values() {
    for local in [0, 1] {
        let sp = with_pyxis(local, &[IMAGE], |_| {});
        assert_eq!(values(&sp), plain_values(local), "task {local}: what is set does not change");
        let err = sp.stderr.borrow().clone();
        // The task's line, and the first task's network line.
        assert_eq!(err.len(), if local == 0 { 2 } else { 1 }, "{err:?}");
        assert!(err[1..].iter().all(|l| l.starts_with("spank-gpu: network on node1: ")), "{err:?}");
        assert!(
            err[0].starts_with(&format!(
                "spank-gpu: task {local} (node1 local {local}): set MASTER_ADDR=node1"
            ))
        );
        assert!(
            err[0].contains(
                "; pyxis runs after spank-gpu here (plugstack.conf lists spank_gpu first): inside the container, \
                 the container's value replaces any of MASTER_ADDR MASTER_PORT RANK"
            ),
            "{err:?}"
        );
        assert!(
            err[0].contains("for a PyTorch image pyxis sets RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID")
        );
        assert!(err[0].contains("or pass --container-env=MASTER_ADDR,MASTER_PORT,RANK,"), "{err:?}");
        // One line per step and node, from its first task, at the plugin's warning level.
        let log = sp.log.borrow().clone();
        if local == 0 {
            assert_eq!(log.len(), 1, "{log:?}");
            assert_eq!(log[0].0, Level::Error);
            assert!(log[0].1.starts_with(
                "--auto-rdzv: step 77.0 runs in a pyxis container and pyxis runs after spank_gpu"
            ));
        } else {
            assert!(log.is_empty(), "{log:?}");
        }
    }
    // pyxis's variables stand for its options; --container-env's names are kept by pyxis.
    let mut sp = FakeSpank::task(0, 1, 1);
    sp.options.insert("auto-rdzv", "verbose".into());
    sp.env.insert("PYXIS_CONTAINER_NAME".into(), "mine".into());
    sp.env.insert("PYXIS_CONTAINER_ENV".into(), "MASTER_ADDR,MASTER_PORT".into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    let err = sp.stderr.borrow().join("\n");
    assert!(err.contains("replaces any of RANK WORLD_SIZE"), "{err}");
    assert!(err.contains("--container-env=MASTER_ADDR,MASTER_PORT,RANK,WORLD_SIZE,"), "{err}");
}

#[test]
fn pyxis_before_spank_gpu_moves_the_task_and_nothing_more_is_said() {
    use super::fake::CONTAINER_MOUNT_NS;
    for local in [0, 1] {
        // pyxis's task_init first: setns into the container's mount namespace.
        let sp = with_pyxis(local, &[IMAGE], |sp| sp.mount_ns = CONTAINER_MOUNT_NS);
        assert_eq!(values(&sp), plain_values(local), "task {local}");
        let err = sp.stderr.borrow().join("\n");
        assert!(!err.contains("pyxis runs after"), "{err}");
        assert!(sp.log.borrow().is_empty(), "{:?}", sp.log.borrow());
    }
}

#[test]
fn without_a_pyxis_container_the_mount_namespace_is_not_read() {
    for local in [0, 1] {
        let mut sp = FakeSpank::task(0, local, local);
        sp.options.insert("auto-rdzv", "verbose".into());
        // Options of pyxis's that start no container.
        sp.foreign_options.insert("container-env", "MASTER_PORT".into());
        sp.foreign_options.insert("container-mounts", "/data:/data".into());
        let mut sp = sp.failing("mount_ns");
        let st = user_init(&mut sp, &[]).unwrap();
        assert_eq!(st.as_ref().map(|s| (s.pyxis.is_none(), s.mount_ns)), Some((true, None)));
        task_init(&mut sp, &[], st.as_ref()).unwrap();
        assert_eq!(values(&sp), plain_values(local));
        assert!(!sp.stderr.borrow().join("\n").contains("pyxis"), "{:?}", sp.stderr.borrow());
        assert!(sp.log.borrow().is_empty(), "never read, nothing logged: {:?}", sp.log.borrow());
    }
}

#[test]
fn an_unreadable_mount_namespace_cannot_tell_and_says_nothing() {
    // Unreadable in user_init (then not read again), or in the task only.
    for in_task_only in [false, true] {
        let sp = if in_task_only {
            with_pyxis(0, &[IMAGE], |sp| {
                sp.fail.insert("mount_ns".into());
            })
        } else {
            let mut sp = FakeSpank::task(0, 0, 0).failing("mount_ns");
            sp.options.insert("auto-rdzv", "verbose".into());
            sp.foreign_options.insert(IMAGE.0, IMAGE.1.into());
            let st = user_init(&mut sp, &[]).unwrap();
            assert_eq!(st.as_ref().map(|s| (s.pyxis.is_some(), s.mount_ns)), Some((true, None)));
            task_init(&mut sp, &[], st.as_ref()).unwrap();
            sp
        };
        assert_eq!(values(&sp), plain_values(0), "in the task only: {in_task_only}");
        assert!(!sp.stderr.borrow().join("\n").contains("pyxis"), "{:?}", sp.stderr.borrow());
        assert!(sp.errors().is_empty(), "{:?}", sp.log.borrow());
        let log = sp.log.borrow().clone();
        assert_eq!(log.len(), 1, "one debug line: {log:?}");
        assert_eq!(log[0].0, Level::Debug);
        assert!(log[0].1.contains("cannot tell whether pyxis runs after spank-gpu"), "{log:?}");
    }
    // pyxis's option unreadable: not given, one debug line.
    let mut sp = FakeSpank::task(0, 0, 0).failing("foreign_option:container-image");
    sp.options.insert("auto-rdzv", "verbose".into());
    sp.foreign_options.insert(IMAGE.0, IMAGE.1.into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert!(!sp.stderr.borrow().join("\n").contains("pyxis runs after"));
    let log = sp.log.borrow().clone();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].0, Level::Debug);
    assert!(log[0].1.starts_with("--auto-rdzv: reading pyxis's options: --container-image: "), "{log:?}");
}

/// A task of a pyxis step in slurmstepd whose plugstack lists `first` before the other.
fn ordered(gpu_first: bool) -> FakeSpank {
    let mut sp = FakeSpank::task(0, 1, 1);
    sp.options.insert("auto-rdzv", "verbose".into());
    sp.foreign_options.insert("container-image", "nvcr.io#nvidia/pytorch:24.09-py3".into());
    sp.stepd_conf = Some(crate::spank::StepdConf {
        task_plugin: None,
        path: Some("/etc/slurm/slurm.conf".into()),
        plugstack: Some("/etc/slurm/plugstack.conf".into()),
    });
    let (a, b) =
        if gpu_first { ("00-site.conf", "10-pyxis.conf") } else { ("20-spank-gpu.conf", "10-pyxis.conf") };
    sp.files
        .insert("/etc/slurm/plugstack.conf".into(), "include /etc/slurm/plugstack.conf.d/*.conf\n".into());
    sp.files
        .insert(format!("/etc/slurm/plugstack.conf.d/{a}"), "optional /usr/lib/slurm/spank_gpu.so\n".into());
    sp.files.insert(
        format!("/etc/slurm/plugstack.conf.d/{b}"),
        "required /usr/lib/slurm/spank_pyxis.so\n".into(),
    );
    sp
}

/// Issue 46: spank_gpu listed before pyxis: its `init_post_opt` names its
/// variables in `PYXIS_CONTAINER_ENV`, which pyxis's (after it) reads where
/// the user gave no `--container-env`; verbose then says pyxis keeps them,
/// and the step's error line is not logged. `user_init` takes the list back
/// where no container runs or the user's `--container-env` replaced it.
/// pyxis first, the user's own variable, or a plugstack that cannot be read:
/// nothing is set.
#[test]
fn spank_gpu_before_pyxis_asks_pyxis_to_keep_its_values() {
    let mut sp = ordered(true);
    init_post_opt(&mut sp, &[]).unwrap();
    let list = sp.var("PYXIS_CONTAINER_ENV").unwrap_or_default().to_owned();
    assert!(list.starts_with("MASTER_ADDR,MASTER_PORT,RANK,WORLD_SIZE,"), "{list}");
    assert!(list.contains("OMP_NUM_THREADS") && !list.contains(rdzv::RECORD_VAR), "{list}");
    let st = user_init(&mut sp, &[]).unwrap();
    assert_eq!(st.as_ref().and_then(|s| s.pyxis.as_ref()).map(|p| p.keeps.join(",")), Some(list.clone()));
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.var("PYXIS_CONTAINER_ENV"), Some(list.as_str()), "a container step's tasks see it");
    let err = sp.stderr.borrow().join("\n");
    assert!(
        err.contains(
            "spank-gpu set PYXIS_CONTAINER_ENV, so pyxis's import keeps its values, but for a PyTorch image \
             pyxis sets RANK=$SLURM_PROCID"
        ),
        "{err}"
    );
    assert!(sp.log.borrow().is_empty(), "{:?}", sp.log.borrow());
    // Outside slurmstepd the hook does nothing.
    let mut srun = ordered(true);
    srun.context = Context::Local;
    init_post_opt(&mut srun, &[]).unwrap();
    assert_eq!(srun.var("PYXIS_CONTAINER_ENV"), None);

    // pyxis first (the package's order): pyxis has read its variables already.
    let mut sp = ordered(false);
    init_post_opt(&mut sp, &[]).unwrap();
    assert_eq!(sp.var("PYXIS_CONTAINER_ENV"), None);
    // The user's own variable: theirs.
    let mut sp = ordered(true);
    sp.env.insert("PYXIS_CONTAINER_ENV".into(), "HOME".into());
    init_post_opt(&mut sp, &[]).unwrap();
    user_init(&mut sp, &[]).unwrap();
    assert_eq!(sp.var("PYXIS_CONTAINER_ENV"), Some("HOME"));
    // The user's own --container-env (pyxis keeps theirs), or no container: taken back before the fork.
    let mut own = ordered(true);
    own.foreign_options.insert("container-env", "MASTER_PORT".into());
    let mut plain = ordered(true);
    plain.foreign_options.clear();
    for mut sp in [own, plain] {
        init_post_opt(&mut sp, &[]).unwrap();
        assert!(sp.var("PYXIS_CONTAINER_ENV").is_some());
        user_init(&mut sp, &[]).unwrap();
        assert_eq!(sp.var("PYXIS_CONTAINER_ENV"), None);
    }
    // No --auto-rdzv.
    let mut sp = ordered(true);
    sp.options.clear();
    init_post_opt(&mut sp, &[]).unwrap();
    assert_eq!(sp.var("PYXIS_CONTAINER_ENV"), None);
    // Each seam failing: nothing set, the step runs, at most one line.
    for seam in ["stepd_conf", "read_trusted", "dir_names", "setenv:PYXIS_CONTAINER_ENV"] {
        let mut sp = ordered(true).failing(seam);
        assert!(init_post_opt(&mut sp, &[]).is_ok(), "{seam}");
        assert_eq!(sp.var("PYXIS_CONTAINER_ENV"), None, "{seam}");
        assert!(sp.log.borrow().len() <= 1, "{seam}: {:?}", sp.log.borrow());
    }
    let mut sp = ordered(true).failing("option_arg");
    assert!(init_post_opt(&mut sp, &[]).is_err(), "an internal error, which the guard logs; the step runs");
}
