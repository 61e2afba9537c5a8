//! The agent's summaries in slurmdbd: array tasks and het components each
//! get their own row, the site's text is kept byte for byte or not touched
//! (per release), and a writer that comes between is undone.
//!
//! slurmdbd is a fake `sacct`/`sacctmgr` pair over files: `jobs` lists the
//! rows (`RAW|JOBID|ARRAY_ID|HET_ID`, 0 for none), `admin.RAW` and
//! `system.RAW` hold the comments. Both select rows as slurmdbd does
//! (as_mysql_jobacct_process.c `_setup_job_cond_selected_steps`: `A_T` and
//! `H+O` by their own, a plain `N` by `id_job`, `het_job_id` or
//! `id_array_job`), sacct prints them as Slurm's print_fields.c does (no
//! escaping), and sacctmgr changes the text as `strip_quotes` and MariaDB do
//! on the release in `release` (quotes to backticks, backslash escapes, and
//! on 22.05 lowercase). `hook.N` runs just before the N-th sacct call
//! answers, `hook.mgr.N` just before the N-th sacctmgr write: another
//! writer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use gpu_health::admin_comment::{Field, Rules, site_text};
use gpu_health::usage::{NodeUsage, parse_all};
use gpu_node_agent::slurm::Accounting;
use gpu_node_agent::usage::write_admin_comment;
use slurm_formats::release::Release;

const FAKE_SACCT: &str = r#"#!/bin/sh
D=$(dirname "$0")
echo "sacct $*" >> "$D/acct.calls"
n=$(($(cat "$D/n.sacct" 2>/dev/null || echo 0) + 1)); echo $n > "$D/n.sacct"
[ -f "$D/hook.$n" ] && sh "$D/hook.$n"
x=$2
T='|'
for a; do case "$a" in --delimiter=*) T=${a#--delimiter=} ;; esac; done
while IFS='|' read -r raw jid arr het; do
  case "$x" in
    *_*|*+*) [ "$jid" = "$x" ] || continue ;;
    *) [ "$raw" = "$x" ] || [ "$arr" = "$x" ] || [ "$het" = "$x" ] || continue ;;
  esac
  printf '%s%s%s%s' "$raw" "$T" "$jid" "$T"; cat "$D/system.$raw" 2>/dev/null
  printf '%s%s%s' "$T" "$raw" "$T"; cat "$D/admin.$raw" 2>/dev/null
  printf '%s%s\n' "$T" "$raw"
done < "$D/jobs"
"#;

const FAKE_SACCTMGR: &str = r#"#!/bin/sh
D=$(dirname "$0")
[ "$1" = -V ] && echo "slurm $(cat "$D/release").5" && exit 0
echo "sacctmgr $*" >> "$D/acct.calls"
n=$(($(cat "$D/n.mgr" 2>/dev/null || echo 0) + 1)); echo $n > "$D/n.mgr"
[ -f "$D/hook.mgr.$n" ] && sh "$D/hook.mgr.$n" && echo "hook.mgr.$n ran" >> "$D/acct.calls"
x=${5#jobid=}
field=${7%%=*}
case "$field" in AdminComment) f=admin ;; SystemComment) f=system ;; *) exit 1 ;; esac
text=${7#*=}
case "$(cat "$D/release")" in 22.05) lower='A-Z' upper='a-z' ;; *) lower='' upper='' ;; esac
while IFS='|' read -r raw jid arr het; do
  case "$x" in
    *_*|*+*) [ "$jid" = "$x" ] || continue ;;
    *) [ "$raw" = "$x" ] || [ "$arr" = "$x" ] || [ "$het" = "$x" ] || continue ;;
  esac
  printf '%s' "$text" | tr "\"'$lower" "\`\`$upper" | sed 's/\\\(.\)/\1/g' > "$D/$f.$raw"
done < "$D/jobs"
echo " Modified jobs..."
"#;

struct Db {
    dir: PathBuf,
}

impl Db {
    fn new(name: &str, release: &str, jobs: &[&str]) -> Db {
        let dir = std::env::temp_dir().join(format!("agent-acct-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for (name, text) in [("sacct", FAKE_SACCT), ("sacctmgr", FAKE_SACCTMGR)] {
            fs::write(dir.join(name), text).unwrap();
            fs::set_permissions(dir.join(name), fs::Permissions::from_mode(0o755)).unwrap();
        }
        fs::write(dir.join("release"), release).unwrap();
        fs::write(dir.join("jobs"), jobs.iter().map(|j| format!("{j}\n")).collect::<String>()).unwrap();
        Db { dir }
    }

    fn acct(&self) -> Accounting {
        Accounting {
            sacct: self.dir.join("sacct"),
            sacctmgr: self.dir.join("sacctmgr"),
            timeout: Duration::from_secs(20),
        }
    }

    fn rules(&self) -> Rules {
        Rules::of(Some(self.acct().release().unwrap()))
    }

    fn set(&self, field: &str, raw: u32, text: &str) {
        fs::write(self.dir.join(format!("{field}.{raw}")), text).unwrap();
    }

    fn get(&self, field: &str, raw: u32) -> String {
        fs::read_to_string(self.dir.join(format!("{field}.{raw}"))).unwrap_or_default()
    }

    fn calls(&self) -> String {
        fs::read_to_string(self.dir.join("acct.calls")).unwrap_or_default()
    }

    /// Another writer replacing `raw`'s AdminComment just before the `n`-th sacct call answers.
    fn hook(&self, n: u32, raw: u32, text: &str) {
        let file = self.dir.join(format!("admin.{raw}"));
        fs::write(
            self.dir.join(format!("hook.{n}")),
            format!("printf '%s' '{text}' > '{}'\n", file.display()),
        )
        .unwrap();
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn usage(node: &str) -> NodeUsage {
    let w =
        format!("sgu1;node={node};t=10;from=1;to=31;idle=0;g=0:GPU-5f1c0a04-7d2e:95.0:99:100:81559:0:3:1");
    NodeUsage::parse_word(&w).unwrap()
}

fn nodes(text: &str) -> Vec<String> {
    parse_all(text).into_iter().map(|u| u.node.to_ascii_lowercase()).collect()
}

/// Array 100 of two tasks: task 0 ran as job 101 on node1, task 1 in the
/// array's own record (raw id 100) on node2. Addressed `jobid=100`, a write
/// would land on both tasks; each task gets its own summary only.
#[test]
fn each_array_task_keeps_its_own_summary() {
    let db = Db::new("array", "24.11", &["101|100_0|100|0", "100|100_1|100|0"]);
    let (acct, rules) = (db.acct(), db.rules());
    let k0 = write_admin_comment(&acct, rules, 101, &usage("node1")).unwrap();
    let k1 = write_admin_comment(&acct, rules, 100, &usage("node2")).unwrap();
    assert_eq!((k0.id.as_str(), k1.id.as_str()), ("100_0", "100_1"));
    assert_eq!(nodes(&db.get("admin", 101)), ["node1"], "{}", db.calls());
    assert_eq!(nodes(&db.get("admin", 100)), ["node2"], "{}", db.calls());
    assert!(db.calls().contains("where jobid=100_1 set AdminComment="), "{}", db.calls());
    // One read, one write, two read-backs each.
    assert_eq!((k0.calls, k1.calls), (4, 4));
}

/// Het job 200: component 0 (raw 200) on node1, component 1 (raw 201) on node2.
#[test]
fn each_het_component_keeps_its_own_summary() {
    let db = Db::new("het", "26.05", &["200|200+0|0|200", "201|200+1|0|200"]);
    let (acct, rules) = (db.acct(), db.rules());
    assert_eq!(write_admin_comment(&acct, rules, 200, &usage("node1")).unwrap().id, "200+0");
    assert_eq!(write_admin_comment(&acct, rules, 201, &usage("node2")).unwrap().id, "200+1");
    assert_eq!(nodes(&db.get("admin", 200)), ["node1"]);
    assert_eq!(nodes(&db.get("admin", 201)), ["node2"]);
}

/// A two-node job whose site text has upper case, a `|` and a newline:
/// 24.11 and 26.05 keep it byte for byte beside both summaries; 22.05's
/// sacctmgr would lowercase it, so the AdminComment is left alone and the
/// summaries go to the SystemComment.
#[test]
fn the_sites_text_is_kept_or_left_alone_per_release() {
    let site = "JS1:Abc|x\nline two";
    for release in ["22.05", "24.11", "26.05"] {
        let db = Db::new(&format!("site-{release}"), release, &["5|5|0|0"]);
        db.set("admin", 5, site);
        let (acct, rules) = (db.acct(), db.rules());
        for node in ["node1", "node2"] {
            let k = write_admin_comment(&acct, rules, 5, &usage(node)).unwrap();
            assert_eq!(k.field, if release == "22.05" { Field::System } else { Field::Admin }, "{release}");
        }
        let admin = db.get("admin", 5);
        if release == "22.05" {
            assert_eq!(admin, site, "22.05 touched the site's text");
            assert_eq!(nodes(&db.get("system", 5)), ["node1", "node2"]);
        } else {
            assert_eq!(site_text(&admin), site, "{release}");
            assert!(admin.starts_with(&format!("{site} sgu1;node=node1;")), "{admin:?}");
            assert_eq!(nodes(&admin), ["node1", "node2"]);
            assert_eq!(db.get("system", 5), "");
        }
    }
}

/// Quotes and backslashes come back changed on every release: the
/// AdminComment is never written; with a SystemComment of the site's too,
/// nothing is (the summary stays in the agent's log).
#[test]
fn quotes_and_backslashes_are_never_rewritten() {
    for release in ["22.05", "24.11", "26.05"] {
        let db = Db::new(&format!("quotes-{release}"), release, &["5|5|0|0", "6|6|0|0"]);
        let (acct, rules) = (db.acct(), db.rules());
        let site = "say \"hi\" it's C:\\tmp";
        db.set("admin", 5, site);
        assert_eq!(write_admin_comment(&acct, rules, 5, &usage("node1")).unwrap().field, Field::System);
        assert_eq!(db.get("admin", 5), site);
        db.set("admin", 6, site);
        db.set("system", 6, "bb: setup: ok");
        let e = write_admin_comment(&acct, rules, 6, &usage("node1")).unwrap_err();
        assert!(e.contains("quote") && e.contains("SystemComment holds other text"), "{e}");
        assert_eq!((db.get("admin", 6).as_str(), db.get("system", 6).as_str()), (site, "bb: setup: ok"));
    }
}

/// The site's end-of-job writer (jobstats from EpilogSlurmctld) replaces
/// the whole AdminComment just after the agent's first read-back: the
/// second read-back, after a random wait, sees it, and the summary is
/// merged again beside the new text.
#[test]
fn a_writer_between_the_read_backs_is_undone() {
    let db = Db::new("race", "24.11", &["5|5|0|0"]);
    db.set("admin", 5, "JS1:old");
    db.hook(3, 5, "JS1:new");
    let k = write_admin_comment(&db.acct(), db.rules(), 5, &usage("node1")).unwrap();
    let admin = db.get("admin", 5);
    assert_eq!(site_text(&admin), "JS1:new");
    assert_eq!(nodes(&admin), ["node1"]);
    // Read, write, read back, read again (changed); write, read back, read again.
    assert_eq!(k.calls, 7, "{}", db.calls());
    // Replaced between the write and the first read-back: the same.
    let db = Db::new("race2", "24.11", &["5|5|0|0"]);
    db.hook(2, 5, "JS1:between");
    write_admin_comment(&db.acct(), db.rules(), 5, &usage("node1")).unwrap();
    assert_eq!(site_text(&db.get("admin", 5)), "JS1:between");
    assert_eq!(nodes(&db.get("admin", 5)), ["node1"]);
}

/// Two nodes' agents at once on one job, each reading before the other
/// writes: every node's summary and the site's text are there at the end.
#[test]
fn two_agents_at_once() {
    for round in 0..3 {
        let db = Db::new(&format!("two-{round}"), "24.11", &["5|5|0|0"]);
        db.set("admin", 5, "JS1:site");
        let (acct, rules) = (db.acct(), db.rules());
        std::thread::scope(|s| {
            let a = s.spawn(|| write_admin_comment(&acct, rules, 5, &usage("node1")));
            let b = s.spawn(|| write_admin_comment(&acct, rules, 5, &usage("node2")));
            a.join().unwrap().unwrap();
            b.join().unwrap().unwrap();
        });
        let admin = db.get("admin", 5);
        assert_eq!(site_text(&admin), "JS1:site", "{admin:?}\n{}", db.calls());
        let mut n = nodes(&admin);
        n.sort();
        assert_eq!(n, ["node1", "node2"], "{admin:?}\n{}", db.calls());
    }
}

/// What no read-back can see (1): the site writes between the agent's read
/// and its write; the agent's write, made from what it read, replaces the
/// site's new text, and nothing tells them apart afterwards.
#[test]
fn the_residual_race_a_write_inside_the_read_write_window() {
    let db = Db::new("window", "24.11", &["5|5|0|0"]);
    db.set("admin", 5, "JS1:old");
    let file = db.dir.join("admin.5");
    fs::write(db.dir.join("hook.mgr.1"), format!("printf 'JS1:new' > '{}'\n", file.display())).unwrap();
    write_admin_comment(&db.acct(), db.rules(), 5, &usage("node1")).unwrap();
    assert!(db.calls().contains("hook.mgr.1 ran"), "{}", db.calls());
    assert_eq!(site_text(&db.get("admin", 5)), "JS1:old");
}

/// What no read-back can see (2): a writer that read before the agent's write
/// and writes after the agent's last read-back replaces the summary.
#[test]
fn the_residual_race_a_write_after_the_last_read_back() {
    let db = Db::new("late", "24.11", &["5|5|0|0"]);
    let k = write_admin_comment(&db.acct(), db.rules(), 5, &usage("node1")).unwrap();
    assert_eq!(k.calls, 4);
    // The late writer, with the text it read before the agent wrote.
    db.set("admin", 5, "JS1:late");
    assert!(nodes(&db.get("admin", 5)).is_empty());
}

/// Text that framed rows when sacct's delimiter was `|` (a site's, or a
/// burst buffer's error echoing a user's `#BB` lines) is only text now: it
/// moves nothing between the comments, and the summary goes after it.
#[test]
fn a_comment_cannot_forge_the_framing() {
    let system = "bb: #BB x|5|sgu1;node=evil|5\n5|5|y";
    let admin = "js1:a|5|b|5\n5|5|c|5|d";
    let db = Db::new("forged", "24.11", &["5|5|0|0"]);
    db.set("system", 5, system);
    db.set("admin", 5, admin);
    let k = write_admin_comment(&db.acct(), db.rules(), 5, &usage("node1")).unwrap();
    assert_eq!(k.field, Field::Admin);
    assert_eq!(db.get("system", 5), system);
    let now = db.get("admin", 5);
    assert_eq!(site_text(&now), admin, "{now:?}");
    assert_eq!(nodes(&now), ["node1"]);
    assert!(db.calls().contains("--delimiter=~"), "{}", db.calls());
}

/// A comment that holds the read's own delimiter (only a guess makes one:
/// here a hook copies it from the call) is refused: nothing is written,
/// and the summary stays in the agent's log.
#[test]
fn a_comment_holding_the_delimiter_is_not_written_over() {
    let db = Db::new("token", "24.11", &["5|5|0|0"]);
    db.set("admin", 5, "js1:a");
    let calls = db.dir.join("acct.calls");
    let file = db.dir.join("admin.5");
    fs::write(
        db.dir.join("hook.1"),
        format!(
            "T=$(tail -n 1 '{}' | sed 's/.*--delimiter=\\([^ ]*\\).*/\\1/')\nprintf 'x%s5%s%s5%sy' \"$T\" \"$T\" \"$T\" \"$T\" > '{}'\n",
            calls.display(),
            file.display()
        ),
    )
    .unwrap();
    let e = write_admin_comment(&db.acct(), db.rules(), 5, &usage("node1")).unwrap_err();
    assert!(e.contains("not rows framed"), "{e}");
    assert!(
        db.get("admin", 5).contains('~'),
        "the hook did not copy the delimiter: {:?}",
        db.get("admin", 5)
    );
    assert!(!db.calls().contains("sacctmgr -i modify"), "{}", db.calls());
}

#[test]
fn the_release_comes_from_sacctmgr() {
    let db = Db::new("release", "22.05", &[]);
    assert_eq!(db.acct().release().unwrap(), Release { major: 22, minor: 5 });
    assert_eq!(db.rules(), Rules { lowercases: true, trims: false });
}
