//! The batch script as the shell will run it, as far as it can be read
//! without running anything: simple commands with their words, prefix
//! assignments, whether they run in the background, which block and function
//! they sit in. Heredoc bodies are skipped; command substitutions, arithmetic
//! and positional parameters stay unknown parts of their words, never guessed.
//!
//! Linear in the input, no recursion, never panics (fuzzed: `fuzz/fuzz_targets/lint_script.rs`).

use super::lexer::{Lexer, Tok, is_name_char, is_name_start, is_redirect};
pub use super::word::{Part, Word};

/// One simple command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Command {
    /// The line it starts on (1-based).
    pub line: usize,
    /// Assignments before the command (`X=1 cmd`), or the whole of a bare assignment.
    pub assigns: Vec<(String, Word)>,
    /// The command's words, redirections left out.
    pub words: Vec<Word>,
    /// It runs in the background (`cmd &`, or a pipeline ending with `&`).
    pub background: bool,
    /// How many blocks (`if`, loops, `case`, `{ }`, `( )`, function bodies) it is in.
    pub depth: u32,
    /// The function whose body it is in.
    pub function: Option<String>,
    /// It is in the body of a loop.
    pub in_loop: bool,
}

impl Command {
    /// The first word, when literal.
    pub fn name(&self) -> Option<String> {
        self.words.first().and_then(Word::literal)
    }
}

/// A function definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// The line it is defined on.
    pub line: usize,
}

/// The script as the shell reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shell {
    /// Every simple command, in order.
    pub commands: Vec<Command>,
    /// Every function definition.
    pub functions: Vec<Function>,
    /// The lines of heredoc bodies (first, last), delimiter included.
    pub heredocs: Vec<(usize, usize)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Block {
    Plain,
    Loop,
    Case,
    Function(String),
}

/// Reads the script's commands.
pub fn read(text: &str) -> Shell {
    let mut lx = Lexer::new(text);
    lx.run();
    let mut sh = assemble(lx.toks);
    sh.heredocs = lx.bodies;
    sh
}

/// `NAME=value` (or `NAME+=value`) as a word: the name and the value.
pub fn assignment(w: &Word) -> Option<(String, Word)> {
    let Some(Part::Lit(first)) = w.parts.first() else { return None };
    let (name, value) = first.split_once('=')?;
    let name = name.strip_suffix('+').unwrap_or(name);
    if name.is_empty() || !name.starts_with(is_name_start) || !name.chars().all(is_name_char) {
        return None;
    }
    let mut rest = Word::default();
    if !value.is_empty() {
        rest.parts.push(Part::Lit(value.to_owned()));
    }
    rest.parts.extend(w.parts[1..].iter().cloned());
    Some((name.to_owned(), rest))
}

struct Assembler {
    out: Shell,
    cur: Command,
    started: bool,
    blocks: Vec<Block>,
    pipeline_start: usize,
    /// Words to drop until the next separator (a `for` or `case` header).
    skip_header: bool,
    case_patterns: bool,
    redirect_target: bool,
    pending_function: Option<String>,
    expect_function_name: bool,
}

impl Assembler {
    fn function(&self) -> Option<String> {
        self.blocks.iter().rev().find_map(|b| match b {
            Block::Function(n) => Some(n.clone()),
            _ => None,
        })
    }

    fn finish(&mut self, background: bool, piped: bool) {
        if !self.cur.words.is_empty() || !self.cur.assigns.is_empty() {
            let mut cmd = std::mem::take(&mut self.cur);
            cmd.depth = u32::try_from(self.blocks.len()).unwrap_or(u32::MAX);
            cmd.function = self.function();
            cmd.in_loop = self.blocks.contains(&Block::Loop);
            self.out.commands.push(cmd);
        }
        self.cur = Command::default();
        self.started = false;
        if background {
            for c in &mut self.out.commands[self.pipeline_start..] {
                c.background = true;
            }
        }
        if !piped {
            self.pipeline_start = self.out.commands.len();
        }
    }

    fn at_start(&self) -> bool {
        self.cur.words.is_empty()
    }

    fn word(&mut self, w: Word, line: usize) {
        if self.redirect_target {
            self.redirect_target = false;
            return;
        }
        if self.skip_header {
            if self.blocks.last() == Some(&Block::Case) && w.is("in") {
                self.skip_header = false;
                self.case_patterns = true;
            }
            return;
        }
        if self.expect_function_name {
            self.expect_function_name = false;
            let name = w.raw();
            self.pending_function = Some(name.strip_suffix("()").unwrap_or(&name).to_owned());
            return;
        }
        if self.case_patterns {
            if w.is("esac") {
                self.case_patterns = false;
                self.pop(Block::Case);
            }
            return;
        }
        if self.at_start() {
            if let Some(k) = w.literal() {
                match k.as_str() {
                    "if" | "while" | "until" => {
                        self.blocks.push(if k == "if" { Block::Plain } else { Block::Loop });
                        return;
                    }
                    "for" | "select" => {
                        self.blocks.push(Block::Loop);
                        self.skip_header = true;
                        return;
                    }
                    "case" => {
                        self.blocks.push(Block::Case);
                        self.skip_header = true;
                        return;
                    }
                    "then" | "do" | "else" | "elif" | "!" | "time" if self.cur.assigns.is_empty() => return,
                    "fi" | "done" => {
                        self.pop(if k == "fi" { Block::Plain } else { Block::Loop });
                        return;
                    }
                    "esac" => {
                        self.pop(Block::Case);
                        return;
                    }
                    "{" => {
                        let b = match self.pending_function.take() {
                            Some(name) => {
                                self.out.functions.push(Function { name: name.clone(), line });
                                Block::Function(name)
                            }
                            None => Block::Plain,
                        };
                        self.blocks.push(b);
                        return;
                    }
                    "}" => {
                        self.pop_any();
                        return;
                    }
                    "function" => {
                        self.expect_function_name = true;
                        return;
                    }
                    _ => {}
                }
            }
            if self.cur.words.is_empty() {
                if let Some(a) = assignment(&w) {
                    if !self.started {
                        self.cur.line = line;
                        self.started = true;
                    }
                    self.cur.assigns.push(a);
                    return;
                }
            }
        }
        if !self.started {
            self.cur.line = line;
            self.started = true;
        }
        self.cur.words.push(w);
    }

    fn pop(&mut self, want: Block) {
        if let Some(i) = self.blocks.iter().rposition(|b| *b == want) {
            self.blocks.truncate(i);
        }
    }

    fn pop_any(&mut self) {
        self.blocks.pop();
    }

    fn op(&mut self, op: &'static str) {
        if is_redirect(op) {
            self.redirect_target = true;
            return;
        }
        self.redirect_target = false;
        match op {
            "(" if self.case_patterns => {}
            "(" => {
                // `name() {`: a function definition.
                if self.cur.words.len() == 1 && self.cur.assigns.is_empty() {
                    let name = self.cur.words[0].raw();
                    self.cur = Command::default();
                    self.started = false;
                    self.pending_function = Some(name);
                    return;
                }
                if self.pending_function.is_some() {
                    return;
                }
                self.finish(false, false);
                self.blocks.push(Block::Plain);
            }
            ")" => {
                if self.pending_function.is_some() && self.at_start() {
                    return;
                }
                if self.case_patterns {
                    self.case_patterns = false;
                    return;
                }
                self.finish(false, false);
                if self.blocks.last() == Some(&Block::Plain) {
                    self.blocks.pop();
                }
            }
            ";;" | ";&" | ";;&" => {
                self.finish(false, false);
                if self.blocks.last() == Some(&Block::Case) {
                    self.case_patterns = true;
                }
            }
            ";" | "&&" | "||" => {
                self.finish(false, false);
                self.skip_header = false;
            }
            "&" => self.finish(true, false),
            "|" | "|&" => self.finish(false, true),
            _ => {}
        }
    }
}

fn assemble(toks: Vec<Tok>) -> Shell {
    let mut a = Assembler {
        out: Shell::default(),
        cur: Command::default(),
        started: false,
        blocks: Vec::new(),
        pipeline_start: 0,
        skip_header: false,
        case_patterns: false,
        redirect_target: false,
        pending_function: None,
        expect_function_name: false,
    };
    for t in toks {
        match t {
            Tok::Word(w, line) => a.word(w, line),
            Tok::Op(op, _) => a.op(op),
            Tok::Newline(_) => {
                a.finish(false, false);
                a.redirect_target = false;
                if a.skip_header && a.blocks.last() != Some(&Block::Case) {
                    a.skip_header = false;
                }
            }
        }
    }
    a.finish(false, false);
    a.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(c: &Command) -> Vec<String> {
        c.words.iter().map(Word::raw).collect()
    }

    #[test]
    fn commands_words_quotes_and_background() {
        let sh =
            read("set -e\nsrun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" python 'a b' > log 2>&1 &\nwait\n");
        assert_eq!(sh.commands.len(), 3);
        assert_eq!(
            words(&sh.commands[1]),
            vec!["srun", "--cpus-per-task=$SLURM_CPUS_PER_TASK", "python", "a b"]
        );
        assert!(sh.commands[1].background);
        assert_eq!(sh.commands[1].line, 2);
        assert!(!sh.commands[2].background);
        let Part::Var { name, .. } = &sh.commands[1].words[1].parts[1] else { panic!() };
        assert_eq!(name, "SLURM_CPUS_PER_TASK");
    }

    #[test]
    fn continuation_lines_and_assignments() {
        let sh = read("export A=1\nMASTER_PORT=29500\nX=$(hostname) srun \\\n  -N2 \\\n  python x.py\n");
        assert_eq!(sh.commands[0].words.len(), 2);
        assert_eq!(sh.commands[1].assigns[0].0, "MASTER_PORT");
        assert_eq!(sh.commands[1].assigns[0].1.literal().as_deref(), Some("29500"));
        assert_eq!(words(&sh.commands[2]), vec!["srun", "-N2", "python", "x.py"]);
        assert!(matches!(sh.commands[2].assigns[0].1.parts[0], Part::Unknown(_)));
    }

    #[test]
    fn functions_blocks_heredocs_and_case() {
        let text = "on_preempt() {\n  touch x\n  scontrol requeue $SLURM_JOB_ID\n}\ntrap on_preempt USR1\n\
                    cat <<EOF > f\nsrun not a command\nEOF\nfor i in 1 2; do\n  srun -n1 a &\ndone\nwait\n\
                    case $x in\n  a|b) echo yes ;;\n  *) srun b ;;\nesac\nif [ -f x ]; then srun c; fi\n";
        let sh = read(text);
        let names: Vec<String> =
            sh.commands.iter().map(|c| c.words.first().map(Word::raw).unwrap_or_default()).collect();
        assert_eq!(
            names,
            vec!["touch", "scontrol", "trap", "cat", "srun", "wait", "echo", "srun", "[", "srun"]
        );
        assert_eq!(sh.commands[0].function.as_deref(), Some("on_preempt"));
        assert_eq!(sh.commands[2].function, None);
        assert_eq!(sh.commands[2].depth, 0);
        assert!(sh.commands[4].background && sh.commands[4].in_loop);
        assert_eq!(sh.commands[5].depth, 0);
        assert_eq!(sh.commands[9].depth, 1);
        assert_eq!(sh.functions, vec![Function { name: "on_preempt".into(), line: 1 }]);
    }

    #[test]
    fn pipelines_in_the_background_are_all_background() {
        let sh = read("srun a | tee log &\nsrun b | tee log2\n");
        assert!(sh.commands[0].background && sh.commands[1].background);
        assert!(!sh.commands[2].background && !sh.commands[3].background);
    }

    #[test]
    fn unknowns_stay_unknown() {
        let sh = read("srun -c $((N*2)) `nproc` ${X#y} ${Y:-4} $1\n");
        let w = &sh.commands[0].words;
        assert!(matches!(&w[2].parts[0], Part::Unknown(r) if r == "$((N*2))"));
        assert!(matches!(&w[3].parts[0], Part::Unknown(r) if r == "`nproc`"));
        assert!(matches!(&w[4].parts[0], Part::Unknown(_)));
        assert!(matches!(&w[5].parts[0], Part::Var { default: Some(d), .. } if d == "4"));
        assert!(matches!(&w[6].parts[0], Part::Unknown(_)));
    }

    #[test]
    fn garbage_never_panics() {
        for text in [
            "$((",
            "${",
            "'",
            "\"",
            "`",
            "<<",
            "((",
            "a() {",
            "}}}}",
            ")))",
            "\\",
            "case in esac ;; )",
            "$(\n",
        ] {
            let _ = read(text);
        }
    }
}
