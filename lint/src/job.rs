//! The job a script asks for, as sbatch builds it: `#SBATCH` lines, then
//! `SBATCH_*` variables, then sbatch's command line (each later source wins;
//! `process_options_second_pass`), and the `srun` lines inside the script with
//! what each step gets from the job's environment. Shell variables are
//! resolved only where the script or Slurm fixes them; anything else stays
//! unknown.

use std::collections::BTreeMap;

use super::getopt::{self, ArgWord, Given, Program, Stop, Value};
use super::script::Script;
use super::shell::{self, Command, Part, Word};
use super::table::{Arg, SBATCH_ENV};

/// What a check of one script starts from.
#[derive(Clone, Debug, Default)]
pub struct Input {
    /// The script's name (`job.sh`), whose last component is the job's default
    /// name, as sbatch names it (`spank-gpu lint -` passes `sbatch`, sbatch's
    /// name for a script read from its standard input).
    pub file: String,
    /// sbatch options given before the script (`spank-gpu lint -- OPTS job.sh`,
    /// or sbatch's own command line at submit time).
    pub args: Vec<String>,
    /// The environment the job is submitted from (`SBATCH_*` are read from it,
    /// and with the default `--export=ALL` the job inherits it).
    pub env: BTreeMap<String, String>,
    /// The directory it is submitted from (relative `--output` paths).
    pub cwd: String,
    /// The submitting user's name (`%u`).
    pub user: String,
    /// The Slurm release (`SLURM_VERSION_NUMBER`).
    pub release: u32,
    /// SPANK plugin options known to exist (long name, argument).
    pub plugins: Vec<(String, Arg)>,
    /// `auto_rdzv=on` on the site's plugstack line.
    pub site_auto_rdzv: bool,
}

/// Where an option came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A line of the script (`#SBATCH`, or an `srun` line).
    Line(usize),
    /// An input variable (`SBATCH_OUTPUT`).
    Env(String),
    /// sbatch's command line.
    CommandLine,
}

/// An option of the job or of a step, with where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// Its long name.
    pub name: String,
    /// Its argument.
    pub value: Option<Value>,
    /// Where it was given.
    pub origin: Origin,
}

/// The options of a job component or of a step; a later one of a name wins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// In the order sbatch applies them.
    pub settings: Vec<Setting>,
}

impl Request {
    /// The option in force of these names (the last given of any of them).
    pub fn last(&self, names: &[&str]) -> Option<&Setting> {
        self.settings.iter().rev().find(|s| names.contains(&s.name.as_str()))
    }

    /// The option `name` in force.
    pub fn get(&self, name: &str) -> Option<&Setting> {
        self.last(&[name])
    }

    /// Whether `name` was given.
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The value of `name`, when given with one.
    pub fn value(&self, name: &str) -> Option<&Value> {
        self.get(name).and_then(|s| s.value.as_ref())
    }

    fn push(&mut self, given: &[Given], origin: &Origin) {
        for g in given {
            self.settings.push(Setting {
                name: g.name.clone(),
                value: g.value.clone(),
                origin: origin.clone(),
            });
        }
    }
}

/// An option sbatch refuses: the submit fails with its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Where.
    pub origin: Origin,
    /// sbatch's words.
    pub message: String,
}

/// A `trap` command of the script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrapSet {
    /// Its line.
    pub line: usize,
    /// The handler as written (a function's name or a command string).
    pub handler: String,
    /// The signals, as names without `SIG` (`USR1`, `TERM`, `EXIT`).
    pub signals: Vec<String>,
    /// The handler's commands (a function's body, or the string read as shell).
    pub commands: Vec<Command>,
    /// Whether it is set inside a function (run only when that is called).
    pub in_function: bool,
}

impl TrapSet {
    /// Whether the handler does something (not `''` to ignore or `-` to reset).
    pub fn acts(&self) -> bool {
        !self.handler.is_empty() && self.handler != "-"
    }

    /// Whether the handler requeues the job (`scontrol requeue`).
    pub fn requeues(&self) -> bool {
        self.commands.iter().any(|c| {
            c.name().as_deref() == Some("scontrol")
                && c.words.iter().any(|w| w.literal().as_deref() == Some("requeue"))
        })
    }
}

/// An `srun` (or `sbatch`) command inside the script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Its line.
    pub line: usize,
    /// Its options (origin: its line).
    pub opts: Request,
    /// Where reading its options stopped early.
    pub stop: Option<Stop>,
    /// What it runs: the words after its options.
    pub program: Vec<ArgWord>,
    /// In the background (`&`).
    pub background: bool,
    /// In a function's body.
    pub function: Option<String>,
    /// In a block (`if`, a loop, ...).
    pub depth: u32,
    /// Variables given on the command itself (`SRUN_CPUS_PER_TASK=8 srun ...`).
    pub prefix: Vec<(String, ArgWord)>,
    /// Index in the script's commands.
    pub index: usize,
}

/// What a variable is at a point of the script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VarValue {
    /// Known.
    Known(String),
    /// Not set.
    Unset,
    /// Set, to something that cannot be known without running the script.
    Unknown,
}

/// The job a script asks for.
#[derive(Clone, Debug)]
pub struct Job<'a> {
    /// The script.
    pub script: &'a Script,
    /// What the check started from.
    pub input: &'a Input,
    /// The job's components (one unless heterogeneous).
    pub components: Vec<Request>,
    /// Options sbatch refuses.
    pub refused: Vec<Refusal>,
    /// `trap` commands.
    pub traps: Vec<TrapSet>,
    /// `srun` commands.
    pub sruns: Vec<Launch>,
    /// `sbatch` commands (jobs this one submits).
    pub sbatches: Vec<Launch>,
    /// The first `source`/`.`/`module`/`eval` line: variables may change there in ways lint cannot follow.
    pub opaque_from: Option<usize>,
    assigns: Assigns,
}

/// Every assignment of the script, by name: (line, value, at top level).
type Assigns = BTreeMap<String, Vec<(usize, Word, bool)>>;

fn all_assignments(script: &Script) -> Assigns {
    let mut map: Assigns = BTreeMap::new();
    for c in &script.shell.commands {
        let top = c.depth == 0 && c.function.is_none();
        let decl =
            matches!(c.name().as_deref(), Some("export" | "declare" | "typeset" | "local" | "readonly"));
        if c.words.is_empty() {
            for (n, w) in &c.assigns {
                map.entry(n.clone()).or_default().push((c.line, w.clone(), top));
            }
        } else if decl {
            for w in &c.words[1..] {
                if let Some((n, value)) = shell::assignment(w) {
                    map.entry(n).or_default().push((c.line, value, top));
                }
            }
        }
    }
    map
}

impl<'a> Job<'a> {
    /// Builds the job from the script and the input.
    pub fn new(script: &'a Script, input: &'a Input) -> Job<'a> {
        let mut job = Job {
            script,
            input,
            components: Vec::new(),
            refused: Vec::new(),
            traps: Vec::new(),
            sruns: Vec::new(),
            sbatches: Vec::new(),
            opaque_from: None,
            assigns: all_assignments(script),
        };
        job.read_options();
        job.read_commands();
        job
    }

    /// The job's first component.
    pub fn main(&self) -> &Request {
        &self.components[0]
    }

    fn parse(&self, program: Program, words: &[ArgWord]) -> getopt::Parsed {
        getopt::parse(program, self.input.release, &self.input.plugins, words)
    }

    fn read_options(&mut self) {
        let n = self.script.directives.iter().map(|d| d.component).max().unwrap_or(0) + 1;
        let mut comps = vec![Request::default(); n];
        for d in &self.script.directives {
            let words: Vec<ArgWord> = d.words.iter().map(|w| ArgWord::known(w)).collect();
            let p = self.parse(Program::Sbatch, &words);
            comps[d.component].push(&p.opts, &Origin::Line(d.line));
            if let Some(Stop::Refused { message, .. }) = &p.stop {
                self.refused.push(Refusal { origin: Origin::Line(d.line), message: message.clone() });
            } else if p.operands < words.len() {
                let w = &d.words[p.operands];
                self.refused.push(Refusal {
                    origin: Origin::Line(d.line),
                    message: format!(
                        "sbatch: error: Invalid directive found in batch script: {}",
                        slurm_formats::text::clip(w, 80)
                    ),
                });
            }
        }
        for (var, name) in SBATCH_ENV {
            if let Some(v) = self.input.env.get(*var) {
                for c in &mut comps {
                    c.settings.push(Setting {
                        name: (*name).to_owned(),
                        value: Some(Value::known(v)),
                        origin: Origin::Env((*var).to_owned()),
                    });
                }
            }
        }
        let words: Vec<ArgWord> = self.input.args.iter().map(|w| ArgWord::known(w)).collect();
        let p = self.parse(Program::Sbatch, &words);
        for c in &mut comps {
            c.push(&p.opts, &Origin::CommandLine);
        }
        if let Some(Stop::Refused { message, .. }) = &p.stop {
            self.refused.push(Refusal { origin: Origin::CommandLine, message: message.clone() });
        }
        self.components = comps;
    }

    fn read_commands(&mut self) {
        let cmds = &self.script.shell.commands;
        for (i, c) in cmds.iter().enumerate() {
            let name = c.name();
            if matches!(name.as_deref(), Some("source" | "." | "module" | "ml" | "eval" | "conda" | "spack"))
                && self.opaque_from.is_none()
            {
                self.opaque_from = Some(c.line);
            }
            if name.as_deref() == Some("trap") {
                self.read_trap(c);
                continue;
            }
            let start = launcher_start(c);
            let Some(prog) = c.words.get(start).and_then(Word::literal) else { continue };
            let base = prog.rsplit('/').next().unwrap_or(&prog).to_owned();
            let program = match base.as_str() {
                "srun" => Program::Srun,
                "sbatch" => Program::Sbatch,
                _ => continue,
            };
            let at = if c.function.is_some() { usize::MAX } else { c.line };
            let words: Vec<ArgWord> = c.words[start + 1..]
                .iter()
                .map(|w| (w, self.resolve(w, at)))
                .filter(|(w, r)| w.quoted || !r.text.is_empty())
                .map(|(_, r)| r)
                .collect();
            let p = self.parse(program, &words);
            let mut opts = Request::default();
            opts.push(&p.opts, &Origin::Line(c.line));
            let launch = Launch {
                line: c.line,
                opts,
                stop: p.stop.clone(),
                program: words[p.operands.min(words.len())..].to_vec(),
                background: c.background,
                function: c.function.clone(),
                depth: c.depth,
                prefix: c.assigns.iter().map(|(n, w)| (n.clone(), self.resolve(w, at))).collect(),
                index: i,
            };
            if program == Program::Srun { self.sruns.push(launch) } else { self.sbatches.push(launch) }
        }
    }

    fn read_trap(&mut self, c: &Command) {
        let words: Vec<String> = c.words[1..].iter().map(Word::raw).collect();
        let words: Vec<&str> = words.iter().map(String::as_str).filter(|w| *w != "--").collect();
        let Some((handler, sigs)) = words.split_first() else { return };
        if handler.starts_with('-') && *handler != "-" {
            return; // trap -p, trap -l
        }
        let signals = sigs.iter().map(|s| signal_name(s)).collect();
        let handler = (*handler).to_owned();
        let commands = match self.script.shell.functions.iter().find(|f| f.name == handler) {
            Some(_) => self
                .script
                .shell
                .commands
                .iter()
                .filter(|k| k.function.as_deref() == Some(&handler))
                .cloned()
                .collect(),
            None => shell::read(&handler).commands,
        };
        self.traps.push(TrapSet {
            line: c.line,
            handler,
            signals,
            commands,
            in_function: c.function.is_some(),
        });
    }

    /// Whether the script runs in a login shell (`#!/bin/bash -l`), which
    /// reads the profile files first: any variable may be set there.
    fn login_shell(&self) -> bool {
        let first = self.script.text.lines().next().unwrap_or("");
        first.starts_with("#!")
            && first.split_whitespace().skip(1).any(|w| {
                w == "-l" || w == "--login" || (w.starts_with('-') && !w.starts_with("--") && w.contains('l'))
            })
    }

    /// The value of variable `name` for a command at `line` (`usize::MAX`:
    /// anywhere, for a function's body).
    pub fn var(&self, name: &str, line: usize) -> VarValue {
        self.var_depth(name, line, 0)
    }

    fn var_depth(&self, name: &str, line: usize, depth: u32) -> VarValue {
        if depth > 8 {
            return VarValue::Unknown;
        }
        let empty = Vec::new();
        let assigns = self.assigns.get(name).unwrap_or(&empty);
        let before: Vec<_> = assigns.iter().filter(|(l, _, _)| *l < line || line == usize::MAX).collect();
        if !before.is_empty() {
            if before.len() > 1 || !before[0].2 {
                return VarValue::Unknown;
            }
            let resolved = self.resolve_depth(&before[0].1, before[0].0, depth + 1);
            return if resolved.is_known() { VarValue::Known(resolved.text) } else { VarValue::Unknown };
        }
        if self.opaque_from.is_some_and(|l| l < line) || self.login_shell() {
            return VarValue::Unknown;
        }
        if name.starts_with("SLURM_") {
            return self.slurm_var(name);
        }
        match self.exported(name) {
            Some(Some(v)) => VarValue::Known(v),
            Some(None) => VarValue::Unset,
            None => VarValue::Unknown,
        }
    }

    /// A variable of the submit environment as the job sees it: `Some(None)`
    /// when it reaches the job unset, `None` when that cannot be told.
    fn exported(&self, name: &str) -> Option<Option<String>> {
        let export = self.main().value("export").map(|v| v.text.clone());
        let Some(export) = export else { return Some(self.input.env.get(name).cloned()) };
        let mut all = false;
        for item in export.split(',') {
            match item.split_once('=') {
                Some((n, v)) if n == name => return Some(Some(v.to_owned())),
                None if item == name => return Some(self.input.env.get(name).cloned()),
                None if item.eq_ignore_ascii_case("ALL") => all = true,
                _ => {}
            }
        }
        if export.contains('$') {
            return None;
        }
        Some(if all { self.input.env.get(name).cloned() } else { None })
    }

    /// The variables Slurm puts in the batch script's environment, from the
    /// job's options.
    fn slurm_var(&self, name: &str) -> VarValue {
        let from = |opt: &str| match self.main().value(opt) {
            Some(v) if v.known => VarValue::Known(v.text.clone()),
            Some(_) => VarValue::Unknown,
            None => VarValue::Unset,
        };
        match name {
            "SLURM_CPUS_PER_TASK" => from("cpus-per-task"),
            "SLURM_NTASKS_PER_NODE" => from("ntasks-per-node"),
            "SLURM_GPUS_PER_TASK" => from("gpus-per-task"),
            "SLURM_JOB_NAME" => match self.main().value("job-name") {
                Some(v) if v.known => VarValue::Known(v.text.clone()),
                Some(_) => VarValue::Unknown,
                None => {
                    VarValue::Known(self.input.file.rsplit('/').next().unwrap_or(&self.input.file).to_owned())
                }
            },
            "SLURM_NNODES" | "SLURM_JOB_NUM_NODES" => match self.main().value("nodes") {
                Some(v) if v.known && v.text.bytes().all(|b| b.is_ascii_digit()) => {
                    VarValue::Known(v.text.clone())
                }
                _ => VarValue::Unknown,
            },
            // Input variables of srun that sbatch does not set: only the user does.
            "SLURM_KILL_BAD_EXIT" => match self.exported(name) {
                Some(Some(v)) => VarValue::Known(v),
                Some(None) => VarValue::Unset,
                None => VarValue::Unknown,
            },
            _ => VarValue::Unknown,
        }
    }

    /// A shell word with the variables lint can know filled in.
    pub fn resolve(&self, w: &Word, line: usize) -> ArgWord {
        self.resolve_depth(w, line, 0)
    }

    fn resolve_depth(&self, w: &Word, line: usize, depth: u32) -> ArgWord {
        let mut text = String::new();
        let mut known: Option<usize> = None;
        for p in &w.parts {
            match p {
                Part::Lit(t) => text.push_str(t),
                Part::Var { name, default, raw } => match self.var_depth(name, line, depth) {
                    VarValue::Known(v) => text.push_str(&v),
                    VarValue::Unset => text.push_str(default.as_deref().unwrap_or("")),
                    VarValue::Unknown => {
                        known.get_or_insert(text.len());
                        text.push_str(raw);
                    }
                },
                Part::Unknown(raw) => {
                    known.get_or_insert(text.len());
                    text.push_str(raw);
                }
            }
        }
        ArgWord { known: known.unwrap_or(text.len()), text }
    }

    /// Variable `name` as the step at `launch` sees it: given on the
    /// command itself, assigned earlier in the script, or inherited.
    pub fn env_for(&self, launch: &Launch, name: &str) -> VarValue {
        if let Some((_, w)) = launch.prefix.iter().rev().find(|(n, _)| n == name) {
            return if w.is_known() { VarValue::Known(w.text.clone()) } else { VarValue::Unknown };
        }
        self.var(name, if launch.function.is_some() { usize::MAX } else { launch.line })
    }
}

/// Where the program word is in a command: after `exec`, `time`, `nohup`,
/// `command`, and `env`'s assignments.
pub(crate) fn launcher_start(c: &Command) -> usize {
    let mut i = 0;
    while let Some(w) = c.words.get(i).and_then(Word::literal) {
        match w.as_str() {
            "exec" | "time" | "nohup" | "command" | "builtin" => i += 1,
            "env" => {
                i += 1;
                while c
                    .words
                    .get(i)
                    .and_then(Word::literal)
                    .is_some_and(|w| w.contains('=') || w.starts_with('-'))
                {
                    i += 1;
                }
            }
            _ => break,
        }
    }
    i
}

/// A signal as `trap` or `--signal` names it, without `SIG` and in upper
/// case; numbers become names (Linux x86 and arm numbering).
pub fn signal_name(s: &str) -> String {
    let up = s.trim().to_ascii_uppercase();
    let up = up.strip_prefix("SIG").unwrap_or(&up).to_owned();
    let by_number = match up.as_str() {
        "0" => "EXIT",
        "1" => "HUP",
        "2" => "INT",
        "3" => "QUIT",
        "9" => "KILL",
        "10" => "USR1",
        "12" => "USR2",
        "15" => "TERM",
        "18" => "CONT",
        "19" => "STOP",
        "23" => "URG",
        _ => "",
    };
    if by_number.is_empty() { up } else { by_number.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script;

    const R: u32 = (22 << 16) | (5 << 8);

    fn input() -> Input {
        Input {
            file: "job.sh".into(),
            release: R,
            cwd: "/home/u".into(),
            user: "u".into(),
            ..Input::default()
        }
    }

    #[test]
    fn precedence_script_then_env_then_command_line() {
        let s =
            script::read(b"#!/bin/bash\n#SBATCH --time=10\n#SBATCH -N 2\n#SBATCH --output=a.out\nsrun x\n")
                .unwrap();
        let mut i = input();
        i.env.insert("SBATCH_TIMELIMIT".into(), "20".into());
        i.args = vec!["--time=30".into()];
        let j = Job::new(&s, &i);
        assert_eq!(j.main().value("time").unwrap().text, "30");
        assert_eq!(j.main().get("time").unwrap().origin, Origin::CommandLine);
        assert_eq!(j.main().value("nodes").unwrap().text, "2");
        assert_eq!(j.main().get("output").unwrap().origin, Origin::Line(4));
        i.args.clear();
        let j = Job::new(&s, &i);
        assert_eq!(j.main().get("time").unwrap().origin, Origin::Env("SBATCH_TIMELIMIT".into()));
    }

    #[test]
    fn bad_directives_are_refusals() {
        let s = script::read(b"#!/bin/bash\n#SBATCH --bogus\n#SBATCH garbage words\n#SBATCH -N\n").unwrap();
        let i = input();
        let j = Job::new(&s, &i);
        let msgs: Vec<_> = j.refused.iter().map(|r| (r.origin.clone(), r.message.clone())).collect();
        assert_eq!(msgs[0], (Origin::Line(2), "sbatch: unrecognized option '--bogus'".into()));
        assert_eq!(msgs[1].1, "sbatch: error: Invalid directive found in batch script: garbage");
        assert!(msgs[2].1.contains("requires an argument"), "{msgs:?}");
    }

    #[test]
    fn variables_known_unset_and_unknown() {
        let text = b"#!/bin/bash\n#SBATCH -c 8\nN=2\nexport PORT=29500\nsrun -N $N -c \"$SLURM_CPUS_PER_TASK\" --ntasks=$UNSET x\n\
                     srun -n $(nproc) --nodes=${M:-3} y\nN=3\nsrun -N $N z\nsrun --port=$PORT w\n";
        let s = script::read(text).unwrap();
        let i = input();
        let j = Job::new(&s, &i);
        let v = |k: usize, name: &str| j.sruns[k].opts.value(name).cloned();
        assert_eq!(v(0, "nodes"), Some(Value::known("2")));
        assert_eq!(v(0, "cpus-per-task"), Some(Value::known("8")));
        assert_eq!(v(0, "ntasks"), Some(Value::known("")));
        assert!(!v(1, "ntasks").unwrap().known);
        assert_eq!(v(1, "nodes"), Some(Value::known("3")));
        assert!(!v(2, "nodes").unwrap().known, "N is assigned twice");
        assert_eq!(j.var("PORT", 100), VarValue::Known("29500".into()));
    }

    #[test]
    fn traps_with_their_handlers() {
        let text = b"#!/bin/bash\non_preempt() {\n  scontrol requeue $SLURM_JOB_ID\n}\ntrap on_preempt SIGUSR1\ntrap 'echo bye' EXIT TERM\ntrap '' 10\n";
        let s = script::read(text).unwrap();
        let i = input();
        let j = Job::new(&s, &i);
        assert_eq!(j.traps.len(), 3);
        assert_eq!(j.traps[0].signals, vec!["USR1"]);
        assert!(j.traps[0].requeues());
        assert_eq!(j.traps[1].signals, vec!["EXIT", "TERM"]);
        assert!(!j.traps[1].requeues());
        assert!(!j.traps[2].acts());
        assert_eq!(j.traps[2].signals, vec!["USR1"]);
    }

    #[test]
    fn launches_after_exec_and_env() {
        let s = script::read(b"#!/bin/bash\nexec env A=1 srun -N2 python x\ntime /usr/bin/srun hostname &\nsbatch --dependency=afterok:$SLURM_JOB_ID next.sh\n").unwrap();
        let i = input();
        let j = Job::new(&s, &i);
        assert_eq!(j.sruns.len(), 2);
        assert_eq!(j.sruns[0].program[0].text, "python");
        assert!(j.sruns[1].background);
        assert_eq!(j.sbatches.len(), 1);
        assert!(!j.sbatches[0].opts.value("dependency").unwrap().known);
    }
}
