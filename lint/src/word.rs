//! A shell word as the tokenizer ([`super::lexer`]) reads it and the
//! shell reader ([`super::shell`]) keeps it: its parts, quotes removed,
//! expansions kept as written.

/// A piece of a word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Text as it is.
    Lit(String),
    /// `$NAME`, `${NAME}` or `${NAME:-default}` (`default` when literal).
    Var {
        /// The variable.
        name: String,
        /// A literal default (`${NAME:-8}`, `${NAME-8}`).
        default: Option<String>,
        /// As written.
        raw: String,
    },
    /// Shell that cannot be followed without running it: `$(...)`,
    /// backquotes, `$((...))`, `$1`, `${X#y}`, ... (as written).
    Unknown(String),
}

/// A shell word.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Word {
    /// Its pieces, quotes removed.
    pub parts: Vec<Part>,
    /// Whether any of it was quoted (an unquoted word that expands to
    /// nothing is no word at all).
    pub quoted: bool,
}

impl Word {
    /// The word when it is all literal text.
    pub fn literal(&self) -> Option<String> {
        let mut s = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(t) => s.push_str(t),
                _ => return None,
            }
        }
        Some(s)
    }

    /// Whether the word is exactly `text`.
    pub fn is(&self, text: &str) -> bool {
        matches!(self.parts.as_slice(), [Part::Lit(t)] if t == text)
    }

    /// The word as written, quotes removed, expansions as they were written.
    pub fn raw(&self) -> String {
        let mut s = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(t) => s.push_str(t),
                Part::Var { raw, .. } | Part::Unknown(raw) => s.push_str(raw),
            }
        }
        s
    }

    pub(crate) fn push_lit(&mut self, c: char) {
        if let Some(Part::Lit(t)) = self.parts.last_mut() {
            t.push(c);
        } else {
            self.parts.push(Part::Lit(c.to_string()));
        }
    }
}
