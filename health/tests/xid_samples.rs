//! Every real Xid log line in `fixtures/xid-log-samples.jsonl` parses to the
//! values its `expect` object gives (see `fixtures/SOURCES.md`).
//!
//! The crate has no dependencies, so the JSON lines are read by the small
//! parser at the bottom of this file.

// A test binary: a failed lookup in the fixture should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpu_health::xid::{Event, Scanner, XidRecord, parse_line};

const SAMPLES: &str = include_str!("fixtures/xid-log-samples.jsonl");

struct Sample {
    id: String,
    raw: String,
    xid: Option<u32>,
    pci: Option<String>,
    pid: Option<String>,
    name: Option<String>,
}

fn samples() -> Vec<Sample> {
    SAMPLES
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v = Json::parse(line).unwrap_or_else(|e| panic!("bad JSON line {line:?}: {e}"));
            let expect = v.get("expect").expect("expect");
            Sample {
                id: match v.get("id") {
                    Some(Json::Num(n)) => n.clone(),
                    other => panic!("id: {other:?}"),
                },
                raw: v.get("raw").and_then(Json::as_str).expect("raw").to_owned(),
                xid: match expect.get("xid") {
                    Some(Json::Null) => None,
                    Some(Json::Num(n)) => Some(n.parse().expect("xid number")),
                    other => panic!("xid: {other:?}"),
                },
                pci: expect.opt_str("pci"),
                pid: expect.opt_str("pid"),
                name: expect.opt_str("name"),
            }
        })
        .collect()
}

/// The record a sample's `expect` asks for, in `XidRecord`'s terms: a pid
/// that is not a number (`'<unknown>'`) is no pid; the name is kept as written.
fn check(s: &Sample, r: &XidRecord) {
    let id = &s.id;
    assert_eq!(Some(r.xid), s.xid, "sample {id}: xid");
    assert_eq!(Some(r.pci_bus_id.to_string()), s.pci, "sample {id}: pci");
    assert_eq!(r.process, s.name, "sample {id}: name");
    match &s.pid {
        None => {
            assert_eq!(r.pid, None, "sample {id}: pid");
            assert!(!s.raw.contains("pid="), "sample {id}: expects no pid but the line has one");
        }
        Some(text) if text.bytes().all(|b| b.is_ascii_digit()) => {
            assert_eq!(r.pid, Some(text.parse().expect("pid")), "sample {id}: pid")
        }
        Some(text) => {
            assert_eq!(text, "'<unknown>'", "sample {id}: a pid form this test does not know");
            assert!(s.raw.contains(&format!("pid={text}")), "sample {id}: pid text");
            assert_eq!(r.pid, None, "sample {id}: pid");
        }
    }
}

#[test]
fn every_sample_parses_as_expected() {
    let samples = samples();
    let mut checked = 0;
    for s in &samples {
        match (s.xid, parse_line(&s.raw)) {
            (None, None) => {}
            (None, Some(r)) => panic!("sample {}: not an Xid, but parsed as {r:?}", s.id),
            (Some(_), None) => panic!("sample {}: no Xid found in {:?}", s.id, s.raw),
            (Some(_), Some(r)) => check(s, &r),
        }
        checked += 1;
    }
    let lines = SAMPLES.lines().filter(|l| !l.trim().is_empty()).count();
    assert_eq!(checked, lines);
    assert_eq!(lines, SAMPLES.matches('\n').count(), "a blank line in the fixture");
    assert!(checked >= 21, "the fixture shrank: {checked} lines");
    assert!(samples.iter().filter(|s| s.xid.is_some()).count() >= 17);
}

/// The same Xid text reached through `/dev/kmsg` and `dmesg` gives the same
/// fields, with the kernel's time.
#[test]
fn every_xid_sample_parses_as_kmsg_and_dmesg_too() {
    let mut checked = 0;
    for s in samples().iter().filter(|s| s.xid.is_some()) {
        let at = s.raw.find("NVRM: ").unwrap_or_else(|| panic!("sample {}: no NVRM", s.id));
        let message = &s.raw[at..];
        let kmsg = parse_line(&format!("4,812,74889644138,-;{message}")).expect("kmsg form");
        check(s, &kmsg);
        assert_eq!(kmsg.monotonic_us, Some(74_889_644_138));
        assert_eq!(kmsg.time.as_deref(), Some("74889.644138"));
        let dmesg = parse_line(&format!("[74889.644138] {message}")).expect("dmesg form");
        check(s, &dmesg);
        assert_eq!(dmesg.monotonic_us, Some(74_889_644_138));
        assert_eq!((&kmsg.message, kmsg.xid), (&dmesg.message, dmesg.xid));
        checked += 1;
    }
    assert!(checked >= 17);
}

/// The whole fixture read as one log by a `Scanner` gives exactly the Xids
/// `parse_line` finds, in order, and no lost GPU (no sample is one).
#[test]
fn a_scanner_over_the_samples_finds_the_same_xids() {
    let mut scanner = Scanner::new();
    let events: Vec<Event> = samples().iter().flat_map(|s| scanner.push(&s.raw)).collect();
    let xids: Vec<u32> = events
        .iter()
        .map(|e| match e {
            Event::Xid(r) => r.xid,
            Event::Lost(l) => panic!("a lost GPU in the samples: {l:?}"),
        })
        .collect();
    let want: Vec<u32> = samples().iter().filter_map(|s| s.xid).collect();
    assert_eq!(xids, want);
}

// --- a minimal JSON reader, enough for the fixture ------------------------

#[derive(Debug)]
enum Json {
    Null,
    Bool(#[allow(dead_code)] bool),
    /// The number's text.
    Num(String),
    Str(String),
    Arr(#[allow(dead_code)] Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn parse(text: &str) -> Result<Json, String> {
        let mut p = Reader { s: text.as_bytes(), i: 0 };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing text at {}", p.i));
        }
        Ok(v)
    }

    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A field that must be a string or null.
    fn opt_str(&self, key: &str) -> Option<String> {
        match self.get(key) {
            Some(Json::Null) => None,
            Some(Json::Str(s)) => Some(s.clone()),
            other => panic!("{key}: {other:?}"),
        }
    }
}

struct Reader<'a> {
    s: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at {}", c as char, self.i))
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.peek() {
            Some(b'{') => {
                self.i += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(fields));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.expect(b':')?;
                    fields.push((key, self.value()?));
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Obj(fields));
                        }
                        _ => return Err(format!("bad object at {}", self.i)),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return Err(format!("bad array at {}", self.i)),
                    }
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b'n') => self.word("null", Json::Null),
            Some(b't') => self.word("true", Json::Bool(true)),
            Some(b'f') => self.word("false", Json::Bool(false)),
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let start = self.i;
                while self.peek().is_some_and(|c| c.is_ascii_digit() || b"+-.eE".contains(&c)) {
                    self.i += 1;
                }
                Ok(Json::Num(String::from_utf8_lossy(&self.s[start..self.i]).into_owned()))
            }
            _ => Err(format!("unexpected input at {}", self.i)),
        }
    }

    fn word(&mut self, w: &str, v: Json) -> Result<Json, String> {
        if self.s[self.i..].starts_with(w.as_bytes()) {
            self.i += w.len();
            Ok(v)
        } else {
            Err(format!("bad literal at {}", self.i))
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let h = self.s.get(self.i..self.i + 4).ok_or("short \\u escape")?;
        self.i += 4;
        u32::from_str_radix(std::str::from_utf8(h).map_err(|e| e.to_string())?, 16).map_err(|e| e.to_string())
    }

    fn string(&mut self) -> Result<String, String> {
        if self.peek() != Some(b'"') {
            return Err(format!("expected a string at {}", self.i));
        }
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let c = self.peek().ok_or("unterminated string")?;
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).map_err(|e| e.to_string()),
                b'\\' => {
                    let e = self.peek().ok_or("unterminated escape")?;
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xd800..0xdc00).contains(&hi) {
                                if !self.s[self.i..].starts_with(b"\\u") {
                                    return Err("lone surrogate".into());
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                0x10000 + ((hi - 0xd800) << 10) + (lo.wrapping_sub(0xdc00) & 0x3ff)
                            } else {
                                hi
                            };
                            char::from_u32(code).ok_or("bad \\u escape")?
                        }
                        _ => return Err(format!("bad escape at {}", self.i)),
                    };
                    let mut buf = [0; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                _ => out.push(c),
            }
        }
    }
}

#[test]
fn json_reader_handles_escapes() {
    let v = Json::parse(r#"{"a": "x\"\u2026\ud83d\ude00", "b": [1, -2.5e3, null, true], "c": {}}"#).unwrap();
    assert_eq!(v.get("a").and_then(Json::as_str), Some("x\"\u{2026}\u{1f600}"));
    assert!(matches!(v.get("b"), Some(Json::Arr(items)) if items.len() == 4));
}
