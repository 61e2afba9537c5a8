//! The tokenizer of [`super::shell`]: words (quotes removed, expansions
//! as parts), operators and newlines; heredoc bodies skipped and recorded.
//! Linear, no recursion, never panics.

use super::word::{Part, Word};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Tok {
    Word(Word, usize),
    Op(&'static str, usize),
    Newline(usize),
}

const OPS: &[&str] = &[
    "&>>", "<<<", "<<-", ";;&", "&&", "||", ";;", ";&", "|&", "<<", ">>", ">&", "<&", "&>", ">|", "<>", ";",
    "&", "|", "(", ")", "<", ">",
];

pub(super) fn is_redirect(op: &str) -> bool {
    matches!(op, "&>>" | "<<<" | "<<-" | "<<" | ">>" | ">&" | "<&" | "&>" | ">|" | "<>" | "<" | ">")
}

pub(super) fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

pub(super) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The tokenizer: a cursor over the script's characters.
pub(super) struct Lexer {
    pub(super) toks: Vec<Tok>,
    pub(super) bodies: Vec<(usize, usize)>,
    chars: Vec<char>,
    pos: usize,
    line: usize,
    heredocs: Vec<(String, bool)>,
}

impl Lexer {
    fn peek(&self, k: usize) -> Option<char> {
        self.chars.get(self.pos + k).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.get(self.pos).copied()?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    /// Reads up to the `close` that matches an already consumed `open`,
    /// skipping quoted text; returns what was read (with the closer).
    fn balanced(&mut self, open: char, close: char) -> String {
        let mut depth = 1usize;
        let mut out = String::new();
        while let Some(c) = self.bump() {
            out.push(c);
            match c {
                '\\' => {
                    if let Some(n) = self.bump() {
                        out.push(n);
                    }
                }
                '\'' => {
                    while let Some(n) = self.bump() {
                        out.push(n);
                        if n == '\'' {
                            break;
                        }
                    }
                }
                '"' => {
                    while let Some(n) = self.bump() {
                        out.push(n);
                        if n == '\\' {
                            if let Some(m) = self.bump() {
                                out.push(m);
                            }
                        } else if n == '"' {
                            break;
                        }
                    }
                }
                c if c == open => depth += 1,
                c if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// After a `$` that was consumed: the expansion as a part.
    fn dollar(&mut self) -> Part {
        match self.peek(0) {
            Some('{') => {
                self.bump();
                let body = self.balanced('{', '}');
                let inner = body.strip_suffix('}').unwrap_or(&body);
                let raw = format!("${{{body}");
                let name_len = inner.chars().take_while(|c| is_name_char(*c)).count();
                let (name, rest) =
                    inner.split_at(inner.char_indices().nth(name_len).map_or(inner.len(), |(i, _)| i));
                let simple_default =
                    |d: &str| (!d.contains(['$', '`', '"', '\'', '\\', '}'])).then(|| d.to_owned());
                if !name.is_empty() && name.starts_with(is_name_start) {
                    if rest.is_empty() {
                        return Part::Var { name: name.to_owned(), default: None, raw };
                    }
                    if let Some(d) = rest.strip_prefix(":-").or_else(|| rest.strip_prefix('-')) {
                        if let Some(d) = simple_default(d) {
                            return Part::Var { name: name.to_owned(), default: Some(d), raw };
                        }
                    }
                }
                Part::Unknown(raw)
            }
            Some('(') => {
                self.bump();
                if self.peek(0) == Some('(') {
                    self.bump();
                    let body = self.balanced('(', ')');
                    // The second closing paren of `$(( ))`.
                    let tail = if self.peek(0) == Some(')') {
                        self.bump().map(String::from).unwrap_or_default()
                    } else {
                        String::new()
                    };
                    return Part::Unknown(format!("$(({body}{tail}"));
                }
                let body = self.balanced('(', ')');
                Part::Unknown(format!("$({body}"))
            }
            Some(c) if is_name_start(c) => {
                let mut name = String::new();
                while let Some(c) = self.peek(0).filter(|c| is_name_char(*c)) {
                    name.push(c);
                    self.bump();
                }
                let raw = format!("${name}");
                Part::Var { name, default: None, raw }
            }
            Some(c) if c.is_ascii_digit() || "@*#?$!-".contains(c) => {
                self.bump();
                Part::Unknown(format!("${c}"))
            }
            _ => Part::Lit("$".to_owned()),
        }
    }

    fn backquote(&mut self) -> Part {
        let mut raw = String::from("`");
        while let Some(c) = self.bump() {
            raw.push(c);
            if c == '\\' {
                if let Some(n) = self.bump() {
                    raw.push(n);
                }
            } else if c == '`' {
                break;
            }
        }
        Part::Unknown(raw)
    }

    /// Reads one word starting at the cursor (not at whitespace or an operator).
    fn word(&mut self) -> Word {
        let mut w = Word::default();
        while let Some(c) = self.peek(0) {
            match c {
                ' ' | '\t' | '\n' | ';' | '&' | '|' | '(' | ')' | '<' | '>' => {
                    // `a=(1 2)` and `x(`: a paren inside a word is kept as text.
                    if c == '(' && w.raw().ends_with('=') {
                        self.bump();
                        let body = self.balanced('(', ')');
                        w.parts.push(Part::Unknown(format!("({body}")));
                        continue;
                    }
                    break;
                }
                '\\' => {
                    self.bump();
                    match self.bump() {
                        Some('\n') | None => {}
                        Some(n) => w.push_lit(n),
                    }
                }
                '\'' => {
                    self.bump();
                    w.quoted = true;
                    if w.parts.is_empty() {
                        w.parts.push(Part::Lit(String::new()));
                    }
                    while let Some(n) = self.bump() {
                        if n == '\'' {
                            break;
                        }
                        w.push_lit(n);
                    }
                }
                '"' => {
                    self.bump();
                    w.quoted = true;
                    if w.parts.is_empty() {
                        w.parts.push(Part::Lit(String::new()));
                    }
                    while let Some(n) = self.bump() {
                        match n {
                            '"' => break,
                            '\\' => match self.peek(0) {
                                Some(m @ ('$' | '`' | '"' | '\\')) => {
                                    self.bump();
                                    w.push_lit(m);
                                }
                                Some('\n') => {
                                    self.bump();
                                }
                                _ => w.push_lit('\\'),
                            },
                            '$' => {
                                let p = self.dollar();
                                w.parts.push(p);
                            }
                            '`' => {
                                let p = self.backquote();
                                w.parts.push(p);
                            }
                            _ => w.push_lit(n),
                        }
                    }
                }
                '$' => {
                    self.bump();
                    let p = self.dollar();
                    w.parts.push(p);
                }
                '`' => {
                    self.bump();
                    let p = self.backquote();
                    w.parts.push(p);
                }
                _ => {
                    self.bump();
                    w.push_lit(c);
                }
            }
        }
        w
    }

    /// After a newline token: skips the bodies of the heredocs opened on that line.
    fn skip_heredocs(&mut self) {
        for (delim, strip_tabs) in std::mem::take(&mut self.heredocs) {
            let first = self.line;
            loop {
                let start = self.pos;
                if start >= self.chars.len() {
                    self.bodies.push((first, self.line));
                    return;
                }
                while let Some(c) = self.peek(0) {
                    if c == '\n' {
                        break;
                    }
                    self.pos += 1;
                }
                let text: String = self.chars[start..self.pos].iter().collect();
                self.bump();
                let text = if strip_tabs { text.trim_start_matches('\t') } else { text.as_str() };
                if text == delim {
                    self.bodies.push((first, self.line - 1));
                    break;
                }
            }
        }
    }

    /// A lexer over `text`.
    pub(super) fn new(text: &str) -> Lexer {
        Lexer {
            chars: text.chars().collect(),
            pos: 0,
            line: 1,
            toks: Vec::new(),
            heredocs: Vec::new(),
            bodies: Vec::new(),
        }
    }

    /// Reads everything.
    pub(super) fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            let line = self.line;
            match c {
                ' ' | '\t' | '\r' => {
                    self.bump();
                }
                '\n' => {
                    self.bump();
                    self.toks.push(Tok::Newline(line));
                    self.skip_heredocs();
                }
                '#' => {
                    while self.peek(0).is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                }
                '\\' if self.peek(1) == Some('\n') => {
                    self.bump();
                    self.bump();
                }
                '(' if self.peek(1) == Some('(') => {
                    // An arithmetic command: `(( i++ ))`, `for ((;;))`.
                    self.bump();
                    self.bump();
                    let body = self.balanced('(', ')');
                    if self.peek(0) == Some(')') {
                        self.bump();
                    }
                    self.toks.push(Tok::Word(
                        Word { parts: vec![Part::Unknown(format!("(({body})"))], quoted: false },
                        line,
                    ));
                }
                _ => {
                    let rest_starts =
                        |op: &str| op.chars().enumerate().all(|(k, oc)| self.peek(k) == Some(oc));
                    if let Some(op) = OPS.iter().find(|op| rest_starts(op)) {
                        for _ in 0..op.chars().count() {
                            self.bump();
                        }
                        self.toks.push(Tok::Op(op, line));
                        if matches!(*op, "<<" | "<<-") {
                            while matches!(self.peek(0), Some(' ' | '\t')) {
                                self.bump();
                            }
                            let delim = self.word();
                            let text = delim.raw();
                            if !text.is_empty() {
                                self.heredocs.push((text, *op == "<<-"));
                            }
                            self.toks.push(Tok::Word(delim, line));
                        }
                        continue;
                    }
                    let w = self.word();
                    // `2>` / `2>&1`: a number right before a redirection is its fd.
                    if matches!(self.peek(0), Some('<' | '>'))
                        && w.literal().is_some_and(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                    {
                        continue;
                    }
                    if w.parts.is_empty() {
                        // Nothing read (cannot happen for a non-operator character): step on.
                        self.bump();
                        continue;
                    }
                    self.toks.push(Tok::Word(w, line));
                }
            }
        }
    }
}
