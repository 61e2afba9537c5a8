//! 19: a job of more than one node whose batch script starts nothing on the
//! other nodes. Slurm runs the batch script on the first node of the
//! allocation only; a program reaches the other nodes through a step
//! (`srun`), an MPI launcher (which starts its daemons through Slurm or a
//! remote shell) or a remote shell (`ssh`, `pdsh`, `clush`). The guide's two
//! multi-node patterns both start with `srun`. `torchrun` starts processes
//! only on the node it runs on, whatever its `--nnodes`.
//!
//! Said only where lint sees all that the script runs: a command it cannot
//! see into (a called script, `eval`, a variable as the command, a program
//! it does not know) may start the launcher itself, and then it is a note.

use slurm_formats::text::clip;

use super::getopt::ArgWord;
use super::job::{Job, Origin, Request, launcher_start};
use super::shell::{Command, Word};
use super::traps::{flag_value, launcher, shown};
use super::values;
use super::{Report, Trap};

/// Programs that start tasks on other nodes, wherever they appear in a
/// command (`timeout 1h srun ...`, `xargs -P4 ssh ...`, `bash -c 'srun ...'`).
const LAUNCHERS: &[&str] = &[
    "srun",
    "mpirun",
    "mpiexec",
    "mpiexec.hydra",
    "orterun",
    "prterun",
    "prun",
    "oshrun",
    "shmemrun",
    "mpirun_rsh",
    "ibrun",
    "charmrun",
    "horovodrun",
    "aprun",
    "jsrun",
    "pdsh",
    "clush",
    "pssh",
    "parallel-ssh",
    "ssh",
    "rsh",
    "pbsdsh",
];

/// Programs that start no task anywhere and run nothing lint cannot see:
/// the shell's builtins, file and text tools, Slurm's clients, environment setup.
const QUIET: &[&str] = &[
    ":",
    "[",
    "[[",
    "alias",
    "awk",
    "basename",
    "bc",
    "break",
    "cat",
    "cd",
    "chmod",
    "continue",
    "cp",
    "curl",
    "cut",
    "date",
    "declare",
    "df",
    "dirname",
    "du",
    "echo",
    "exit",
    "export",
    "expr",
    "false",
    "find",
    "free",
    "getopts",
    "git",
    "grep",
    "gunzip",
    "gzip",
    "hash",
    "head",
    "hostname",
    "huggingface-cli",
    "ibstat",
    "ibv_devinfo",
    "id",
    "ip",
    "jq",
    "kill",
    "let",
    "ln",
    "local",
    "ls",
    "lscpu",
    "mkdir",
    "mktemp",
    "ml",
    "module",
    "mv",
    "nproc",
    "nvidia-smi",
    "pip",
    "pip3",
    "popd",
    "printenv",
    "printf",
    "ps",
    "pushd",
    "pwd",
    "read",
    "readlink",
    "readonly",
    "realpath",
    "return",
    "rm",
    "rmdir",
    "rsync",
    "sacct",
    "sbatch",
    "scancel",
    "scontrol",
    "sed",
    "seff",
    "seq",
    "set",
    "shift",
    "shopt",
    "sinfo",
    "sleep",
    "sort",
    "squeue",
    "sstat",
    "stat",
    "sync",
    "tail",
    "tar",
    "tee",
    "test",
    "touch",
    "tr",
    "trap",
    "true",
    "type",
    "typeset",
    "ulimit",
    "umask",
    "uname",
    "uniq",
    "unset",
    "wait",
    "wandb",
    "wc",
    "wget",
    "which",
    "whoami",
    "zstd",
];

/// `source FILE` / `. FILE` runs FILE in the script's shell: quiet for the
/// files that only set up an environment (a virtualenv's `activate`, a
/// module or conda init, a shell profile), opaque for any other (it may
/// start the launcher itself).
fn sources_setup(file: &str) -> bool {
    let b = base(file);
    matches!(b, "activate" | "activate.sh" | ".bashrc" | ".bash_profile" | ".profile" | "bashrc" | "profile")
        || b.starts_with("conda.") && b.ends_with("sh")
        || file.starts_with("/etc/profile")
        || file.contains("/modules/init/")
        || file.contains("/lmod/")
        || b.starts_with("lmod")
        || b == "spack"
        || b == "setup-env.sh"
}

/// Programs that run the command after their own words (`timeout 1h python ...`).
const WRAPPERS: &[&str] = &[
    "apptainer",
    "chrt",
    "docker",
    "enroot",
    "ionice",
    "ncu",
    "nice",
    "nsys",
    "numactl",
    "parallel",
    "podman",
    "singularity",
    "stdbuf",
    "taskset",
    "timeout",
    "unbuffer",
    "xargs",
];

/// Environment managers that run a command with `run` (`uv run python ...`)
/// and set up the environment otherwise (`conda activate`).
const RUNNERS: &[&str] = &["conda", "mamba", "micromamba", "pipenv", "pixi", "poetry", "spack", "uv"];

fn base(w: &str) -> &str {
    w.rsplit('/').next().unwrap_or(w)
}

/// A program that does the job's work on the node it runs on.
fn is_work(name: &str) -> bool {
    let b = base(name);
    let python = b.strip_prefix("python").is_some_and(|v| v.bytes().all(|c| c.is_ascii_digit() || c == b'.'));
    python
        || name.ends_with(".py")
        || matches!(b, "torchrun" | "deepspeed" | "accelerate" | "julia" | "Rscript")
}

/// Whether a word names a launcher anywhere in it (`bash -c 'srun x'`, `$(srun ...)`).
fn names_launcher(text: &str) -> bool {
    text.split(|c: char| c.is_whitespace() || ";&|()`'\"{}<>=,".contains(c))
        .any(|t| LAUNCHERS.contains(&base(t)))
}

/// What one command does for this trap.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// It starts (or may start) tasks on other nodes.
    Launcher,
    /// It runs something lint cannot see into, in words.
    Opaque(String),
    /// It is the job's work: the index of its program word.
    Work(usize),
    /// Neither.
    Quiet,
}

fn kind(c: &Command, functions: &[&str]) -> Kind {
    let raw = |w: &Word| w.raw();
    if c.words.iter().chain(c.assigns.iter().map(|(_, w)| w)).any(|w| names_launcher(&raw(w))) {
        return Kind::Launcher;
    }
    let start = launcher_start(c);
    let Some(first) = c.words.get(start) else { return Kind::Quiet };
    let Some(name) = first.literal() else { return Kind::Opaque(clip(&first.raw(), 40)) };
    let b = base(&name);
    let lit = |i: usize| c.words.get(i).and_then(Word::literal);
    if functions.contains(&name.as_str()) {
        // Its body is read where it is defined.
        return Kind::Quiet;
    }
    if is_work(&name) {
        return Kind::Work(start);
    }
    let inside = WRAPPERS.contains(&b) || (RUNNERS.contains(&b) && lit(start + 1).as_deref() == Some("run"));
    if inside {
        if b == "parallel" && c.words.iter().filter_map(Word::literal).any(|w| remote_parallel(&w)) {
            return Kind::Launcher;
        }
        return (start + 1..c.words.len())
            .find(|&i| lit(i).is_some_and(|w| is_work(&w)))
            .map_or_else(|| Kind::Opaque(shown_command(c, start)), Kind::Work);
    }
    if QUIET.contains(&b) || RUNNERS.contains(&b) {
        return Kind::Quiet;
    }
    if matches!(b, "source" | ".") && lit(start + 1).is_some_and(|f| sources_setup(&f)) {
        return Kind::Quiet;
    }
    Kind::Opaque(shown_command(c, start))
}

/// GNU parallel's options that run its commands on other hosts.
fn remote_parallel(w: &str) -> bool {
    let f = w.split_once('=').map_or(w, |(f, _)| f);
    matches!(f, "-S" | "--sshlogin" | "--slf" | "--sshloginfile")
        || (f.starts_with("-S") && !f.starts_with("--"))
}

/// A command's first words, for a note.
fn shown_command(c: &Command, start: usize) -> String {
    let words: Vec<String> = c.words[start..].iter().take(2).map(Word::raw).collect();
    clip(&words.join(" "), 60)
}

/// The job's nodes, when it can get more than one.
struct Span {
    /// The fewest it can get.
    min: u64,
    /// The most, when more than `min` (`--nodes=2-4`).
    max: Option<u64>,
    /// The request in words.
    said: String,
}

/// The high end of `--nodes` (`2-4`, or a list of sizes `1,4,8`).
fn node_max(v: &str) -> Option<u64> {
    match v.split_once('-') {
        Some((_, hi)) => hi.trim().parse().ok(),
        None => v.split(',').filter_map(|x| x.trim().parse().ok()).max(),
    }
}

/// The nodes a component asks for, as sbatch counts them (`_opt_verify`,
/// src/sbatch/opt.c, the same in 22.05, 24.11 and 26.05): `--nodes`, else
/// the hosts of `--nodelist`; fewer tasks than nodes lower both ends to the
/// task count. Without `--nodes`, `--ntasks` with `--ntasks-per-node` (a
/// maximum per node then, man sbatch) needs `ceil(ntasks / per node)` nodes.
fn span(req: &Request) -> Option<Span> {
    let count = |n: &str| req.value(n).and_then(|v| v.get()).and_then(values::parse_count);
    let tasks = count("ntasks");
    let (mut min, mut max, said) = if let Some(s) = req.get("nodes") {
        let v = s.value.as_ref()?.get()?;
        (values::parse_count(v)?, node_max(v), shown(s))
    } else if let Some(s) = req.get("nodelist") {
        let v = s.value.as_ref()?.get()?;
        if v.contains('/') || v.contains('{') {
            return None;
        }
        let mut hosts = slurm_formats::hostlist::expand(v).ok()?;
        hosts.sort();
        hosts.dedup();
        let n = u64::try_from(hosts.len()).ok()?;
        (n, None, format!("{} ({n} nodes)", shown(s)))
    } else {
        let per = count("ntasks-per-node").filter(|p| *p > 0)?;
        let t = tasks?;
        let n = t.div_ceil(per);
        (n, None, format!("--ntasks={t} with --ntasks-per-node={per} ({n} nodes)"))
    };
    if let Some(t) = tasks.filter(|t| *t > 0) {
        min = min.min(t);
        max = max.map(|m| m.min(t));
    }
    Some(Span { min, max: max.filter(|m| *m > min), said })
}

/// GPUs on each node, when the request says.
fn gpus_per_node(req: &Request) -> Option<u64> {
    let val = |n: &str| req.value(n).and_then(|v| v.get());
    if let Some((_, n)) = val("gpus-per-node").and_then(values::parse_gpus) {
        return Some(n);
    }
    if let Some(g) =
        val("gres").and_then(|v| values::parse_gres_list(v).into_iter().find(|g| g.name == "gpu"))
    {
        return Some(g.count);
    }
    let per_task = val("gpus-per-task").and_then(values::parse_gpus)?.1;
    Some(per_task.saturating_mul(val("ntasks-per-node").and_then(values::parse_count)?))
}

/// The nodes left idle, in words: `the other 3 nodes (24 GPUs)`.
fn idle(span: &Span, gpus: Option<u64>) -> String {
    let others = span.min.saturating_sub(1);
    let gpus = |n: u64| {
        gpus.filter(|g| *g > 0).map_or(String::new(), |g| format!(" ({} GPUs)", n.saturating_mul(g)))
    };
    match span.max {
        Some(max) if others == 0 => {
            format!("any other node it gets (up to {}{})", max - 1, gpus(max - 1))
        }
        Some(_) => format!("the other {others} or more nodes{}", gpus(others)),
        None if others == 1 => format!("the other node{}", gpus(1)),
        None => format!("the other {others} nodes{}", gpus(others)),
    }
}

/// The work command's words, resolved as far as lint can.
fn program(job: &Job, c: &Command, start: usize) -> Vec<ArgWord> {
    let at = if c.function.is_some() { usize::MAX } else { c.line };
    c.words[start..]
        .iter()
        .map(|w| (w, job.resolve(w, at)))
        .filter(|(w, r)| w.quoted || !r.text.is_empty())
        .map(|(_, r)| r)
        .collect()
}

/// How a work command ends up on one node.
enum Work {
    /// A program that runs once, here (`python train.py`), or a launcher
    /// for one node's processes (`torchrun` without `--nnodes` above 1).
    Here {
        /// The command, clipped.
        shown: String,
        /// What the launcher does, when it is one.
        launcher: Option<String>,
    },
    /// A launcher told of other nodes that never start (`torchrun --nnodes=2`).
    Waits {
        /// `torchrun --nnodes=2`.
        shown: String,
    },
    /// A launcher that reaches other nodes itself (DeepSpeed with a hostfile).
    Reaches,
    /// Not known without its configuration.
    Unknown(String),
}

fn work(words: &[ArgWord]) -> Work {
    let texts: Vec<&str> = words.iter().map(|w| w.text.as_str()).collect();
    let shown = clip(&texts.iter().take(2).copied().collect::<Vec<_>>().join(" "), 60);
    let Some((name, _)) = launcher(words) else { return Work::Here { shown, launcher: None } };
    let flag = |flags: &[&str]| flag_value(&texts, flags);
    let has =
        |flags: &[&str]| texts.iter().any(|w| flags.contains(&w.split_once('=').map_or(*w, |(f, _)| f)));
    match name.as_str() {
        "deepspeed" if has(&["--hostfile", "-H", "--force_multi"]) => Work::Reaches,
        "deepspeed" => Work::Here {
            shown,
            launcher: Some(
                "DeepSpeed without --hostfile uses this node's GPUs only, unless there is a /job/hostfile"
                    .into(),
            ),
        },
        "accelerate launch" => {
            let machines = flag(&["--num_machines", "--num-machines"]).and_then(values::parse_count);
            let torch = has(&["--multi_gpu", "--multi-gpu", "--use_fsdp", "--use-fsdp"])
                && !has(&["--use_deepspeed", "--use-deepspeed"]);
            match machines {
                Some(m) if m > 1 && torch => {
                    Work::Waits { shown: format!("accelerate launch --num_machines={m}") }
                }
                Some(1) => Work::Here {
                    shown,
                    launcher: Some(
                        "accelerate launch --num_machines=1 starts processes on this node only".into(),
                    ),
                },
                _ => Work::Unknown(format!("{shown}: its configuration decides which machines it uses")),
            }
        }
        _ => {
            // torchrun, python -m torch.distributed.run / launch.
            let nnodes = words.iter().enumerate().find_map(|(i, w)| {
                let (f, v) = match w.text.split_once('=') {
                    Some((f, _)) => (f, Some(w)),
                    None => (w.text.as_str(), words.get(i + 1)),
                };
                (f == "--nnodes").then_some(v).flatten()
            });
            let min = nnodes.filter(|v| v.is_known()).and_then(|v| {
                v.text
                    .split_once('=')
                    .map_or(v.text.as_str(), |(_, x)| x)
                    .split(':')
                    .next()?
                    .parse::<u64>()
                    .ok()
            });
            match (nnodes, min) {
                (Some(v), Some(m)) if m > 1 => {
                    Work::Waits { shown: format!("{name} --nnodes={}", nnodes_text(v)) }
                }
                (Some(v), None) => Work::Waits { shown: format!("{name} --nnodes={}", nnodes_text(v)) },
                _ => Work::Here {
                    shown,
                    launcher: Some(format!("{name} starts processes only on the node it runs on")),
                },
            }
        }
    }
}

fn nnodes_text(v: &ArgWord) -> String {
    clip(v.text.split_once('=').map_or(v.text.as_str(), |(_, x)| x), 30)
}

/// 19: more than one node, and nothing started on the others.
pub(crate) fn check(job: &Job, out: &mut Report) {
    let req = job.main();
    let het = job.components.len();
    let span = match span(req) {
        Some(s) if s.min > 1 || s.max.is_some() => s,
        _ if het > 1 => Span { min: 1, max: None, said: format!("a heterogeneous job of {het} components") },
        _ => return,
    };
    let functions: Vec<&str> = job.script.shell.functions.iter().map(|f| f.name.as_str()).collect();
    let mut opaque: Option<(usize, String)> = None;
    let mut works: Vec<(usize, Work)> = Vec::new();
    for c in &job.script.shell.commands {
        match kind(c, &functions) {
            Kind::Launcher => return,
            Kind::Opaque(what) => {
                opaque.get_or_insert((c.line, what));
            }
            Kind::Work(start) => match work(&program(job, c, start)) {
                Work::Reaches => return,
                Work::Unknown(what) => {
                    opaque.get_or_insert((c.line, what));
                }
                w => works.push((c.line, w)),
            },
            Kind::Quiet => {}
        }
    }
    if let Some((line, what)) = opaque {
        out.note(
            Trap::OneNodeOnly,
            format!(
                "{} and no srun, mpirun or other launcher in the script: whether line {line} ({what}) starts one on the other nodes is not known",
                span.said
            ),
        );
        return;
    }
    // The launcher told of other nodes first, else the last program (usually the training).
    let chosen =
        works.iter().position(|(_, w)| matches!(w, Work::Waits { .. })).or(works.len().checked_sub(1));
    let Some(i) = chosen else { return };
    let (line, w) = works.swap_remove(i);
    let gpus = gpus_per_node(req);
    let multi = span.min > 1 || span.max.is_some();
    let idle = if multi { idle(&span, gpus) } else { "the nodes of its other components".to_owned() };
    let g = gpus.map_or_else(|| "G".to_owned(), |g| g.to_string());
    let het_part =
        if het > 1 && multi { "; the job's other components get nothing to run either" } else { "" };
    let (what, fix) = match w {
        Work::Waits { shown } => {
            let name = shown.split(" --").next().unwrap_or("the launcher");
            (
                format!(
                    "{}, and {shown} runs without srun: the batch script runs on the first node only, and {name} starts processes only on the node it runs on, so they wait for the other nodes' {name}, which never starts, until the rendezvous times out, leaving {idle} idle{het_part}",
                    span.said
                ),
                format!(
                    "start one torchrun per node with srun (the guide's Pattern A): srun --ntasks-per-node=1 --kill-on-bad-exit=1 torchrun --nnodes=\"$SLURM_NNODES\" --nproc-per-node={g} --rdzv-backend=c10d --rdzv-endpoint=\"$MASTER_ADDR:$MASTER_PORT\" ..."
                ),
            )
        }
        Work::Here { shown, launcher } => {
            let how = launcher.map_or_else(String::new, |l| format!(" ({l})"));
            (
                format!(
                    "{}, but no srun, mpirun or other launcher starts anything on the other nodes: the batch script runs on the first node only, so {shown} runs there alone{how}, leaving {idle} idle for the whole job{het_part}",
                    span.said
                ),
                format!(
                    "start it on every node with srun, as the guide's two patterns do: one torchrun per node (srun --ntasks-per-node=1 torchrun --nnodes=\"$SLURM_NNODES\" --nproc-per-node={g} ...), or one task per GPU (--ntasks-per-node={g} --gpus-per-task=1, then srun python ...); or ask for one node"
                ),
            )
        }
        Work::Reaches | Work::Unknown(_) => return,
    };
    out.find(Trap::OneNodeOnly, Origin::Line(line), what, fix);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shell;

    fn kinds(text: &str) -> Vec<Kind> {
        let sh = shell::read(text);
        let f: Vec<&str> = sh.functions.iter().map(|f| f.name.as_str()).collect();
        sh.commands.iter().map(|c| kind(c, &f)).collect()
    }

    #[test]
    fn launchers_anywhere_in_a_command() {
        for t in [
            "srun python x",
            "exec srun python x",
            "timeout 1h srun python x",
            "bash -c 'srun python x'",
            "mpirun -np 16 ./a.out",
            "pdsh -w \"$SLURM_JOB_NODELIST\" python x",
            "for h in $(scontrol show hostnames); do ssh $h python x & done",
            "parallel -S host1,host2 python ::: a b",
            "CMD=\"srun -N2\"",
        ] {
            assert!(kinds(t).contains(&Kind::Launcher), "{t}: {:?}", kinds(t));
        }
    }

    #[test]
    fn work_opaque_and_quiet() {
        assert_eq!(kinds("python3.11 train.py"), vec![Kind::Work(0)]);
        assert_eq!(kinds("timeout 3600 python train.py"), vec![Kind::Work(2)]);
        assert_eq!(kinds("uv run python train.py"), vec![Kind::Work(2)]);
        assert_eq!(kinds("./train.py --x"), vec![Kind::Work(0)]);
        assert_eq!(kinds("conda activate env"), vec![Kind::Quiet]);
        assert_eq!(kinds("module load cuda"), vec![Kind::Quiet]);
        assert!(matches!(kinds("./run.sh")[0], Kind::Opaque(_)));
        assert!(matches!(kinds("bash other.sh")[0], Kind::Opaque(_)));
        assert!(matches!(kinds("eval \"$CMD\"")[0], Kind::Opaque(_)));
        assert!(matches!(kinds("$LAUNCH python x")[0], Kind::Opaque(_)));
        assert!(matches!(kinds("lmp -in in.lj")[0], Kind::Opaque(_)));
        // A sourced file may start the launcher itself; an environment's setup does not.
        assert!(matches!(kinds("source ./launch.sh")[0], Kind::Opaque(_)));
        assert!(matches!(kinds(". ./launch.sh")[0], Kind::Opaque(_)));
        assert_eq!(kinds("source ~/venv/bin/activate")[0], Kind::Quiet);
        assert_eq!(kinds(". /etc/profile.d/modules.sh")[0], Kind::Quiet);
        assert_eq!(kinds("source /usr/share/lmod/lmod/init/bash")[0], Kind::Quiet);
        // A function's call is quiet: its body is read where it is defined.
        assert_eq!(kinds("go() {\n  python x\n}\ngo"), vec![Kind::Work(0), Kind::Quiet]);
    }

    #[test]
    fn node_counts_as_sbatch_counts_them() {
        let req = |opts: &[(&str, &str)]| Request {
            settings: opts
                .iter()
                .map(|(n, v)| crate::job::Setting {
                    name: (*n).into(),
                    value: Some(crate::getopt::Value::known(v)),
                    origin: Origin::CommandLine,
                })
                .collect(),
        };
        let s = |opts: &[(&str, &str)]| span(&req(opts)).map(|s| (s.min, s.max));
        assert_eq!(s(&[("nodes", "4")]), Some((4, None)));
        assert_eq!(s(&[("nodes", "2-4")]), Some((2, Some(4))));
        assert_eq!(s(&[("nodes", "1-2")]), Some((1, Some(2))));
        assert_eq!(s(&[("nodes", "4"), ("ntasks", "1")]), Some((1, None)));
        assert_eq!(s(&[("ntasks", "16"), ("ntasks-per-node", "8")]), Some((2, None)));
        assert_eq!(s(&[("nodelist", "gpu[01-03],gpu01")]), Some((3, None)));
        assert_eq!(s(&[("ntasks", "16")]), None);
        assert_eq!(gpus_per_node(&req(&[("gres", "gpu:h100:8")])), Some(8));
        assert_eq!(gpus_per_node(&req(&[("gpus-per-task", "1"), ("ntasks-per-node", "4")])), Some(4));
    }
}
