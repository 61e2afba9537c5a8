//! `slurm_formats::hostlist` against Slurm itself: every expression below is expanded by
//! `scontrol show hostnames=EXPR` (Slurm's `hostlist_create` + `hostlist_shift`) and
//! by [`hostlist::expand`], and the two must agree host for host.
//!
//! Slurm "fails" on an expression when `scontrol` writes anything to stderr (it
//! prints `Invalid hostlist: ...` or a range error but still exits 0) or exits
//! non-zero. `expand` must fail exactly then, except for the differences the module
//! documents, which are checked here as rules or, case by case, in [`KNOWN_DIFFERENCES`]:
//!
//! - Slurm expands to no hosts (`""`, `","`): `expand` fails.
//! - a host Slurm prints contains `[` or `]` (`n[1-2` gives `n]`): `expand` fails.
//!   (An unclosed `[` at the very start, `[5`, Slurm just drops: see [`KNOWN_DIFFERENCES`].)
//!
//! Needs `scontrol` (Slurm 22.05; `/usr/bin/scontrol` or on `PATH`), but no daemon: a
//! two-line `slurm.conf` in a temporary directory is enough. Without `scontrol` the
//! test fails; it never skips.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use slurm_formats::hostlist;

/// What Slurm made of an expression.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slurm {
    /// The hosts printed, one a line.
    Hosts(Vec<String>),
    /// stderr (and the exit status), when it wrote to stderr or exited non-zero.
    Fails(String),
}

/// Expressions where `expand` deliberately differs from Slurm: the expression, what
/// Slurm does (`Ok(hosts)`; `Err(_)` when it fails), and what `expand` does.
type Known = (&'static str, Result<&'static [&'static str], ()>, Result<&'static [&'static str], ()>);

const KNOWN_DIFFERENCES: &[Known] = &[
    // Slurm clamps numbers above u64::MAX; a bracket with one is refused here.
    ("n[99999999999999999999]", Ok(&["n18446744073709551615"]), Err(())),
    // ... and a host without brackets is kept as written here.
    ("n99999999999999999999", Ok(&["n18446744073709551615"]), Ok(&["n99999999999999999999"])),
    // scontrol crashes (SIGSEGV) on a range that reaches u64::MAX.
    (
        "n[18446744073709551614-18446744073709551615]",
        Err(()),
        Ok(&["n18446744073709551614", "n18446744073709551615"]),
    ),
    // An unclosed '[' at the start: Slurm drops the '['; it is an error here, as
    // every unclosed '[' is.
    ("[5", Ok(&["5"]), Err(())),
    ("[1-2", Ok(&["1-2"]), Err(())),
    // Slurm keeps a newline in the host name (printed, it reads as two lines).
    ("a\nb", Ok(&["a", "b"]), Err(())),
    // An invalid bracket left of the second-to-last: Slurm logs an error on stderr
    // (so it counts as failing) but the list is not refused; here it is refused.
    ("a[3-1]b[1]c[2]", Err(()), Err(())),
];

/// Slurm's count for expressions over the limits, which `expand` refuses.
const OVER_LIMITS: &[(&str, usize)] = &[("n[1-65536],x", 65537), ("a[1-300]b[1-300]", 90000)];

fn scontrol_path() -> PathBuf {
    let fixed = Path::new("/usr/bin/scontrol");
    if fixed.exists() {
        return fixed.to_path_buf();
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("scontrol")).find(|f| f.exists()));
    on_path.unwrap_or_else(|| {
        panic!(
            "hostlist oracle: `scontrol` not found (neither /usr/bin/scontrol nor on PATH). \
             This test needs Slurm's scontrol (apt-get install slurm-client) to compare \
             slurm_formats::hostlist against Slurm; it does not skip."
        )
    })
}

struct Oracle {
    scontrol: PathBuf,
    dir: PathBuf,
}

impl Oracle {
    fn new() -> Oracle {
        let scontrol = scontrol_path();
        let dir = std::env::temp_dir().join(format!("hostlist-oracle-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("slurm.conf"), "ClusterName=oracle\nSlurmctldHost=localhost\n").unwrap();
        Oracle { scontrol, dir }
    }

    fn run(&self, expr: &str) -> Slurm {
        let out = Command::new(&self.scontrol)
            .arg("show")
            // `hostnames=EXPR`, not `hostnames EXPR`: an expression starting with
            // '-' would be taken for an option.
            .arg(format!("hostnames={expr}"))
            .env("SLURM_CONF", self.dir.join("slurm.conf"))
            .env_remove("SLURM_NODELIST")
            .output()
            .unwrap_or_else(|e| panic!("hostlist oracle: cannot run {}: {e}", self.scontrol.display()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || !stderr.is_empty() {
            return Slurm::Fails(format!("{}{}", stderr.trim_end(), status_note(&out.status)));
        }
        Slurm::Hosts(String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
    }
}

fn status_note(status: &std::process::ExitStatus) -> String {
    if status.success() { String::new() } else { format!(" [{status}]") }
}

impl Drop for Oracle {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The expressions to compare, hand-picked cases first, then generated ones.
fn expressions() -> Vec<String> {
    let mut v: Vec<String> = [
        // padding
        "n[01-10]",
        "n[1-010]",
        "n[01-2]",
        "n[1-02]",
        "n[001-3]",
        "n[09-11]",
        "n[099-101]",
        "n[0098-102]",
        "n[007]",
        "n[0]",
        "n[00]",
        "n[000-1]",
        "n[0-0]",
        // several ranges, items, duplicates
        "n[1-3,7,10-11]",
        "n[3,1-2,1]",
        "n[1,1]",
        "n1,n1",
        "n[1-3,2-4]",
        "a1,b[2-3],c",
        "n[1-2],n[3-4]",
        "n9,n10",
        "n1,n02",
        "n1,n01",
        "a01b1,a1b2",
        // prefixes with digits and punctuation
        "a1b[9-11]",
        "rack2-n[1-2]",
        "gpu-01-[1-2]",
        "x_y.z[5-6]",
        "[1-2]",
        "é[1-2]",
        "a=b",
        "a'b",
        "-a",
        "n1-3",
        // text after the last bracket
        "n[1-2]x",
        "n[1-2]-ib",
        "[1-2]n",
        "n[1-2]x,m",
        "n[1-2],m[3]x",
        "n[01-3]a",
        "n[1,2]m",
        "n[1-2]]",
        "n[[1-2]]",
        "n[2]a]",
        // several brackets
        "r[1-2]n[1-2]",
        "n[1-2][3-4]",
        "n[1-2]x[3-4]",
        "a[1-2]b[3]",
        "a[1-2]-b[3]",
        "a[1-2]b[3-4]c[5-6]",
        "a[1-2]b[3-4]c[5-6]d[7-8]",
        "x[1-2]y[3]z",
        "a[x]b[1-2]",
        "a[1]]b[2]",
        "a[1]b]c[2]",
        "a[1]b[c[2]",
        // invalid ranges
        "n[3-1]",
        "n[a-b]",
        "n[]",
        "n[-1]",
        "n[1--2]",
        "n[1-2-3]",
        "n[,1]",
        "n[1,]",
        "n[1,,2]",
        "n[+]",
        "n[-]",
        "n[1--]",
        "n[--1]",
        "n[0x10]",
        "n[1-0x10]",
        "n[1x-2]",
        "n[１]",
        "n[1- -2]",
        "n[1 ,2]",
        "n[0-65536]",
        "a[1-2,5-70000]b[1]c[5]",
        // strtoul quirks Slurm accepts
        "n[1-]",
        "n[5]",
        "n[+1]",
        "n[ 1]",
        "n[1-+2]",
        "n[1- 2]",
        "n[1 -2]",
        "n[1a-2]",
        "n[1X-2]",
        "n[1, 2]",
        // unclosed and stray brackets (Slurm makes hosts with brackets in them)
        "n[1-",
        "n[1-2",
        "n[",
        "x[5",
        "[5",
        "n[1,2",
        "n1-2]",
        "n]",
        "a]b[1-2],c",
        "a]b[1,2]",
        "a[1-2],b]",
        "a[b[1-2]",
        "n[1-2]a[",
        // separators and empty lists
        "",
        " ",
        ",",
        " , ",
        "a,,b",
        ",a",
        "a,",
        "n[1-2],",
        "a b",
        "a  b",
        " a",
        "a ",
        "a\tb",
        "a,b c\td",
        "n[1-2] x",
        "n[1-2]\t,m",
        "n[1-2]  ,  m[1]",
        // limits
        "n[1-65536]",
        "n[0-65535]",
        "n[18446744073709551615]",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();

    // Paddings: every low and high end written 1 to 3 digits wide.
    for (lo, hi) in [(0u32, 3u32), (1, 1), (7, 12), (9, 10), (98, 101), (5, 4)] {
        for lw in 1..=3 {
            for hw in 1..=3 {
                v.push(format!("n[{lo:0lw$}-{hi:0hw$}]"));
            }
        }
    }
    // Prefixes, with a range and with several items.
    for prefix in ["n", "node", "a1b", "rack2-n", "gpu-a.b_c", "r1n", "x-", ""] {
        v.push(format!("{prefix}[1-3]"));
        v.push(format!("{prefix}[08-10,3]"));
        v.push(format!("{prefix}1,{prefix}[2-3],login"));
    }
    // Two and three brackets with paddings.
    for (a, b) in [("1-2", "1-2"), ("01-02", "9-10"), ("3", "1,3"), ("1-2", "007")] {
        v.push(format!("r[{a}]n[{b}]"));
        v.push(format!("r[{a}]-n[{b}],x[{b}]"));
        v.push(format!("a[{a}]b[{b}]c[{a}]"));
    }
    v
}

fn compare(oracle: &Oracle, expr: &str, problems: &mut Vec<String>) {
    let slurm = oracle.run(expr);
    let ours = hostlist::expand(expr);
    if let Some((_, slurm_claim, ours_claim)) = KNOWN_DIFFERENCES.iter().find(|k| k.0 == expr) {
        let want_slurm = match slurm_claim {
            Ok(h) => Slurm::Hosts(h.iter().map(|s| s.to_string()).collect()),
            Err(()) => Slurm::Fails(String::new()),
        };
        let slurm_as_claimed = match (&slurm, &want_slurm) {
            (Slurm::Fails(_), Slurm::Fails(_)) => true,
            (a, b) => a == b,
        };
        if !slurm_as_claimed {
            problems.push(format!("{expr:?}: known difference, but Slurm now gives {slurm:?}"));
        }
        let ours_as_claimed = match (&ours, ours_claim) {
            (Ok(h), Ok(want)) => h == want,
            (Err(_), Err(())) => true,
            _ => false,
        };
        if !ours_as_claimed {
            problems.push(format!("{expr:?}: known difference, but expand gives {ours:?}"));
        }
        return;
    }
    let ok = match (&slurm, &ours) {
        (Slurm::Fails(_), Err(_)) => true,
        (Slurm::Fails(_), Ok(_)) => false,
        // Documented: no hosts, or hosts with brackets in them, are errors here.
        (Slurm::Hosts(h), Err(_)) => h.is_empty() || h.iter().any(|s| s.contains(['[', ']'])),
        (Slurm::Hosts(h), Ok(o)) => h == o,
    };
    if !ok {
        let shown = |r: &Result<Vec<String>, hostlist::HostlistError>| match r {
            Ok(h) if h.len() > 20 => format!("Ok({} hosts: {:?} ...)", h.len(), h.get(..20)),
            other => format!("{other:?}"),
        };
        let slurm_shown = match &slurm {
            Slurm::Hosts(h) if h.len() > 20 => format!("{} hosts: {:?} ...", h.len(), h.get(..20)),
            other => format!("{other:?}"),
        };
        problems.push(format!("{expr:?}: Slurm {slurm_shown}, expand {}", shown(&ours)));
        return;
    }
    // count and first agree with expand on everything.
    let (count, first) = (hostlist::count(expr), hostlist::first(expr));
    match &ours {
        Ok(h) => {
            if count.as_ref().ok() != Some(&h.len()) || first.as_ref().ok() != h.first() {
                problems.push(format!("{expr:?}: count {count:?} / first {first:?} disagree with expand"));
            }
        }
        Err(e) => {
            if count.as_ref().err() != Some(e) || first.as_ref().err() != Some(e) {
                problems.push(format!("{expr:?}: count {count:?} / first {first:?} disagree with expand"));
            }
        }
    }
}

#[test]
fn expand_matches_scontrol_show_hostnames() {
    let started = Instant::now();
    let oracle = Oracle::new();
    let exprs = expressions();
    let mut problems = Vec::new();
    for expr in &exprs {
        compare(&oracle, expr, &mut problems);
    }
    for (expr, ..) in KNOWN_DIFFERENCES {
        compare(&oracle, expr, &mut problems);
    }
    for (expr, slurm_count) in OVER_LIMITS {
        match oracle.run(expr) {
            Slurm::Hosts(h) if h.len() == *slurm_count => {}
            other => {
                problems.push(format!("{expr:?}: Slurm was expected to give {slurm_count} hosts: {other:?}"))
            }
        }
        if let Ok(h) = hostlist::expand(expr) {
            problems.push(format!("{expr:?}: over the limits, but expand gives {} hosts", h.len()));
        }
    }
    let n = exprs.len() + KNOWN_DIFFERENCES.len() + OVER_LIMITS.len();
    eprintln!("hostlist oracle: {n} expressions compared with scontrol in {:?}", started.elapsed());
    assert!(exprs.len() >= 100, "only {} expressions", exprs.len());
    assert!(
        problems.is_empty(),
        "{} of {n} expressions differ from Slurm:\n{}",
        problems.len(),
        problems.join("\n")
    );
}
