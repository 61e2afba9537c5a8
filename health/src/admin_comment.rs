//! A job's summaries in Slurm's accounting, as pure functions: which row of
//! `sacct` is the job's, the id that addresses that one row in `sacctmgr
//! modify job`, what `sacctmgr` and slurmdbd do to the text written, and
//! where this node's summary can go without harming anyone else's words.
//!
//! # The row and its id (Slurm 22.05 to 26.05, the same on each)
//!
//! The agent knows a job by its raw id (`SLURM_JOB_ID`). Slurm prints and
//! selects array tasks as `A_T` and heterogeneous components as `H+O`
//! (slurmdb_defs.c `slurmdb_get_job_id_str`); `JobIDRaw` is the raw id
//! (sacct/print.c). A plain id `N` in `sacct -j N` or `sacctmgr modify job
//! where jobid=N` selects `id_job = N || het_job_id = N || id_array_job = N`
//! (as_mysql_jobacct_process.c `_setup_job_cond_selected_steps`, which
//! `as_mysql_modify_job` uses too): the raw id of the array task that holds
//! the array's own id, or of a het job's leader, selects every task or
//! component. `A_T` selects `(id_array_job, id_array_task) = (A, T)` and
//! `H+O` selects `het_job_id = H && het_job_offset = O`: one row each. So
//! the row is found by `JobIDRaw` and written by its `JobID` ([`write_id`]).
//!
//! # What the written text becomes
//!
//! `sacctmgr modify job ... set AdminComment=TEXT` passes `TEXT` through
//! sacctmgr/common.c `strip_quotes` and slurmdbd puts it, unescaped, between
//! single quotes in SQL (as_mysql_job.c `as_mysql_modify_job`):
//!
//! - a leading `"` or `'` is taken as a quote: it is dropped and the text
//!   ends at the next one; every other `"` and `'` becomes a backtick;
//! - 22.05 (and before 23.02) lowercases it all (`make_lower`, for
//!   `AdminComment` and `SystemComment` alike); 23.02 on keep the case;
//! - 25.05 on drop leading and trailing white space (`isspace`);
//! - MariaDB reads `\` as an escape in a quoted string (`\n` a newline, `\x`
//!   an `x`, a last `\` an SQL error) unless the server runs with
//!   `NO_BACKSLASH_ESCAPES`, which the agent cannot see: a text with a `\`
//!   never round-trips for sure.
//!
//! Newlines, `|`, tabs and any other byte pass unchanged. [`Rules`] holds
//! this per release; [`Rules::mangles`] says why a text would not come back
//! as written.
//!
//! # Where the summary goes ([`plan`])
//!
//! The summaries are words `sgu1;...` ([`crate::usage`]), each written after
//! one space at the end of the text: the site's text is the text without
//! them ([`site_text`]), byte for byte. The agent writes the `AdminComment`
//! only when the site's text there comes back unchanged; else the
//! `SystemComment` (which sacctmgr can set on every release; slurmctld
//! fills it only for burst buffers) when it holds nothing but summaries;
//! else nothing, and the summary stays in the agent's log.
//!
//! # What `sacct -P` prints
//!
//! Each field as stored, the delimiter between fields (`|`, or the text of
//! `--delimiter=TEXT`, which applies with `-p` and `-P` alike), none after
//! a row's last field with `-P`, a newline after each row, no escaping
//! (print_fields.c `print_fields_str` and its siblings, sacct/options.c
//! `OPT_LONG_DELIMITER`, the same in 22.05, 24.11 and 26.05): a comment may
//! hold `|`, newlines, anything a user could make a comment echo. So each
//! read uses a delimiter of its own ([`new_token`]: random, never the same
//! twice, that no comment holds unless it was guessed), asks for
//! [`SACCT_FIELDS`], which frame each comment with the row's raw id as
//! well ([`sacct_args`]), and [`parse_rows`] splits at that delimiter only.

use slurm_formats::release::Release;

use crate::usage::{NodeUsage, TAG};

/// `sacct -o` for [`parse_rows`]: each comment framed by the row's raw id.
pub const SACCT_FIELDS: &str = "JobIDRaw,JobID,SystemComment,JobIDRaw,AdminComment,JobIDRaw";

/// A delimiter for one `sacct` call: `~`, 16 hex digits, `~` (sacct prints
/// it as it is; no id holds `~`, so it never runs into the ids beside it).
/// The digits hash the time and the process id with [`RandomState`]'s keys,
/// which std draws from the OS's random source: nobody else can guess them.
///
/// [`RandomState`]: std::collections::hash_map::RandomState
pub fn new_token() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.write_u32(std::process::id());
    format!("~{:016x}~", h.finish())
}

/// The arguments of `sacct` for job `job`'s rows (`N`, `A_T`, `H+O`),
/// each field followed by `token` ([`new_token`]), for [`parse_rows`].
pub fn sacct_args(job: &str, token: &str) -> Vec<String> {
    ["-j", job, "-X", "-n", "-P", &format!("--delimiter={token}"), "-o", SACCT_FIELDS]
        .map(str::to_owned)
        .to_vec()
}

/// What sacctmgr and slurmdbd do to a comment on one release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// sacctmgr lowercases the text (before 23.02).
    pub lowercases: bool,
    /// sacctmgr drops leading and trailing white space (25.05 on).
    pub trims: bool,
}

impl Rules {
    /// The rules of `release`; the strictest of all when it is not known.
    pub fn of(release: Option<Release>) -> Rules {
        match release {
            Some(r) => Rules {
                lowercases: r < Release { major: 23, minor: 2 },
                trims: r >= Release { major: 25, minor: 5 },
            },
            None => Rules { lowercases: true, trims: true },
        }
    }

    /// Why `text`, written as a comment, would not come back unchanged;
    /// `None` when it would.
    pub fn mangles(self, text: &str) -> Option<Mangle> {
        if text.contains(['"', '\'']) {
            return Some(Mangle::Quote);
        }
        if text.contains('\\') {
            return Some(Mangle::Backslash);
        }
        if text.contains('\0') {
            return Some(Mangle::Nul);
        }
        if self.lowercases && text.bytes().any(|b| b.is_ascii_uppercase()) {
            return Some(Mangle::UpperCase);
        }
        let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_whitespace() || b == 0x0b);
        if self.trims && (edge(text.bytes().next()) || edge(text.bytes().last())) {
            return Some(Mangle::EdgeSpace);
        }
        None
    }

    /// What the comment becomes when `text` is written (a model of
    /// `strip_quotes` and of MariaDB's default escapes, for tests).
    pub fn stored(self, text: &str) -> String {
        let mut s = text;
        let mut quote = None;
        if let Some(q) = s.chars().next().filter(|c| matches!(c, '"' | '\'')) {
            quote = Some(q);
            s = &s[1..];
        }
        if self.trims {
            s = s.trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
        }
        if let Some(end) = quote.and_then(|q| s.find(q)) {
            s = &s[..end];
        }
        if self.trims {
            s = s.trim_end_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
        }
        let mut out = String::with_capacity(s.len());
        let mut chars = s.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' | '\'' => out.push('`'),
                '\\' => match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('r') => out.push('\r'),
                    Some('0') => out.push('\0'),
                    Some(c @ ('%' | '_')) => {
                        out.push('\\');
                        out.push(c);
                    }
                    Some(c) => out.push(c),
                    None => {}
                },
                c if self.lowercases => out.push(c.to_ascii_lowercase()),
                c => out.push(c),
            }
        }
        out
    }
}

/// Why a text would not come back as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mangle {
    /// A `"` or `'`: sacctmgr turns it into a backtick (or ends the text there).
    Quote,
    /// A `\`: MariaDB reads it as an escape.
    Backslash,
    /// A NUL byte: no command line carries it.
    Nul,
    /// Upper case: this release's sacctmgr lowercases the text.
    UpperCase,
    /// White space first or last: this release's sacctmgr drops it.
    EdgeSpace,
}

impl Mangle {
    /// In words, for the log and `spank-gpu usage`.
    pub fn words(self) -> &'static str {
        match self {
            Mangle::Quote => "it holds a quote, which sacctmgr turns into a backtick",
            Mangle::Backslash => "it holds a backslash, which slurmdbd's database reads as an escape",
            Mangle::Nul => "it holds a NUL byte",
            Mangle::UpperCase => "it holds upper case, which this release's sacctmgr lowercases",
            Mangle::EdgeSpace => "it starts or ends with white space, which this release's sacctmgr drops",
        }
    }
}

/// One row of `sacct -X -P -o` [`SACCT_FIELDS`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// `JobIDRaw`.
    pub raw: u32,
    /// `JobID`: `N`, `A_T`, `A_[...]` (an array's pending tasks), `H+O`.
    pub job_id: String,
    /// `SystemComment`.
    pub system: String,
    /// `AdminComment`.
    pub admin: String,
}

/// Whether `id` is a `JobID` sacct may print for a row whose raw id is `raw`.
fn job_id_fits(raw: &str, id: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some((a, t)) = id.split_once('_') {
        let pending = t.strip_prefix('[').and_then(|t| t.strip_suffix(']')).is_some_and(|t| {
            !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'-' | b',' | b'%' | b':'))
        });
        return digits(a) && (digits(t) || pending);
    }
    if let Some((h, o)) = id.split_once('+') {
        return digits(h) && digits(o);
    }
    id == raw
}

/// Whether `s` is a raw id as sacct prints it.
fn is_raw(s: &str) -> bool {
    !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `token` can delimit fields: 8 bytes or more, no newline, and
/// first and last a byte that no id holds (so it never runs into one).
fn token_fits(token: &str) -> bool {
    let id_byte = |b: u8| b.is_ascii_digit() || b"_+[]-,%:".contains(&b);
    let (first, last) = (token.bytes().next(), token.bytes().last());
    token.len() >= 8
        && !token.contains('\n')
        && first.is_some_and(|b| !id_byte(b))
        && last.is_some_and(|b| !id_byte(b))
}

/// The rows in `sacct` [`sacct_args`] output with delimiter `token`: each
/// row is `RAW T JOBID T SYSTEM T RAW T ADMIN T RAW` and a newline (`T` the
/// token), where a comment may hold anything but the token. Split at the
/// token only, the output must frame exactly: the three raw ids of a row
/// equal, its `JobID` one sacct prints for that raw id, rows apart by one
/// newline. `Err` with what does not read: a comment that holds the token
/// shifts the framing, so it is refused, never read as other rows.
///
/// # Errors
/// `token` is not a delimiter, or the output is not rows of these fields
/// framed by it.
pub fn parse_rows(out: &str, token: &str) -> Result<Vec<Row>, String> {
    if !token_fits(token) {
        return Err(format!("{token:?} cannot delimit sacct's fields"));
    }
    if out.is_empty() {
        return Ok(Vec::new());
    }
    let bad = |why: &str| {
        format!(
            "sacct printed what is not rows framed by this call's delimiter ({why}): {:?}",
            out.chars().take(80).collect::<String>()
        )
    };
    let pieces: Vec<&str> = out.split(token).collect();
    if pieces.len() < 6 || (pieces.len() - 1) % 5 != 0 {
        return Err(bad("not 5 delimiters a row: a comment holds the delimiter, or the output is cut"));
    }
    let n = (pieces.len() - 1) / 5;
    // The raw id each row starts with, and the one each ends with: the
    // pieces between rows are `RAW\nRAW`, the last `RAW` and a newline.
    let mut starts = vec![pieces[0]];
    let mut ends = Vec::with_capacity(n);
    for k in 1..=n {
        let joint = pieces[5 * k];
        if k == n {
            ends.push(joint.strip_suffix('\n').unwrap_or(joint));
        } else {
            let (end, start) = joint.split_once('\n').ok_or_else(|| bad("rows not apart by a newline"))?;
            ends.push(end);
            starts.push(start);
        }
    }
    let mut rows = Vec::with_capacity(n);
    for (i, (start, end)) in starts.into_iter().zip(ends).enumerate() {
        let [id, system, mid, admin] = [1, 2, 3, 4].map(|f| pieces[5 * i + f]);
        if !is_raw(start) || mid != start || end != start {
            return Err(bad("a row's raw ids differ"));
        }
        if id.len() > 64 || !job_id_fits(start, id) {
            return Err(bad("a JobID that does not fit its raw id"));
        }
        rows.push(Row {
            raw: start.parse().map_err(|_| bad("a raw id out of range"))?,
            job_id: id.to_owned(),
            system: system.to_owned(),
            admin: admin.to_owned(),
        });
    }
    Ok(rows)
}

/// The id that addresses `row` alone in `sacctmgr modify job where
/// jobid=ID`: its `JobID` (`A_T`, `H+O`, or the raw id of a job that is
/// neither). `Err` for an array's record of pending tasks (`A_[...]`),
/// which no id selects alone.
///
/// # Errors
/// No id selects this row alone.
pub fn write_id(row: &Row) -> Result<String, String> {
    if row.job_id.contains('[') {
        return Err(format!(
            "job {} is the record of array {}'s pending tasks: no id selects it alone",
            row.raw, row.job_id
        ));
    }
    Ok(row.job_id.clone())
}

/// Whether a word is a summary the agent wrote: `sgu1;` and the grammar's
/// characters only (so 22.05's lowercasing is its only change), and it reads.
fn is_summary(word: &str) -> bool {
    word.strip_prefix(TAG).is_some_and(|r| r.starts_with(';'))
        && word.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b';' | b'=' | b':' | b'.' | b'-' | b'_' | b'/' | b'?')
        })
        && NodeUsage::parse_word(word).is_some()
}

/// The byte ranges of the summaries in `text`, each with its node, in order.
fn summaries(text: &str) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices().chain(std::iter::once((text.len(), ' '))) {
        match (c.is_ascii_whitespace(), start) {
            (true, Some(s)) => {
                let w = &text[s..i];
                if is_summary(w) {
                    let node = NodeUsage::parse_word(w).map(|u| u.node).unwrap_or_default();
                    out.push((s, i, node));
                }
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    out
}

/// `text` without the summaries `keep` rejects, each with the one space
/// written before it (or after it, for a summary at the start).
fn remove_summaries(text: &str, drop: impl Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for (s, e, node) in summaries(text) {
        if !drop(&node) {
            continue;
        }
        let (mut s, mut e) = (s, e);
        if s > from && text.as_bytes()[s - 1] == b' ' {
            s -= 1;
        } else if s == 0 && text.as_bytes().get(e) == Some(&b' ') {
            e += 1;
        }
        out.push_str(&text[from..s]);
        from = e;
    }
    out.push_str(&text[from..]);
    out
}

/// The site's text: `text` without any summary, byte for byte otherwise.
pub fn site_text(text: &str) -> String {
    remove_summaries(text, |_| true)
}

/// `text` with `node`'s summary replaced by `word`, written at the end after
/// one space: the site's text and the other nodes' summaries kept byte for
/// byte. Node names match whatever their case (22.05 lowercases them).
pub fn merge(text: &str, node: &str, word: &str) -> String {
    let mut out = remove_summaries(text, |n| n.eq_ignore_ascii_case(node));
    if !out.is_empty() {
        out.push(' ');
    }
    out.push_str(word);
    out
}

/// Which comment a summary goes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// `AdminComment`.
    Admin,
    /// `SystemComment`.
    System,
}

impl Field {
    /// The field's name in sacct and sacctmgr.
    pub fn name(self) -> &'static str {
        match self {
            Field::Admin => "AdminComment",
            Field::System => "SystemComment",
        }
    }

    /// The field's text in a row.
    pub fn of(self, row: &Row) -> &str {
        match self {
            Field::Admin => &row.admin,
            Field::System => &row.system,
        }
    }
}

/// What to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `field` set to `text`.
    Write {
        /// The comment.
        field: Field,
        /// Its new text.
        text: String,
        /// Why not the `AdminComment`, for the `SystemComment`.
        why: Option<Mangle>,
    },
    /// Nothing: the summary stays on the node, for this reason.
    Keep(String),
}

/// Where `node`'s summary `word` goes in `row`'s comments under `rules`:
/// the `AdminComment` when the site's text there comes back unchanged,
/// else the `SystemComment` when it holds nothing but summaries, else
/// nowhere.
pub fn plan(rules: Rules, row: &Row, node: &str, word: &str) -> Plan {
    let site = site_text(&row.admin);
    let Some(why) = rules.mangles(&site) else {
        return Plan::Write { field: Field::Admin, text: merge(&row.admin, node, word), why: None };
    };
    if site_text(&row.system).is_empty() {
        return Plan::Write { field: Field::System, text: merge(&row.system, node, word), why: Some(why) };
    }
    Plan::Keep(format!(
        "the AdminComment is the site's and sacctmgr would change it ({}), and the SystemComment holds other text",
        why.words()
    ))
}

/// Whether `back` (the row read after writing `plan`) holds `word` in the
/// field written (whatever the case: 22.05 lowercases it) with the site's
/// text that was written there unchanged.
pub fn landed(back: &Row, field: Field, written: &str, word: &str) -> bool {
    let now = field.of(back);
    crate::usage::holds(now, word) && site_text(now) == site_text(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    const R2205: Rules = Rules { lowercases: true, trims: false };
    const R2411: Rules = Rules { lowercases: false, trims: false };
    const R2605: Rules = Rules { lowercases: false, trims: true };

    fn rel(major: u32, minor: u32) -> Option<Release> {
        Some(Release { major, minor })
    }

    fn word(node: &str) -> String {
        format!("sgu1;node={node};t=10;from=1;to=31;idle=0;g=0:GPU-5f1c0a04-7d2e:95.0:99:40960:81559:0:3:1")
    }

    fn row(raw: u32, id: &str, system: &str, admin: &str) -> Row {
        Row { raw, job_id: id.into(), system: system.into(), admin: admin.into() }
    }

    /// A delimiter as [`new_token`] makes them.
    const T: &str = "~5f1c0a047d2e4b1a~";

    /// What `sacct` [`sacct_args`] prints for these rows with delimiter `T`
    /// (print_fields.c: fields as stored, `T` between, a newline after each).
    fn sacct(rows: &[Row]) -> String {
        rows.iter()
            .map(|r| format!("{0}{T}{1}{T}{2}{T}{0}{T}{3}{T}{0}\n", r.raw, r.job_id, r.system, r.admin))
            .collect()
    }

    #[test]
    fn the_rules_follow_each_releases_sacctmgr() {
        assert_eq!(Rules::of(rel(22, 5)), R2205);
        assert_eq!(Rules::of(rel(23, 2)), R2411);
        assert_eq!(Rules::of(rel(24, 11)), R2411);
        assert_eq!(Rules::of(rel(25, 5)), R2605);
        assert_eq!(Rules::of(rel(25, 11)), R2605);
        assert_eq!(Rules::of(rel(26, 5)), R2605);
        assert_eq!(Rules::of(None), Rules { lowercases: true, trims: true });
    }

    #[test]
    fn what_each_release_stores() {
        let site = "JS1:Abc \"q\" it's\\x a|b\nline 2 ";
        assert_eq!(R2205.stored(site), "js1:abc `q` it`sx a|b\nline 2 ");
        assert_eq!(R2411.stored(site), "JS1:Abc `q` it`sx a|b\nline 2 ");
        assert_eq!(R2605.stored(site), "JS1:Abc `q` it`sx a|b\nline 2");
        // A leading quote ends the text at the next one.
        assert_eq!(R2411.stored("'a b' c"), "a b");
        assert_eq!(R2411.stored("a\\nb\\\\c\\%"), "a\nb\\c\\%");
        // What mangles() lets through is stored as written, on every release.
        for rules in [R2205, R2411, R2605] {
            for text in ["js1:abc|x\nline two\ttab", "", "a  b", "x=1;y=2 \u{e9}t\u{e9}"] {
                assert_eq!(rules.mangles(text), None, "{text:?}");
                assert_eq!(rules.stored(text), text, "{rules:?} {text:?}");
            }
        }
    }

    #[test]
    fn each_release_refuses_what_it_would_change() {
        assert_eq!(R2411.mangles("a\"b"), Some(Mangle::Quote));
        assert_eq!(R2411.mangles("it's"), Some(Mangle::Quote));
        assert_eq!(R2411.mangles("a\\b"), Some(Mangle::Backslash));
        assert_eq!(R2205.mangles("JS1:x"), Some(Mangle::UpperCase));
        assert_eq!(R2411.mangles("JS1:x"), None);
        assert_eq!(R2411.mangles(" x\n"), None);
        assert_eq!(R2605.mangles(" x"), Some(Mangle::EdgeSpace));
        assert_eq!(R2605.mangles("x\n"), Some(Mangle::EdgeSpace));
        for (rules, text) in [(R2205, "JS1:x"), (R2411, "a'b"), (R2605, "x\n"), (R2411, "a\\b")] {
            assert!(rules.mangles(text).is_some());
            assert_ne!(rules.stored(text), text, "{rules:?} {text:?}");
        }
    }

    /// An array job 100 of two tasks: task 0 ran as job 101, task 1 in the
    /// array's own record (raw id 100). `sacct -j 100` selects both
    /// (`id_array_job = 100`); `sacct -j 101` only task 0.
    #[test]
    fn an_array_task_is_found_by_its_raw_id_and_written_as_a_t() {
        let out = sacct(&[row(101, "100_0", "", "x"), row(100, "100_1", "", "y")]);
        let rows = parse_rows(&out, T).unwrap();
        assert_eq!(rows.len(), 2);
        let mine = rows.iter().find(|r| r.raw == 100).unwrap();
        assert_eq!((mine.job_id.as_str(), mine.admin.as_str()), ("100_1", "y"));
        assert_eq!(write_id(mine).unwrap(), "100_1");
        assert_eq!(write_id(&rows[0]).unwrap(), "100_0");
        // The record of the array's pending tasks is selected by no id alone.
        let pending = parse_rows(&sacct(&[row(300, "300_[2-5%2]", "", "")]), T).unwrap();
        assert!(write_id(&pending[0]).unwrap_err().contains("pending tasks"));
    }

    /// A het job 200: component 0 raw 200, component 1 raw 201. `sacct -j
    /// 200` selects both (`het_job_id = 200`).
    #[test]
    fn a_het_component_is_found_by_its_raw_id_and_written_as_h_o() {
        let rows = parse_rows(&sacct(&[row(200, "200+0", "", ""), row(201, "200+1", "", "z")]), T).unwrap();
        assert_eq!(write_id(&rows[0]).unwrap(), "200+0");
        assert_eq!(write_id(&rows[1]).unwrap(), "200+1");
        assert_eq!(rows[1].admin, "z");
        let plain = parse_rows(&sacct(&[row(7, "7", "", "")]), T).unwrap();
        assert_eq!(write_id(&plain[0]).unwrap(), "7");
    }

    #[test]
    fn comments_with_pipes_and_newlines_read_whole() {
        let tricky = [
            row(5, "5", "bb: setup|x", "site|text\n101|100_0|not a row\nline|5\n"),
            row(6, "6", "", "a|6\nb|6|c\n"),
            row(7, "7", "", "\n\n"),
            row(8, "8", "", ""),
        ];
        let rows = parse_rows(&sacct(&tricky), T).unwrap();
        assert_eq!(rows, tricky);
        // Without sacct's last newline too.
        let out = sacct(&tricky[..1]);
        assert_eq!(parse_rows(out.strip_suffix('\n').unwrap(), T).unwrap()[0], tricky[0]);
        let bad = [
            "garbage\n".to_owned(),
            format!("5{T}5{T}x\n"),
            format!("5{T}6{T}a{T}5{T}b{T}5\n"),
            format!("x{T}5{T}{T}x{T}{T}x\n"),
            format!("5{T}5{T}{T}6{T}{T}5\n"),
            format!("5{T}5{T}{T}5{T}{T}5\n6{T}6{T}{T}6{T}{T}6\nx"),
            format!("5{T}5{T}{T}5{T}{T}5 6{T}6{T}{T}6{T}{T}6\n"),
            // sacct's default `|`: a call without the delimiter.
            "5|5||5||5\n".to_owned(),
        ];
        for out in &bad {
            assert!(parse_rows(out, T).is_err(), "{out:?}");
        }
        assert_eq!(parse_rows("", T).unwrap(), vec![]);
        // A token that could run into an id, or too short to be unguessable.
        for token in ["12345678abcdef12", "|", "~abc~", "~0123456789\n~"] {
            assert!(parse_rows(&sacct(&tricky), token).is_err(), "{token:?}");
        }
    }

    /// `|RAW|` and `|RAW` and a newline before another row's head are what
    /// ended a comment in the `|` framing: in a comment they are text now.
    /// A site's text, or a burst buffer's error echoing a user's `#BB`
    /// lines, cannot make another row or move text between comments.
    #[test]
    fn the_old_framing_in_a_comment_is_text() {
        let forged = [
            row(
                100,
                "100",
                "bb: failed: #BB x|100|sgu1;node=evil|100\n101|101|y",
                "site|100|z|100\n100|100|a|100|b|100",
            ),
            row(101, "101", "|101|", "|101\n"),
        ];
        assert_eq!(parse_rows(&sacct(&forged), T).unwrap(), forged);
    }

    /// A comment that holds this call's delimiter (only a guess makes one)
    /// is refused, never split into other fields or rows.
    #[test]
    fn a_comment_holding_the_delimiter_is_refused() {
        for text in [format!("a{T}b"), T.to_owned(), format!("x{T}100{T}{T}100{T}y{T}100\n100{T}100{T}")] {
            for r in [row(100, "100", &text, "site"), row(100, "100", "", &text)] {
                let e = parse_rows(&sacct(std::slice::from_ref(&r)), T).unwrap_err();
                assert!(e.contains("not rows framed"), "{e}");
            }
        }
    }

    #[test]
    fn each_call_gets_its_own_delimiter() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(token_fits(&a) && a.len() == 18, "{a}");
        let args = sacct_args("62_3", &a);
        assert_eq!(args.join(" "), format!("-j 62_3 -X -n -P --delimiter={a} -o {SACCT_FIELDS}"));
        let row = row(65, "62_3", "", "x");
        let out = format!("65{a}62_3{a}{a}65{a}x{a}65\n");
        assert_eq!(parse_rows(&out, &a).unwrap(), vec![row]);
        assert!(parse_rows(&out, &b).is_err());
    }

    #[test]
    fn the_site_text_is_kept_byte_for_byte() {
        let site = "JS1:abc  two spaces\n\tnext line|x ";
        let a = merge(site, "gpu07", &word("gpu07"));
        assert_eq!(a, format!("{site} {}", word("gpu07")));
        let b = merge(&a, "gpu08", &word("gpu08"));
        assert_eq!(site_text(&b), site);
        // Replacing a node's summary moves it last, the rest untouched.
        let mut w7 = word("gpu07");
        w7.push_str(";x=1");
        let c = merge(&b, "gpu07", &w7);
        assert_eq!(c, format!("{site} {} {w7}", word("gpu08")));
        assert_eq!(site_text(&c), site);
        // Another writer appended after the summaries: its words stay.
        let d = merge(&format!("{b} later words"), "gpu07", &w7);
        assert_eq!(site_text(&d), format!("{site} later words"));
        assert_eq!(merge("", "gpu07", &word("gpu07")), word("gpu07"));
        // 22.05 lowercased the node's name: still the same node's summary.
        let low = merge(&word("gpu07").to_ascii_lowercase(), "GPU07", &word("GPU07"));
        assert_eq!(low, word("GPU07"));
        // A word that only looks like a summary is the site's.
        let fake = "sgu1;node=a'b;t=1 sgu1;node=x;g=bad";
        assert_eq!(site_text(&merge(fake, "a'b", &word("n"))), fake);
    }

    #[test]
    fn the_summary_goes_where_nothing_is_harmed() {
        let w = word("gpu07");
        // Clean site text: the AdminComment, on every release.
        for rules in [R2205, R2411, R2605] {
            let p = plan(rules, &row(5, "5", "", "js1:abc"), "gpu07", &w);
            assert_eq!(p, Plan::Write { field: Field::Admin, text: format!("js1:abc {w}"), why: None });
        }
        // Upper case: 24.11 and 26.05 write it; 22.05 takes the SystemComment.
        let upper = row(5, "5", "", "JS1:ABC");
        assert!(matches!(plan(R2411, &upper, "gpu07", &w), Plan::Write { field: Field::Admin, .. }));
        assert_eq!(
            plan(R2205, &upper, "gpu07", &w),
            Plan::Write { field: Field::System, text: w.clone(), why: Some(Mangle::UpperCase) }
        );
        // A quote or a backslash: no release writes the AdminComment.
        for rules in [R2205, R2411, R2605] {
            for site in ["say \"hi\"", "C:\\x"] {
                let p = plan(rules, &row(5, "5", &word("gpu08"), site), "gpu07", &w);
                assert_eq!(
                    p,
                    Plan::Write {
                        field: Field::System,
                        text: format!("{} {w}", word("gpu08")),
                        why: rules.mangles(site)
                    }
                );
            }
        }
        // The SystemComment holds a burst buffer's words: nowhere.
        let Plan::Keep(why) = plan(R2411, &row(5, "5", "bb setup: ok", "it's"), "gpu07", &w) else {
            panic!("written")
        };
        assert!(why.contains("quote"), "{why}");
        // The site's own summaries-only AdminComment (an earlier agent's) is fine.
        assert!(matches!(
            plan(R2205, &row(5, "5", "", &word("GPU08")), "gpu07", &w),
            Plan::Write { field: Field::Admin, .. }
        ));
    }

    #[test]
    fn landed_needs_the_word_and_the_site_text() {
        let w = word("gpu07");
        let written = format!("js1:a {w}");
        assert!(landed(&row(5, "5", "", &written), Field::Admin, &written, &w));
        assert!(landed(&row(5, "5", "", &written.to_ascii_lowercase()), Field::Admin, &written, &w));
        // Another writer replaced it, or changed the site's part.
        assert!(!landed(&row(5, "5", "", "js1:b"), Field::Admin, &written, &w));
        assert!(!landed(&row(5, "5", "", &format!("js1:b {w}")), Field::Admin, &written, &w));
        assert!(landed(&row(5, "5", &w, "x"), Field::System, &w, &w));
    }
}
