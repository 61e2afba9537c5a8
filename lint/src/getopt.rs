//! sbatch's and srun's command lines read as they read them: glibc's
//! `getopt_long` with the option string `+` (the first operand ends the
//! options; `slurm_option_table_create`), long options by unambiguous prefix,
//! over the options of the release in [`super::table`] and the SPANK plugins'
//! options.

use super::table::{self, Arg, ROWS};

/// Which program's options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// sbatch: `#SBATCH` lines, `SBATCH_*`, its command line.
    Sbatch,
    /// srun lines inside the script.
    Srun,
}

impl Program {
    /// The program's name.
    pub fn name(self) -> &'static str {
        match self {
            Program::Sbatch => "sbatch",
            Program::Srun => "srun",
        }
    }
}

/// A word of a command line; `text[..known]` is what the word is for sure,
/// the rest came from shell that could not be resolved (kept as written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgWord {
    /// The word, with unresolved parts as written (`$N`).
    pub text: String,
    /// Bytes of `text` that are known.
    pub known: usize,
}

impl ArgWord {
    /// A word known in full.
    pub fn known(text: &str) -> ArgWord {
        ArgWord { text: text.to_owned(), known: text.len() }
    }

    /// Whether all of it is known.
    pub fn is_known(&self) -> bool {
        self.known >= self.text.len()
    }
}

/// An option's value as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    /// The value, with unresolved parts as written.
    pub text: String,
    /// Whether all of it is known.
    pub known: bool,
}

impl Value {
    /// A value known in full.
    pub fn known(text: &str) -> Value {
        Value { text: text.to_owned(), known: true }
    }

    /// The value when it is known.
    pub fn get(&self) -> Option<&str> {
        self.known.then_some(self.text.as_str())
    }
}

/// One option found on a command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Given {
    /// Its long name (`cpus-per-task`, also for `-c`).
    pub name: String,
    /// Its argument, if it took one.
    pub value: Option<Value>,
    /// The index of the word it started at.
    pub word: usize,
}

/// Why reading the options stopped before the operands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A word whose shell could not be resolved where an option may be
    /// (`srun $ARGS python`): what follows cannot be read without guessing.
    Unknown {
        /// The word's index.
        word: usize,
    },
    /// The program refuses the word (its own error, in words).
    Refused {
        /// The word's index.
        word: usize,
        /// What is wrong, as the program would say it.
        message: String,
    },
}

/// What `getopt_long` made of a command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// The options, in order.
    pub opts: Vec<Given>,
    /// The index of the first operand (the script, or srun's program);
    /// `words.len()` when there is none.
    pub operands: usize,
    /// Where and why reading stopped early.
    pub stop: Option<Stop>,
}

/// An option as the parser sees it.
#[derive(Clone, Copy, Debug)]
struct Opt<'a> {
    name: &'a str,
    short: Option<u8>,
    arg: Arg,
}

/// The options of `program` in `release` plus the plugins' (`plugins`: long
/// name and argument shape).
fn options<'a>(program: Program, release: u32, plugins: &'a [(String, Arg)]) -> Vec<Opt<'a>> {
    let bit = table::line_bit(release);
    let mut v: Vec<Opt<'a>> = ROWS
        .iter()
        .filter(|r| (if program == Program::Sbatch { r.sbatch } else { r.srun }) & bit != 0)
        .map(|r| Opt { name: r.name, short: r.short, arg: r.arg })
        .collect();
    v.extend(plugins.iter().map(|(n, a)| Opt { name: n.as_str(), short: None, arg: *a }));
    v
}

/// Whether `name` names an option of `program` in any release line (or a plugin's).
pub fn is_option(program: Program, name: &str) -> bool {
    ROWS.iter().any(|r| r.name == name && (if program == Program::Sbatch { r.sbatch } else { r.srun }) != 0)
}

/// Reads `words` (without the program's name) as `program` of `release`
/// does, with the SPANK plugins' options `plugins`.
pub fn parse(program: Program, release: u32, plugins: &[(String, Arg)], words: &[ArgWord]) -> Parsed {
    let opts = options(program, release, plugins);
    let prog = program.name();
    let mut out = Parsed { operands: words.len(), ..Parsed::default() };
    let mut i = 0;
    while i < words.len() {
        let start = i;
        let w = &words[i];
        let known = &w.text[..w.known.min(w.text.len())];
        if w.known == 0 && !w.text.is_empty() {
            out.stop = Some(Stop::Unknown { word: i });
            out.operands = i;
            return out;
        }
        if w.text == "--" {
            out.operands = i + 1;
            return out;
        }
        if !w.text.starts_with('-') || w.text == "-" {
            out.operands = i;
            return out;
        }
        let refuse = |message: String| Stop::Refused { word: i, message };
        if let Some(body) = w.text.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (body, None),
            };
            // The name must be known: `--$X` cannot be read.
            if 2 + name.len() > known.len() {
                out.stop = Some(Stop::Unknown { word: i });
                out.operands = i;
                return out;
            }
            let opt = match find_long(&opts, name) {
                Ok(o) => o,
                Err(message) => {
                    out.stop = Some(refuse(format!("{prog}: {message} '--{name}'")));
                    out.operands = i;
                    return out;
                }
            };
            let value_known = w.is_known();
            let value = match (opt.arg, inline) {
                (Arg::None, Some(_)) => {
                    out.stop =
                        Some(refuse(format!("{prog}: option '--{}' doesn't allow an argument", opt.name)));
                    out.operands = i;
                    return out;
                }
                (Arg::None, None) | (Arg::Optional, None) => None,
                (_, Some(v)) => Some(Value { text: v.to_owned(), known: value_known }),
                (Arg::Required, None) => match words.get(i + 1) {
                    Some(next) => {
                        i += 1;
                        Some(Value { text: next.text.clone(), known: next.is_known() })
                    }
                    None => {
                        out.stop =
                            Some(refuse(format!("{prog}: option '--{}' requires an argument", opt.name)));
                        out.operands = i;
                        return out;
                    }
                },
            };
            out.opts.push(Given { name: opt.name.to_owned(), value, word: start });
            i += 1;
            continue;
        }
        // Short options, possibly bundled: -vN2, -c 8.
        let bytes = w.text.as_bytes();
        let mut j = 1;
        while j < bytes.len() {
            if j >= known.len() {
                out.stop = Some(Stop::Unknown { word: i });
                out.operands = i;
                return out;
            }
            let c = bytes[j];
            let Some(opt) = opts.iter().find(|o| o.short == Some(c)) else {
                let shown = w.text.get(j..=j).unwrap_or("?");
                out.stop = Some(refuse(format!("{prog}: invalid option -- '{shown}'")));
                out.operands = i;
                return out;
            };
            let rest = &w.text[j + 1..];
            match opt.arg {
                Arg::None => {
                    out.opts.push(Given { name: opt.name.to_owned(), value: None, word: start });
                    j += 1;
                }
                Arg::Optional => {
                    let value =
                        (!rest.is_empty()).then(|| Value { text: rest.to_owned(), known: w.is_known() });
                    out.opts.push(Given { name: opt.name.to_owned(), value, word: start });
                    break;
                }
                Arg::Required if !rest.is_empty() => {
                    let value = Value { text: rest.to_owned(), known: w.is_known() };
                    out.opts.push(Given { name: opt.name.to_owned(), value: Some(value), word: start });
                    break;
                }
                Arg::Required => {
                    let Some(next) = words.get(i + 1) else {
                        let shown = char::from(c);
                        out.stop = Some(refuse(format!("{prog}: option requires an argument -- '{shown}'")));
                        out.operands = i;
                        return out;
                    };
                    i += 1;
                    let value = Value { text: next.text.clone(), known: next.is_known() };
                    out.opts.push(Given { name: opt.name.to_owned(), value: Some(value), word: start });
                    break;
                }
            }
        }
        i += 1;
    }
    out.operands = words.len();
    out
}

/// A long option by exact name, else by unambiguous prefix (glibc's rule).
fn find_long<'a>(opts: &[Opt<'a>], name: &str) -> Result<Opt<'a>, &'static str> {
    if name.is_empty() {
        return Err("unrecognized option");
    }
    if let Some(o) = opts.iter().find(|o| o.name == name) {
        return Ok(*o);
    }
    let mut found: Option<Opt<'a>> = None;
    for o in opts.iter().filter(|o| o.name.starts_with(name)) {
        match found {
            None => found = Some(*o),
            // The same option listed twice (a plugin's and Slurm's) is not ambiguous.
            Some(f) if f.name == o.name => {}
            Some(_) => return Err("option is ambiguous:"),
        }
    }
    found.ok_or("unrecognized option")
}

#[cfg(test)]
mod tests {
    use super::*;

    const R2205: u32 = (22 << 16) | (5 << 8) | 8;
    const R2511: u32 = (25 << 16) | (11 << 8);

    fn words(s: &str) -> Vec<ArgWord> {
        s.split_whitespace().map(ArgWord::known).collect()
    }

    fn names(p: &Parsed) -> Vec<(String, Option<String>)> {
        p.opts.iter().map(|g| (g.name.clone(), g.value.as_ref().map(|v| v.text.clone()))).collect()
    }

    #[test]
    fn long_short_bundled_and_the_first_operand() {
        let p = parse(
            Program::Srun,
            R2205,
            &[],
            &words("-N2 -c 8 --kill-on-bad-exit=1 --ntasks-per-n=4 python -c x"),
        );
        assert_eq!(
            names(&p),
            vec![
                ("nodes".into(), Some("2".into())),
                ("cpus-per-task".into(), Some("8".into())),
                ("kill-on-bad-exit".into(), Some("1".into())),
                ("ntasks-per-node".into(), Some("4".into())),
            ]
        );
        assert_eq!(p.operands, 5);
        assert_eq!(p.stop, None);
    }

    #[test]
    fn optional_arguments_only_with_equals() {
        let p = parse(Program::Srun, R2205, &[], &words("-K 1 hostname"));
        assert_eq!(names(&p), vec![("kill-on-bad-exit".into(), None)]);
        assert_eq!(p.operands, 1, "'1' is srun's program here, as getopt reads it");
    }

    #[test]
    fn ambiguous_unknown_and_missing_arguments_are_refused() {
        let p = parse(Program::Sbatch, R2205, &[], &words("--gpu=1"));
        assert!(
            matches!(&p.stop, Some(Stop::Refused { message, .. }) if message.contains("ambiguous")),
            "{p:?}"
        );
        let p = parse(Program::Sbatch, R2205, &[], &words("--bogus"));
        assert!(
            matches!(&p.stop, Some(Stop::Refused { message, .. }) if message == "sbatch: unrecognized option '--bogus'")
        );
        let p = parse(Program::Sbatch, R2205, &[], &words("--output"));
        assert!(
            matches!(&p.stop, Some(Stop::Refused { message, .. }) if message.contains("requires an argument"))
        );
        let p = parse(Program::Sbatch, R2205, &[], &words("--exclusive --requeue=1"));
        assert!(
            matches!(&p.stop, Some(Stop::Refused { message, .. }) if message.contains("doesn't allow")),
            "{p:?}"
        );
        // 25.11 gave --requeue an optional argument.
        let p = parse(Program::Sbatch, R2511, &[], &words("--requeue=1"));
        assert_eq!(p.stop, None);
    }

    #[test]
    fn plugin_options_and_unknown_words() {
        let plugins = vec![("auto-rdzv".to_owned(), Arg::Optional)];
        let p = parse(Program::Srun, R2205, &plugins, &words("--auto-rdzv=verbose python"));
        assert_eq!(names(&p), vec![("auto-rdzv".into(), Some("verbose".into()))]);
        let w = vec![ArgWord::known("-N2"), ArgWord { text: "$ARGS".into(), known: 0 }, ArgWord::known("x")];
        let p = parse(Program::Srun, R2205, &[], &w);
        assert_eq!(p.stop, Some(Stop::Unknown { word: 1 }));
        let w = vec![ArgWord { text: "--cpus-per-task=$N".into(), known: 16 }, ArgWord::known("x")];
        let p = parse(Program::Srun, R2205, &[], &w);
        assert_eq!(p.opts[0].value, Some(Value { text: "$N".into(), known: false }));
        assert_eq!(p.operands, 1);
    }

    #[test]
    fn double_dash_ends_options() {
        let p = parse(Program::Srun, R2205, &[], &words("-n4 -- -weird"));
        assert_eq!(p.operands, 2);
    }
}
