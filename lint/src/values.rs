//! Option values read as Slurm reads them: counts, sizes, time limits, GRES
//! and GPU requests, `--signal`, `--dependency`, file name patterns.

/// A time limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Limit {
    /// Seconds.
    Secs(u64),
    /// `UNLIMITED`, `INFINITE`, `-1`.
    Infinite,
}

impl Limit {
    /// As Slurm prints it.
    pub fn words(self) -> String {
        match self {
            Limit::Secs(s) => slurm_formats::units::format_duration(s),
            Limit::Infinite => "UNLIMITED".to_owned(),
        }
    }
}

/// `--time` and partition limits: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`,
/// `D-HH:MM`, `D-HH:MM:SS`, `UNLIMITED`/`INFINITE`; `None` when unreadable.
pub fn parse_limit(s: &str) -> Option<Limit> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinite") || t == "-1" {
        return Some(Limit::Infinite);
    }
    if t.is_empty() || t.contains('.') {
        return None;
    }
    slurm_formats::units::parse_duration(t).map(Limit::Secs)
}

/// A count, or the low end of a range (`2`, `2-4`, `2:4`); `None` when unreadable.
pub fn parse_count(s: &str) -> Option<u64> {
    let low = s.trim().split(['-', ':', ',']).next()?;
    low.parse().ok()
}

/// A memory size in MiB (`4000`, `16G`, `512m`, `1T`); `None` when unreadable.
pub fn parse_mem_mib(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.strip_suffix('B').unwrap_or(&t);
    slurm_formats::units::parse_size(t).map(|b| b >> 20)
}

/// One generic resource request or offer: `gpu:a100:8`, `gpu:2`, `gres/gpu:h100`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gres {
    /// `gpu`, `mps`, `nvme`, ...
    pub name: String,
    /// The type (`a100`), if named.
    pub kind: Option<String>,
    /// How many (1 when not said).
    pub count: u64,
}

/// A GRES list (`--gres`, or a node's `Gres=` / `sinfo %G`): comma-separated
/// `name[:type][:count]`, with sinfo's `(S:0-1)` socket notes and
/// `(IDX:...)` dropped. Entries that cannot be read are left out.
pub fn parse_gres_list(s: &str) -> Vec<Gres> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut item = String::new();
    for c in s.chars().chain(std::iter::once(',')) {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                if let Some(g) = parse_gres(&item) {
                    out.push(g);
                }
                item.clear();
            }
            _ if depth == 0 => item.push(c),
            _ => {}
        }
    }
    out
}

fn parse_gres(item: &str) -> Option<Gres> {
    let item = item.trim();
    let item = item.strip_prefix("gres/").or_else(|| item.strip_prefix("gres:")).unwrap_or(item);
    if item.is_empty() || item == "(null)" {
        return None;
    }
    let parts: Vec<&str> = item.split(':').collect();
    let count_of = |s: &str| -> Option<u64> {
        let s = s.trim();
        let (num, mult) = match s.chars().last() {
            Some('k' | 'K') => (&s[..s.len() - 1], 1024),
            Some('m' | 'M') => (&s[..s.len() - 1], 1024 * 1024),
            Some('g' | 'G') => (&s[..s.len() - 1], 1024 * 1024 * 1024),
            _ => (s, 1),
        };
        num.parse::<u64>().ok().map(|n| n.saturating_mul(mult))
    };
    let name = parts[0].to_owned();
    if name.is_empty() {
        return None;
    }
    match parts.as_slice() {
        [_] => Some(Gres { name, kind: None, count: 1 }),
        [_, x] => match count_of(x) {
            Some(c) => Some(Gres { name, kind: None, count: c }),
            None => Some(Gres { name, kind: Some((*x).to_owned()), count: 1 }),
        },
        [_, t, c, ..] => Some(Gres { name, kind: Some((*t).to_owned()), count: count_of(c)? }),
        [] => None,
    }
}

/// A `--gpus*` value: `[type:]count`.
pub fn parse_gpus(s: &str) -> Option<(Option<String>, u64)> {
    let s = s.trim();
    match s.rsplit_once(':') {
        Some((t, c)) => Some((Some(t.to_owned()), c.trim().parse().ok()?)),
        None => Some((None, s.parse().ok()?)),
    }
}

/// `--signal=[{R|B}:]SIG[@TIME]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signal {
    /// `B:`: the batch shell gets it (and only it).
    pub batch: bool,
    /// The signal's name without `SIG` (`USR1`).
    pub name: String,
    /// Seconds before the end (60 when not said).
    pub secs: u64,
}

/// Reads a `--signal` value; `None` when unreadable.
pub fn parse_signal(s: &str) -> Option<Signal> {
    let s = s.trim();
    let (flags, rest) = match s.split_once(':') {
        Some((f, r)) if !f.is_empty() && f.chars().all(|c| matches!(c, 'B' | 'b' | 'R' | 'r')) => (f, r),
        _ => ("", s),
    };
    let (sig, secs) = match rest.split_once('@') {
        Some((sig, t)) => (sig, t.trim().parse().ok()?),
        None => (rest, 60),
    };
    if sig.is_empty() {
        return None;
    }
    Some(Signal { batch: flags.contains(['B', 'b']), name: super::job::signal_name(sig), secs })
}

/// One `--dependency` condition: `afterok:12:13` gives `("afterok", ["12", "13"])`.
pub fn parse_dependency(s: &str) -> Vec<(String, Vec<String>)> {
    s.split([',', '?'])
        .filter(|i| !i.is_empty())
        .map(|item| {
            let mut parts = item.split(':');
            let kind = parts.next().unwrap_or("").to_ascii_lowercase();
            let jobs = parts.map(|j| j.split('+').next().unwrap_or(j).to_owned()).collect();
            (kind, jobs)
        })
        .collect()
}

/// The `%` fields of an output file name pattern (`%A`, `%a`, `%j`, ...,
/// with their padding digits removed: `%4a` is `a`); empty when the pattern
/// has a `\` (Slurm then substitutes nothing).
pub fn pattern_fields(pattern: &str) -> Vec<char> {
    if pattern.contains('\\') {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        while chars.peek().is_some_and(char::is_ascii_digit) {
            chars.next();
        }
        if let Some(f) = chars.next() {
            if f != '%' {
                out.push(f);
            }
        }
    }
    out
}

/// The directory of an output pattern with what can be known filled in
/// (`%u` the user, `%x` the job name, `%%`); `None` when the directory part
/// holds a field only known when the job runs (`%j`, `%N`, ...).
pub fn pattern_dir(pattern: &str, user: &str, job_name: &str) -> Option<String> {
    let dir = match pattern.rsplit_once('/') {
        Some(("", _)) => return Some("/".to_owned()),
        Some((d, _)) => d,
        None => return Some(String::new()),
    };
    if dir.contains('\\') {
        return Some(dir.replace('\\', ""));
    }
    let mut out = String::new();
    let mut chars = dir.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        while chars.peek().is_some_and(char::is_ascii_digit) {
            chars.next();
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('u') if !user.is_empty() => out.push_str(user),
            Some('x') => out.push_str(job_name),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_counts() {
        assert_eq!(parse_limit("48:00:00"), Some(Limit::Secs(48 * 3600)));
        assert_eq!(parse_limit("2-00:00:00"), Some(Limit::Secs(2 * 86400)));
        assert_eq!(parse_limit("90"), Some(Limit::Secs(90 * 60)));
        assert_eq!(parse_limit("UNLIMITED"), Some(Limit::Infinite));
        assert_eq!(parse_limit("infinite"), Some(Limit::Infinite));
        assert_eq!(parse_limit("soon"), None);
        assert_eq!(parse_count("2-4"), Some(2));
        assert_eq!(parse_count("x"), None);
        assert_eq!(parse_mem_mib("16G"), Some(16384));
        assert_eq!(parse_mem_mib("512m"), Some(512));
        assert_eq!(parse_mem_mib("4000"), Some(4000));
        assert_eq!(parse_mem_mib("0"), Some(0));
        assert_eq!(parse_mem_mib("lots"), None);
    }

    #[test]
    fn gres_lists_as_sinfo_and_users_write_them() {
        assert_eq!(
            parse_gres_list("gpu:h100:8(S:0-1),nvme:2"),
            vec![
                Gres { name: "gpu".into(), kind: Some("h100".into()), count: 8 },
                Gres { name: "nvme".into(), kind: None, count: 2 }
            ]
        );
        assert_eq!(
            parse_gres_list("gpu:a100"),
            vec![Gres { name: "gpu".into(), kind: Some("a100".into()), count: 1 }]
        );
        assert_eq!(parse_gres_list("gres/gpu:4"), vec![Gres { name: "gpu".into(), kind: None, count: 4 }]);
        assert_eq!(parse_gres_list("(null)"), vec![]);
        assert_eq!(
            parse_gres_list("gpu:h100:8(IDX:0-7)"),
            vec![Gres { name: "gpu".into(), kind: Some("h100".into()), count: 8 }]
        );
        assert_eq!(parse_gpus("a100:8"), Some((Some("a100".into()), 8)));
        assert_eq!(parse_gpus("8"), Some((None, 8)));
    }

    #[test]
    fn signals_dependencies_and_patterns() {
        assert_eq!(parse_signal("B:USR1@180"), Some(Signal { batch: true, name: "USR1".into(), secs: 180 }));
        assert_eq!(parse_signal("SIGUSR1@90"), Some(Signal { batch: false, name: "USR1".into(), secs: 90 }));
        assert_eq!(parse_signal("RB:10"), Some(Signal { batch: true, name: "USR1".into(), secs: 60 }));
        assert_eq!(parse_signal("USR1@x"), None);
        assert_eq!(
            parse_dependency("afterok:12:13?afterany:14"),
            vec![
                ("afterok".to_owned(), vec!["12".to_owned(), "13".to_owned()]),
                ("afterany".to_owned(), vec!["14".to_owned()])
            ]
        );
        assert_eq!(pattern_fields("logs/%x-%A_%4a.out"), vec!['x', 'A', 'a']);
        assert_eq!(pattern_fields("a\\%j"), Vec::<char>::new());
        assert_eq!(
            pattern_dir("/scratch/%u/logs/%x-%j.out", "ana", "run").as_deref(),
            Some("/scratch/ana/logs")
        );
        assert_eq!(pattern_dir("logs/%j/out", "ana", "run"), None);
        assert_eq!(pattern_dir("out.log", "ana", "run").as_deref(), Some(""));
    }
}
