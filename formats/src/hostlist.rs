//! Slurm hostlist expressions: `n[01-04,07],login1` to the hosts it names.
//!
//! Slurm hands every job and step its nodes in this compressed form
//! (`SLURM_JOB_NODELIST`, `SLURM_STEP_NODELIST`); the rendezvous needs the
//! hosts themselves, and above all the first one. This module expands an
//! expression the way Slurm 22.05 does (`hostlist_create()` followed by
//! `hostlist_shift()`, which is what `scontrol show hostnames` prints): same
//! hosts, same order, duplicates kept. `tests/tests/hostlist_oracle.rs` checks
//! that against the real `scontrol`.
//!
//! # How Slurm reads an expression
//!
//! - Items are separated by commas, spaces and tabs (`a1,b[2-3] c` is four
//!   hosts). Runs of separators, and separators at either end, are ignored. A
//!   separator inside brackets belongs to the bracket (`n[1,3]` is one item).
//! - An item without brackets is one host, exactly as written (`n01` stays `n01`).
//! - A bracket holds comma-separated numbers and ranges `lo-hi`, expanded in the
//!   order written (`n[3,1-2,1]` is `n3 n1 n2 n1`). Every number is printed with at
//!   least as many digits as the text of its range's low end, padded with zeros:
//!   `n[01-10]` gives `n01`..`n10`, `n[1-010]` gives `n1`..`n10`, `n[098-100]` gives
//!   `n098 n099 n100`. One range may hold at most 65536 hosts (Slurm's `MAX_RANGE`).
//! - An item may hold several brackets (`r[1-2]n[1-2]`), but its **last** bracket
//!   must end the item: `n[1-2]x` and `n[1-2]-ib` are errors in Slurm. Text may sit
//!   between brackets (`a[1-2]-b[3]` gives `a1-b3 a2-b3`).
//! - Order with several brackets is Slurm's, which is not the obvious one: the last
//!   bracket varies fastest, and the others vary, slowest first, from right to
//!   left. With two brackets that is the usual `r1n1 r1n2 r2n1 r2n2`; with three,
//!   `a[1-2]b[3-4]c[5-6]` gives `a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 ...`.
//! - Numbers are read like C's `strtoul`, as Slurm does: `n[ 1]` and `n[+1]` give
//!   `n01` (the low end's text is two characters wide), and text after the low end
//!   of a range is ignored (`n[1a-2]` gives `n01 n02`; `n[1, 2]` gives `n1 n02`). An
//!   `x` anywhere in a range, a backwards range (`n[3-1]`), an empty range (`n[]`,
//!   `n[1,]`), a `-` too many (`n[-1]`, `n[1--2]`, `n[1-2-3]`) and letters (`n[a-b]`)
//!   are errors. `n[1-]` is `n1`.
//!
//! # Where this module differs from Slurm, on purpose
//!
//! Mostly input that Slurm accepts but that cannot be a real node list: here it is
//! an error, so that a typo never becomes a host name in a root process.
//!
//! - **An empty expression** (`""`, `" "`, `","`): Slurm expands it to no hosts;
//!   here it is an error, since [`first`] has no host to return.
//! - **Stray brackets**: Slurm turns an unclosed `[` into a host ending in `]`
//!   (`n[1-2` gives the host `n]`, and `[5` the host `5`) and keeps a `]` or `[`
//!   that is not part of a bracket in the host name (`n]`, `a]b[1-2]` gives
//!   `a]b1 a]b2`). Here an unclosed `[`, or any host that would contain `[` or `]`,
//!   makes the expression an error.
//! - **Control characters** (newline included; tab is a separator): Slurm keeps them
//!   in host names; here they are an error.
//! - **An invalid bracket left of the second-to-last one** (`a[3-1]b[1]c[2]`): Slurm
//!   logs an error, drops the hosts and carries on; here it is an error like any other
//!   invalid bracket.
//! - **Numbers above `u64::MAX`** in brackets: Slurm clamps them to
//!   18446744073709551615; here they are an error. A host without brackets is kept as
//!   written, where Slurm rewrites a too-long number at its end the same way.
//!   (A range of two or more hosts ending at `u64::MAX` crashes `scontrol`; here it
//!   expands normally.)
//! - **Size limits**: more than [`MAX_HOSTS`] hosts in all, or a host name longer than
//!   [`MAX_HOST_LEN`] bytes, is an error. Slurm limits only each range (65536) and
//!   each bracket in front of the last one (65536 hosts).

use std::fmt;
use std::fmt::Write as _;

/// The most hosts an expression may expand to; more is an error.
///
/// This is Slurm's own limit for one range (`MAX_RANGE` in `hostlist.c`,
/// 64K hosts) and for one bracket before the last (`MAX_PREFIX_CNT`), here
/// applied to the whole expression: no real job runs on more nodes, and it bounds
/// the memory a hostile expression can make us use.
pub const MAX_HOSTS: usize = 64 * 1024;

/// The longest host name, in bytes, an expression may produce; longer is an error.
/// (A DNS name has at most 253 characters.)
pub const MAX_HOST_LEN: usize = 255;

/// Slurm's `MAX_RANGE`: the most hosts one `lo-hi` range may hold.
const MAX_RANGE: u64 = 64 * 1024;

/// How much of a bad expression an error quotes.
const QUOTE_CHARS: usize = 200;

/// A hostlist expression that cannot be expanded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostlistError {
    /// The expression, cut to its first 200 characters, control characters escaped.
    pub input: String,
    /// What is wrong with it, in words.
    pub reason: String,
    /// What is wrong with it.
    pub kind: HostlistErrorKind,
}

/// What is wrong with a hostlist expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostlistErrorKind {
    /// It names no host.
    NoHost,
    /// It holds a control character other than tab.
    ControlChar,
    /// It names more than [`MAX_HOSTS`] hosts.
    TooManyHosts,
    /// A host name would be longer than [`MAX_HOST_LEN`] bytes.
    NameTooLong,
    /// A `[` without `]`, a `]` without `[`, or text after an item's last `]`.
    Brackets,
    /// A bracket holds something that is not a number or a range.
    BadRange,
    /// A number does not fit in 64 bits.
    NumberTooLarge,
    /// A range runs backwards (`5-1`).
    Backwards,
    /// A range holds more than Slurm's `MAX_RANGE` hosts.
    RangeTooLarge,
    /// A bug: a cut not on a character boundary.
    Internal,
}

/// What an item's parser found wrong: the kind and the words.
type Why = (HostlistErrorKind, String);

impl HostlistError {
    fn new(expr: &str, (kind, reason): Why) -> HostlistError {
        HostlistError { input: crate::text::clip(expr, QUOTE_CHARS), reason, kind }
    }
}

impl fmt::Display for HostlistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad hostlist '{}': {}", self.input, self.reason)
    }
}

impl std::error::Error for HostlistError {}

/// Every host of `expr`, in Slurm's order, duplicates kept.
///
/// # Errors
/// When Slurm rejects the expression, and in the cases listed in the
/// [module documentation](self) where Slurm accepts something that is not a node list.
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    let parsed = parse(expr)?;
    let mut hosts = Vec::with_capacity(parsed.total);
    for item in &parsed.items {
        item.push_hosts(&mut hosts);
    }
    Ok(hosts)
}

/// The first host of `expr`, without expanding the rest.
///
/// The whole expression is still checked: this fails exactly when [`expand`] does.
///
/// # Errors
/// As for [`expand`].
pub fn first(expr: &str) -> Result<String, HostlistError> {
    let parsed = parse(expr)?;
    match parsed.items.first() {
        Some(item) => Ok(item.first_host()),
        None => Err(HostlistError::new(expr, (HostlistErrorKind::NoHost, "it names no host".to_string()))),
    }
}

/// How many hosts `expr` names, duplicates included, without expanding it.
///
/// # Errors
/// As for [`expand`], which this fails exactly like.
pub fn count(expr: &str) -> Result<usize, HostlistError> {
    Ok(parse(expr)?.total)
}

/// One `lo-hi` range of a bracket (`lo == hi` for a single number), numbers printed
/// zero-padded to at least `width` digits.
#[derive(Debug)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    /// Hosts in the range; `lo <= hi` and `hi - lo < MAX_RANGE` hold by construction.
    fn count(&self) -> usize {
        usize::try_from(self.hi.saturating_sub(self.lo).saturating_add(1)).unwrap_or(usize::MAX)
    }

    /// Bytes of the longest number the range prints.
    fn max_len(&self) -> usize {
        self.width.max(decimal_digits(self.hi))
    }
}

/// One item of the expression: `lits[0] b[0] lits[1] b[1] ... b[k-1] lits[k]`.
/// An item without brackets has one literal and no brackets.
#[derive(Debug)]
struct Item<'a> {
    lits: Vec<&'a str>,
    brackets: Vec<Vec<Range>>,
    count: usize,
}

impl Item<'_> {
    fn first_host(&self) -> String {
        let values: Vec<(u64, usize)> =
            self.brackets.iter().map(|b| b.first().map_or((0, 0), |r| (r.lo, r.width))).collect();
        self.render(|b| values.get(b).copied())
    }

    /// Writes the host made of the literals and, for bracket `b`, the number `value(b)`.
    fn render(&self, value: impl Fn(usize) -> Option<(u64, usize)>) -> String {
        let mut host = String::new();
        for (i, lit) in self.lits.iter().enumerate() {
            host.push_str(lit);
            if let Some((v, width)) = value(i) {
                // Writing to a String cannot fail.
                let _ = write!(host, "{v:0width$}");
            }
        }
        host
    }

    /// Appends the item's hosts in Slurm's order: the last bracket varies fastest;
    /// the others vary, slowest first, from the second-to-last to the first.
    fn push_hosts(&self, hosts: &mut Vec<String>) {
        let k = self.brackets.len();
        let values: Vec<Vec<(u64, usize)>> = self
            .brackets
            .iter()
            .map(|b| b.iter().flat_map(|r| (r.lo..=r.hi).map(move |v| (v, r.width))).collect())
            .collect();
        // Bracket numbers from the slowest to the fastest.
        let mut order: Vec<usize> = (0..k.saturating_sub(1)).rev().collect();
        if k > 0 {
            order.push(k - 1);
        }
        let mut idx = vec![0usize; k];
        loop {
            hosts.push(self.render(|b| values.get(b)?.get(*idx.get(b)?).copied()));
            // Advance the odometer, fastest bracket first.
            let mut carried_out = true;
            for &b in order.iter().rev() {
                let (Some(i), Some(len)) = (idx.get_mut(b), values.get(b).map(Vec::len)) else {
                    return;
                };
                *i += 1;
                if *i < len {
                    carried_out = false;
                    break;
                }
                *i = 0;
            }
            if carried_out {
                return;
            }
        }
    }
}

#[derive(Debug)]
struct Parsed<'a> {
    items: Vec<Item<'a>>,
    total: usize,
}

/// Reads and checks the whole expression, counting its hosts but not writing them.
fn parse(expr: &str) -> Result<Parsed<'_>, HostlistError> {
    let err = |kind, reason: String| HostlistError::new(expr, (kind, reason));
    if let Some(c) = expr.chars().find(|&c| c.is_control() && c != '\t') {
        return Err(err(
            HostlistErrorKind::ControlChar,
            format!("control character {c:?} (hosts are separated by ',', ' ' or tab)"),
        ));
    }
    let mut items = Vec::new();
    let mut total: usize = 0;
    let mut tokens = Tokens::new(expr);
    while let Some((start, end)) = tokens.next_token() {
        let Some(token) = expr.get(start..end) else {
            return Err(err(
                HostlistErrorKind::Internal,
                "internal error: item not on a character boundary".to_string(),
            ));
        };
        let item = parse_item(token)
            .map_err(|(kind, reason)| err(kind, format!("in '{}': {reason}", quote(token))))?;
        total = total.saturating_add(item.count);
        if total > MAX_HOSTS {
            return Err(err(HostlistErrorKind::TooManyHosts, format!("more than {MAX_HOSTS} hosts")));
        }
        items.push(item);
    }
    if items.is_empty() {
        return Err(err(HostlistErrorKind::NoHost, "it names no host".to_string()));
    }
    Ok(Parsed { items, total })
}

/// A short form of `text` for error messages.
fn quote(text: &str) -> String {
    crate::text::clip(text, 60)
}

fn is_separator(b: u8) -> bool {
    matches!(b, b',' | b' ' | b'\t')
}

/// Splits an expression into items the way Slurm's tokenizer does: an item ends at
/// a separator, unless a `[` before that separator has its `]` after it, in which
/// case the item runs on past that `]`. The search for `]` starts where the current
/// bracket search starts, so a `]` before the `[` stops it (`a]b[1,2]` is the two
/// items `a]b[1` and `2]`, which are then refused for their stray brackets).
#[derive(Debug)]
struct Tokens<'a> {
    bytes: &'a [u8],
    pos: usize,
    open: NextByte,
    close: NextByte,
}

impl<'a> Tokens<'a> {
    fn new(expr: &'a str) -> Tokens<'a> {
        Tokens { bytes: expr.as_bytes(), pos: 0, open: NextByte::new(b'['), close: NextByte::new(b']') }
    }

    fn is_sep_at(&self, i: usize) -> bool {
        self.bytes.get(i).is_some_and(|&b| is_separator(b))
    }

    fn skip_to_separator(&self, mut i: usize) -> usize {
        while i < self.bytes.len() && !self.is_sep_at(i) {
            i += 1;
        }
        i
    }

    /// The byte range of the next item, or `None` at the end.
    fn next_token(&mut self) -> Option<(usize, usize)> {
        while self.is_sep_at(self.pos) {
            self.pos += 1;
        }
        if self.pos >= self.bytes.len() {
            return None;
        }
        let start = self.pos;
        let mut parse = start;
        let mut end = self.skip_to_separator(start);
        while let Some(open) = self.open.find(self.bytes, parse).filter(|&o| o <= end) {
            let Some(close) = self.close.find(self.bytes, parse).filter(|&c| c >= open) else { break };
            if close < end {
                parse = close + 1;
            } else {
                end = self.skip_to_separator(close);
            }
        }
        self.pos = end;
        Some((start, end))
    }
}

/// Finds the next occurrence of one byte at or after a position. Positions asked
/// for never go down while an expression is split, so the search resumes where it
/// stopped and splitting stays linear in the length of the expression.
#[derive(Debug)]
struct NextByte {
    byte: u8,
    /// `(from, found)`: the first occurrence at or after `from` is `found`.
    cache: Option<(usize, Option<usize>)>,
}

impl NextByte {
    fn new(byte: u8) -> NextByte {
        NextByte { byte, cache: None }
    }

    fn find(&mut self, bytes: &[u8], at: usize) -> Option<usize> {
        if let Some((from, found)) = self.cache {
            if from <= at {
                match found {
                    Some(f) if f >= at => return Some(f),
                    None => return None,
                    Some(_) => {}
                }
            }
        }
        let found =
            bytes.get(at..).and_then(|rest| rest.iter().position(|&b| b == self.byte)).map(|i| at + i);
        self.cache = Some((at, found));
        found
    }
}

/// Reads one item. Brackets are found as Slurm finds them: the item's last `[`
/// opens its last bracket, which the first `]` after it closes and which must end
/// the item; then, in the text before it, repeatedly, the last `[` and the last `]`
/// after it make a bracket, until no such pair is left.
fn parse_item(token: &str) -> Result<Item<'_>, Why> {
    let too_long =
        || (HostlistErrorKind::NameTooLong, format!("a host name would be longer than {MAX_HOST_LEN} bytes"));
    let Some(open) = token.rfind('[') else {
        check_literal(token)?;
        if token.len() > MAX_HOST_LEN {
            return Err(too_long());
        }
        return Ok(Item { lits: vec![token], brackets: Vec::new(), count: 1 });
    };
    let (Some(mut prefix), Some(rest)) = (token.get(..open), token.get(open + 1..)) else {
        return Err((
            HostlistErrorKind::Internal,
            "internal error: bracket not on a character boundary".to_string(),
        ));
    };
    let Some(close) = rest.find(']') else {
        return Err((HostlistErrorKind::Brackets, "'[' without ']'".to_string()));
    };
    let (Some(inner), Some(after)) = (rest.get(..close), rest.get(close + 1..)) else {
        return Err((
            HostlistErrorKind::Internal,
            "internal error: bracket not on a character boundary".to_string(),
        ));
    };
    if !after.is_empty() {
        return Err((
            HostlistErrorKind::Brackets,
            format!("text '{}' after the last ']' (a name must end with its last bracket)", quote(after)),
        ));
    }

    let mut lits_rev: Vec<&str> = vec![""];
    let mut brackets_rev: Vec<Vec<Range>> = Vec::new();
    let mut count: usize = 1;
    let mut len: usize = 0;
    let mut add_bracket = |text: &str, brackets_rev: &mut Vec<Vec<Range>>| -> Result<(), Why> {
        let (ranges, n, width) = parse_bracket(text)?;
        count = count.saturating_mul(n);
        if count > MAX_HOSTS {
            return Err((HostlistErrorKind::TooManyHosts, format!("more than {MAX_HOSTS} hosts")));
        }
        len = len.saturating_add(width);
        if len > MAX_HOST_LEN {
            return Err(too_long());
        }
        brackets_rev.push(ranges);
        Ok(())
    };
    add_bracket(inner, &mut brackets_rev)?;
    loop {
        let pair = prefix.rfind('[').and_then(|o| Some((o, o + prefix.get(o..)?.rfind(']')?)));
        let Some((o, c)) = pair else {
            lits_rev.push(prefix);
            break;
        };
        let (Some(left), Some(inner), Some(between)) =
            (prefix.get(..o), prefix.get(o + 1..c), prefix.get(c + 1..))
        else {
            return Err((
                HostlistErrorKind::Internal,
                "internal error: bracket not on a character boundary".to_string(),
            ));
        };
        lits_rev.push(between);
        if between.len() > MAX_HOST_LEN {
            return Err(too_long());
        }
        add_bracket(inner, &mut brackets_rev)?;
        prefix = left;
    }
    let lit_len: usize = lits_rev.iter().map(|l| l.len()).sum();
    if lit_len.saturating_add(len) > MAX_HOST_LEN {
        return Err(too_long());
    }
    for lit in &lits_rev {
        check_literal(lit)?;
    }
    lits_rev.reverse();
    brackets_rev.reverse();
    Ok(Item { lits: lits_rev, brackets: brackets_rev, count })
}

/// Refuses text outside brackets that holds a bracket character (Slurm would keep it
/// in the host name).
fn check_literal(text: &str) -> Result<(), Why> {
    if text.contains('[') {
        return Err((HostlistErrorKind::Brackets, "'[' without ']'".to_string()));
    }
    if text.contains(']') {
        return Err((HostlistErrorKind::Brackets, "']' without '['".to_string()));
    }
    Ok(())
}

/// Reads the inside of a bracket: comma-separated numbers and ranges. Returns the
/// ranges, their host count and the length of the longest number they print.
fn parse_bracket(text: &str) -> Result<(Vec<Range>, usize, usize), Why> {
    let mut ranges = Vec::new();
    let mut count: usize = 0;
    let mut width = 0;
    for piece in text.split(',') {
        let range = parse_range(piece)?;
        count = count.saturating_add(range.count());
        if count > MAX_HOSTS {
            return Err((HostlistErrorKind::TooManyHosts, format!("more than {MAX_HOSTS} hosts")));
        }
        width = width.max(range.max_len());
        ranges.push(range);
    }
    Ok((ranges, count, width))
}

/// Reads one range as Slurm does: `lo`, `lo-hi` or `lo-` (= `lo`), each number read
/// like C's `strtoul` (leading blanks and a sign allowed), the width being the
/// length of the text before the `-`.
fn parse_range(piece: &str) -> Result<Range, Why> {
    let bad = || {
        let text = if piece.is_empty() {
            "empty range (a bracket holds numbers and ranges like 1-4, separated by commas)".to_string()
        } else {
            format!("'{}' is not a number or a range like 1-4", quote(piece))
        };
        (HostlistErrorKind::BadRange, text)
    };
    if piece.contains('x') {
        return Err(bad());
    }
    let (lo_text, hi_text) = match piece.split_once('-') {
        Some((lo, hi)) => (lo, Some(hi)),
        None => (piece, None),
    };
    if hi_text.is_some_and(|h| h.starts_with('-')) {
        return Err(bad());
    }
    let too_large =
        || (HostlistErrorKind::NumberTooLarge, format!("number in '{}' is too large", quote(piece)));
    let (lo, lo_end) = match strtoul(lo_text.as_bytes()) {
        Num::Value(v, end) => (v, end),
        Num::NoDigits => return Err(bad()),
        Num::TooLarge => return Err(too_large()),
    };
    let hi = match hi_text.filter(|h| !h.is_empty()) {
        Some(h) => match strtoul(h.as_bytes()) {
            Num::Value(v, end) if end == h.len() => v,
            Num::TooLarge => return Err(too_large()),
            _ => return Err(bad()),
        },
        None if lo_end == lo_text.len() => lo,
        None => return Err(bad()),
    };
    if lo > hi {
        return Err((HostlistErrorKind::Backwards, format!("range '{}' runs backwards", quote(piece))));
    }
    if hi - lo >= MAX_RANGE {
        return Err((
            HostlistErrorKind::RangeTooLarge,
            format!("range '{}' holds more than {MAX_RANGE} hosts", quote(piece)),
        ));
    }
    Ok(Range { lo, hi, width: lo_text.len() })
}

enum Num {
    /// The value and the number of bytes read.
    Value(u64, usize),
    NoDigits,
    TooLarge,
}

/// C's `strtoul(text, &end, 10)`, except that a value above `u64::MAX` is refused
/// rather than clamped.
fn strtoul(text: &[u8]) -> Num {
    let mut i = 0;
    while text.get(i).is_some_and(|&b| b == b' ' || b == b'\t') {
        i += 1;
    }
    let negative = match text.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let digits_start = i;
    let mut value: u64 = 0;
    while let Some(&b) = text.get(i).filter(|b| b.is_ascii_digit()) {
        match value.checked_mul(10).and_then(|v| v.checked_add(u64::from(b - b'0'))) {
            Some(v) => value = v,
            None => return Num::TooLarge,
        }
        i += 1;
    }
    if i == digits_start {
        return Num::NoDigits;
    }
    Num::Value(if negative { value.wrapping_neg() } else { value }, i)
}

fn decimal_digits(mut n: u64) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::HostlistErrorKind as K;
    use super::*;

    fn ok(expr: &str) -> Vec<String> {
        match expand(expr) {
            Ok(h) => h,
            Err(e) => panic!("{expr:?}: {e}"),
        }
    }

    fn hosts(expr: &str) -> String {
        ok(expr).join(" ")
    }

    /// Expanding `expr` fails with an error of `kind`.
    #[track_caller]
    fn fails(expr: &str, kind: K) -> HostlistError {
        match expand(expr) {
            Ok(h) => panic!("{expr:?} expanded to {h:?}"),
            Err(e) => {
                assert_eq!(e.kind, kind, "{expr:?}: {e}");
                e
            }
        }
    }

    #[test]
    fn plain_range() {
        assert_eq!(hosts("n[1-3]"), "n1 n2 n3");
    }

    #[test]
    fn zero_padding_from_low_end() {
        assert_eq!(hosts("n[01-03]"), "n01 n02 n03");
        assert_eq!(ok("n[01-10]").last().map(String::as_str), Some("n10"));
        assert_eq!(hosts("n[098-100]"), "n098 n099 n100");
        assert_eq!(hosts("n[01-2]"), "n01 n02");
    }

    #[test]
    fn padding_of_high_end_is_ignored() {
        assert_eq!(hosts("n[1-010]"), "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10");
        assert_eq!(hosts("n[1-02]"), "n1 n2");
    }

    #[test]
    fn single_numbers_keep_their_padding() {
        assert_eq!(hosts("n[007]"), "n007");
        assert_eq!(hosts("n[00]"), "n00");
    }

    #[test]
    fn several_ranges_in_a_bracket() {
        assert_eq!(hosts("n[1-3,7,10-11]"), "n1 n2 n3 n7 n10 n11");
    }

    #[test]
    fn several_items() {
        assert_eq!(hosts("a1,b[2-3],c"), "a1 b2 b3 c");
    }

    #[test]
    fn prefix_with_digits() {
        assert_eq!(hosts("a1b[9-11]"), "a1b9 a1b10 a1b11");
        assert_eq!(hosts("rack2-n[1-2]"), "rack2-n1 rack2-n2");
    }

    #[test]
    fn text_after_last_bracket_is_an_error() {
        fails("n[1-2]x", K::Brackets);
        fails("n[1-2]-ib", K::Brackets);
        fails("[1-2]n", K::Brackets);
        fails("n[1-2]x,m", K::Brackets);
    }

    #[test]
    fn duplicates_kept() {
        assert_eq!(hosts("n[1,1]"), "n1 n1");
        assert_eq!(hosts("n1,n1"), "n1 n1");
        assert_eq!(hosts("n[1-3,2-4]"), "n1 n2 n3 n2 n3 n4");
    }

    #[test]
    fn two_brackets() {
        assert_eq!(hosts("r[1-2]n[1-2]"), "r1n1 r1n2 r2n1 r2n2");
        assert_eq!(hosts("n[1-2][3-4]"), "n13 n14 n23 n24");
        assert_eq!(hosts("a[1-2]-b[3]"), "a1-b3 a2-b3");
    }

    #[test]
    fn three_and_four_brackets_in_slurm_order() {
        assert_eq!(hosts("a[1-2]b[3-4]c[5-6]"), "a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 a1b4c6 a2b4c5 a2b4c6");
        assert_eq!(
            hosts("a[1-2]b[3-4]c[5-6]d[7-8]"),
            "a1b3c5d7 a1b3c5d8 a2b3c5d7 a2b3c5d8 a1b4c5d7 a1b4c5d8 a2b4c5d7 a2b4c5d8 \
             a1b3c6d7 a1b3c6d8 a2b3c6d7 a2b3c6d8 a1b4c6d7 a1b4c6d8 a2b4c6d7 a2b4c6d8"
        );
    }

    #[test]
    fn backwards_range_is_an_error() {
        fails("n[3-1]", K::Backwards);
    }

    #[test]
    fn unclosed_bracket_is_an_error() {
        // Slurm: the host "n]".
        fails("n[1-", K::Brackets);
        fails("n[1-2", K::Brackets);
        fails("x[5", K::Brackets);
        fails("[5", K::Brackets);
        fails("a[b[1-2]", K::Brackets);
    }

    #[test]
    fn stray_close_bracket_is_an_error() {
        // Slurm: the host "n1-2]", and "a]b1 a]b2".
        fails("n1-2]", K::Brackets);
        fails("a]b[1-2]", K::Brackets);
        fails("a[1-2],b]", K::Brackets);
        fails("a]b[1,2]", K::Brackets);
    }

    #[test]
    fn letters_in_bracket_are_an_error() {
        fails("n[a-b]", K::BadRange);
        fails("n[0x10]", K::BadRange);
        fails("n[1x-2]", K::BadRange);
        fails("n[１]", K::BadRange);
    }

    #[test]
    fn empty_ranges_are_errors() {
        fails("n[]", K::BadRange);
        fails("n[,1]", K::BadRange);
        fails("n[1,]", K::BadRange);
        fails("n[1,,2]", K::BadRange);
    }

    #[test]
    fn negative_and_doubled_dashes_are_errors() {
        fails("n[-1]", K::BadRange);
        fails("n[1--2]", K::BadRange);
        fails("n[1-2-3]", K::BadRange);
        fails("n[-]", K::BadRange);
        fails("n[+]", K::BadRange);
        fails("n[1- -2]", K::RangeTooLarge);
    }

    #[test]
    fn open_ended_range_is_its_low_end() {
        assert_eq!(hosts("n[1-]"), "n1");
    }

    #[test]
    fn strtoul_quirks_match_slurm() {
        assert_eq!(hosts("n[+1]"), "n01");
        assert_eq!(hosts("n[ 1]"), "n01");
        assert_eq!(hosts("n[1-+2]"), "n1 n2");
        assert_eq!(hosts("n[1- 2]"), "n1 n2");
        assert_eq!(hosts("n[1a-2]"), "n01 n02");
        assert_eq!(hosts("n[1 -2]"), "n01 n02");
        assert_eq!(hosts("n[1, 2]"), "n1 n02");
        fails("n[1 ,2]", K::BadRange);
    }

    #[test]
    fn empty_expression_is_an_error() {
        for e in ["", " ", ",", " , ", "\t"] {
            assert_eq!(fails(e, K::NoHost).reason, "it names no host", "{e:?}");
        }
    }

    #[test]
    fn separators_are_comma_space_tab() {
        assert_eq!(hosts("a,b c\td"), "a b c d");
        assert_eq!(hosts(" a  b ,,c, "), "a b c");
        assert_eq!(hosts("n[1-2] x"), "n1 n2 x");
        assert_eq!(hosts("n[1-2]\t,m"), "n1 n2 m");
    }

    #[test]
    fn control_characters_are_errors() {
        fails("a\nb", K::ControlChar);
        fails("a\rb", K::ControlChar);
        fails("a\0b", K::ControlChar);
        fails("n[1,\n2]", K::ControlChar);
    }

    #[test]
    fn single_hosts_are_kept_as_written() {
        assert_eq!(hosts("n01,n1,n9,n10"), "n01 n1 n9 n10");
        assert_eq!(hosts("n1-3"), "n1-3");
        assert_eq!(hosts("a=b,é[1-2]"), "a=b é1 é2");
        // Slurm prints n18446744073709551615 here.
        assert_eq!(hosts("n99999999999999999999"), "n99999999999999999999");
    }

    #[test]
    fn numbers_above_u64_are_errors() {
        fails("n[99999999999999999999]", K::NumberTooLarge);
        fails("n[1-99999999999999999999]", K::NumberTooLarge);
        assert_eq!(hosts("n[18446744073709551615]"), "n18446744073709551615");
        assert_eq!(
            hosts("n[18446744073709551614-18446744073709551615]"),
            "n18446744073709551614 n18446744073709551615"
        );
    }

    #[test]
    fn range_limit_is_slurms() {
        assert_eq!(count("n[1-65536]"), Ok(65536));
        assert!(fails("n[0-65536]", K::RangeTooLarge).reason.contains("more than 65536"));
        fails("n[0-18446744073709551615]", K::RangeTooLarge);
    }

    #[test]
    fn total_limit() {
        assert_eq!(count("n[1-65535],x"), Ok(MAX_HOSTS));
        fails("n[1-65536],x", K::TooManyHosts);
        fails("a[1-2]b[1-40000]", K::TooManyHosts);
        let many = "a,".repeat(MAX_HOSTS + 1);
        fails(&many, K::TooManyHosts);
    }

    #[test]
    fn host_length_limit() {
        let long = "a".repeat(MAX_HOST_LEN);
        assert_eq!(ok(&long), std::slice::from_ref(&long));
        fails(&format!("{long}b"), K::NameTooLong);
        fails(&format!("{}[1]", "a".repeat(MAX_HOST_LEN)), K::NameTooLong);
        fails(&format!("n[{}1]", "0".repeat(MAX_HOST_LEN)), K::NameTooLong);
        assert_eq!(count(&format!("{}[1-9]", "a".repeat(MAX_HOST_LEN - 1))), Ok(9));
        fails(&format!("{}[1-10]", "a".repeat(MAX_HOST_LEN - 1)), K::NameTooLong);
    }

    #[test]
    fn invalid_earlier_bracket_is_an_error() {
        // Slurm logs an error and expands to nothing.
        fails("a[3-1]b[1]c[2]", K::Backwards);
        fails("a[x]b[1-2]", K::BadRange);
        fails("a[1]]b[2]", K::BadRange);
    }

    #[test]
    fn brackets_across_separators() {
        assert_eq!(hosts("n[1-2],m[3]"), "n1 n2 m3");
        fails("n[1,2]m", K::Brackets);
        fails("n[1-2]]", K::Brackets);
    }

    #[test]
    fn first_and_count() {
        assert_eq!(first("r[2-3]n[05-06],x"), Ok("r2n05".to_string()));
        assert_eq!(count("r[2-3]n[05-06],x"), Ok(5));
        assert_eq!(first("n1"), Ok("n1".to_string()));
        assert_eq!(first("a[1-2]b[3-4]c[5-6]"), Ok("a1b3c5".to_string()));
        for e in ["", "n[3-1]", "n[1-2]x", "n[1-65536],x", "n[1-2"] {
            assert_eq!(first(e).err(), expand(e).err(), "{e:?}");
            assert_eq!(count(e).err(), expand(e).err(), "{e:?}");
        }
    }

    #[test]
    fn count_matches_expand() {
        for e in ["n[1-3,7,10-11]", "a1,b[2-3],c", "a[1-2]b[3-4]c[5-6]", "n[1,1]", "x"] {
            assert_eq!(count(e), Ok(ok(e).len()), "{e:?}");
            assert_eq!(first(e).ok().as_ref(), ok(e).first(), "{e:?}");
        }
    }

    #[test]
    fn error_display_and_truncation() {
        let e = fails("n[3-1]", K::Backwards);
        assert_eq!(e.to_string(), "bad hostlist 'n[3-1]': in 'n[3-1]': range '3-1' runs backwards");
        let e = fails(&format!("{}\n", "a".repeat(300)), K::ControlChar);
        assert_eq!(e.input, format!("{}...", "a".repeat(200)));
        let e = fails("a\nb", K::ControlChar);
        assert_eq!(e.input, "a\\nb");
    }

    /// Every odd shape of input, `n` bytes or so of it.
    fn odd_inputs(n: usize) -> Vec<String> {
        vec![
            "a".repeat(n),
            "a,".repeat(n / 2),
            "[".repeat(n),
            "]".repeat(n),
            "[]".repeat(n / 2),
            "a[1]".repeat(n / 4),
            format!("n[{}]", "1,".repeat(n / 2)),
            format!("n[{}1]", "0".repeat(n)),
            format!("{}{}", "[".repeat(n / 2), "]".repeat(n / 2)),
            format!("a]b[{}", ",".repeat(n)),
            "a[1-2],".repeat(n / 7),
        ]
    }

    fn parse_all(cases: &[String]) -> std::time::Duration {
        let start = std::time::Instant::now();
        for e in cases {
            let _ = expand(e);
            let _ = first(e);
            let _ = count(e);
        }
        start.elapsed()
    }

    /// Time grows linearly with the input: 4x the bytes take well under 16x the
    /// time (quadratic). A ratio measured in one run, not a wall-clock limit.
    #[test]
    fn huge_inputs_take_linear_time() {
        let (small, large) = (odd_inputs(1 << 16), odd_inputs(1 << 18));
        let _ = parse_all(&small); // warm up
        let ratio = |_: u32| parse_all(&large).as_secs_f64() / parse_all(&small).as_secs_f64().max(1e-6);
        // The best of three pairs, so one noisy moment does not decide.
        let best = (0..3).map(ratio).fold(f64::INFINITY, f64::min);
        assert!(best < 10.0, "4x the input took {best:.1}x the time");
        assert_eq!(count(&"n[1-2],".repeat(1000)), Ok(2000));
    }
}
