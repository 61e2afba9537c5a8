//! Where a doc repeats a table that this crate defines, the two stay equal:
//! the words of each user option (README's options table, docs/users.md's
//! word tables, every `(valid words: ...)` message quoted in the docs) and the
//! plugstack keys (README's and docs/admin.md's argument tables, and the
//! unknown-key message docs/admin.md quotes). The code's side is what the
//! parsers accept, not a copy: the option words are each parsed, and the
//! plugstack keys are the ones `PluginConfig::parse` matches.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use md_tables::{Doc, Named, assert_same, code_spans};
use task_plan::options::{self, UserOption};
use task_plan::plugstack::{self, ArgErrorKind, PluginConfig};

/// An option's words as the code gives them (`arginfo`, which `--help` and the
/// error message show), each checked to be one the parser takes.
fn words(o: UserOption) -> Vec<&'static str> {
    let words: Vec<&str> = o.arginfo().split('|').collect();
    for w in &words {
        let arg = w.replace("port=N", "port=29400");
        assert!(
            options::validate(o, Some(&arg)).is_ok(),
            "{o}: arginfo's word `{w}` is refused by the parser"
        );
    }
    assert!(options::validate(o, Some("bogus")).is_err(), "{o} takes any word");
    words
}

fn option_named(cell: &str, doc: &str, line: usize) -> UserOption {
    let spans = code_spans(cell);
    let name = spans.first().map(|s| s.trim_start_matches("--").trim_end_matches("[=WORDS]")).unwrap_or("");
    UserOption::ALL
        .into_iter()
        .find(|o| o.name() == name)
        .unwrap_or_else(|| panic!("{doc}:{line}: `{cell}` names no option the plugin has"))
}

#[test]
fn the_usage_lines_list_the_words_arginfo_lists() {
    for o in UserOption::ALL {
        let listed = o.usage().rsplit_once("Words: ").map(|(_, w)| w.trim_end_matches('.')).unwrap_or("");
        let listed: Vec<&str> = listed.split(", ").collect();
        assert_eq!(listed, words(o), "{o}: usage() {:?} vs arginfo() {:?}", o.usage(), o.arginfo());
    }
}

#[test]
fn readmes_options_table_lists_each_options_words() {
    let doc = Doc::read("README.md");
    let rows = doc.table("## Using the plugin", &["option", "words"]);
    for o in UserOption::ALL {
        let mine: Vec<_> =
            rows.iter().filter(|r| option_named(&r.cells[0], &doc.path, r.line) == o).collect();
        assert_eq!(
            mine.len(),
            1,
            "README.md, the options table under `## Using the plugin`: {} rows for {o}",
            mine.len()
        );
        let row = mine[0];
        let named: Vec<Named> =
            code_spans(&row.cells[1]).into_iter().map(|name| Named { name, line: row.line }).collect();
        assert_same(
            &format!("README.md:{}, the words of {o} in the options table", row.line),
            &named,
            &format!("{o}'s words (UserOption::arginfo)"),
            &words(o),
        );
    }
}

#[test]
fn users_md_word_tables_list_each_options_words() {
    let doc = Doc::read("docs/users.md");
    for (o, heading) in [
        (UserOption::AutoRdzv, "## `--auto-rdzv` words"),
        (UserOption::GpuAffinity, "## What `--gpu-affinity` does"),
    ] {
        let rows = doc.table(heading, &["word", "meaning"]);
        let named: Vec<Named> = rows
            .iter()
            .filter(|r| r.cells[0] != "(none)")
            .map(|r| Named { name: code_spans(&r.cells[0]).concat(), line: r.line })
            .collect();
        assert_same(
            &format!("docs/users.md, the word table under `{heading}`"),
            &named,
            &format!("{o}'s words (UserOption::arginfo)"),
            &words(o),
        );
    }
}

#[test]
fn every_quoted_bad_word_message_lists_the_valid_words() {
    let mut quoted = 0;
    for path in ["README.md", "docs/users.md", "docs/admin.md", "docs/bad-input.md", "docs/architecture.md"] {
        let doc = Doc::read(path);
        for (i, line) in doc.lines.iter().enumerate() {
            let Some(at) = line.find("(valid words: ") else { continue };
            // A message can be wrapped: its start may be on the line before.
            let before = if i > 0 { doc.lines[i - 1].as_str() } else { "" };
            let text = format!("{before} {line}");
            let at = at + before.len() + 1;
            let Some(dashes) = text[..at].rfind("spank-gpu: --") else { continue };
            let name = text[dashes + "spank-gpu: --".len()..].split('=').next().unwrap_or("");
            let o = UserOption::ALL
                .into_iter()
                .find(|o| o.name() == name)
                .unwrap_or_else(|| panic!("{path}:{}: a message about `--{name}`, no such option", i + 1));
            let list = text[at + "(valid words: ".len()..].split(')').next().unwrap_or("");
            let named: Vec<Named> =
                list.split(", ").map(|w| Named { name: w.to_owned(), line: i + 1 }).collect();
            assert_same(
                &format!("{path}:{}, the valid words of the quoted message `{}`", i + 1, line.trim()),
                &named,
                &format!("{o}'s words (UserOption::arginfo)"),
                &words(o),
            );
            quoted += 1;
        }
    }
    // docs/users.md and docs/bad-input.md quote it: a reader that found none is broken.
    assert!(quoted >= 2, "only {quoted} quoted bad-word messages found");
}

/// The keys `PluginConfig::parse` matches in a release build, read from its
/// source: the arms `"key" =>` of its `match key` (debug-only arms, `"key" if
/// debug_hooks =>`, left out).
fn parsed_keys() -> Vec<Named> {
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/plugstack.rs")).unwrap();
    let lines: Vec<&str> = src.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.contains("pub fn parse<S: AsRef<str>>"))
        .expect("PluginConfig::parse in plugstack.rs");
    let end = start + lines[start..].iter().position(|l| l.contains("Ok(cfg)")).expect("its end");
    let keys: Vec<Named> = (start..end)
        .filter_map(|i| {
            let (key, rest) = lines[i].trim().strip_prefix('"')?.split_once('"')?;
            rest.trim_start().starts_with("=>").then(|| Named { name: key.to_owned(), line: i + 1 })
        })
        .collect();
    assert!(keys.len() >= 5, "read only {keys:?} from PluginConfig::parse: the reader is broken");
    keys
}

#[test]
fn keys_lists_exactly_the_keys_the_parser_takes() {
    assert_same(
        "the arms of PluginConfig::parse (plan/src/plugstack.rs, lines as given)",
        &parsed_keys(),
        "plugstack::KEYS (the unknown-key message's list)",
        plugstack::KEYS,
    );
    for key in plugstack::KEYS {
        let word = format!("{key}=x");
        if let Err(e) = PluginConfig::parse(&[word.as_str()], false) {
            assert_ne!(e.kind, ArgErrorKind::UnknownKey, "{word}: {e}");
        }
    }
}

/// The keys of an argument table (`auto_rdzv=on\|off`, ...; `NAME=VALUE`, the
/// environment defaults, left out).
fn argument_keys(doc: &Doc, heading: &str) -> Vec<Named> {
    doc.table(heading, &["argument", "default", "meaning"])
        .iter()
        .map(|r| {
            let arg = code_spans(&r.cells[0]).concat();
            Named { name: arg.split('=').next().unwrap_or("").to_owned(), line: r.line }
        })
        .filter(|n| n.name != "NAME")
        .collect()
}

#[test]
fn the_argument_tables_list_every_plugstack_key() {
    for (path, heading) in [("README.md", "## Using the plugin"), ("docs/admin.md", "## The plugstack line")]
    {
        let doc = Doc::read(path);
        assert_same(
            &format!("{path}, the argument table under `{heading}`"),
            &argument_keys(&doc, heading),
            "plugstack::KEYS",
            plugstack::KEYS,
        );
    }
}

#[test]
fn admin_md_quotes_the_unknown_key_message_as_it_is() {
    let doc = Doc::read("docs/admin.md");
    let (line, text) = doc.paragraph("spank-gpu: plugstack.conf argument 'bogus=1'");
    let e = PluginConfig::parse(&["bogus=1"], false).unwrap_err();
    let known = text.split("(known keys: ").nth(1).and_then(|t| t.split(';').next()).unwrap_or("");
    let named: Vec<Named> = known.split(", ").map(|k| Named { name: k.to_owned(), line }).collect();
    assert_same(
        &format!("docs/admin.md:{line}, the known keys of the quoted unknown-key message"),
        &named,
        "plugstack::KEYS",
        plugstack::KEYS,
    );
    let want = format!("spank-gpu: {e}");
    assert!(
        text.starts_with(&want),
        "docs/admin.md:{line} quotes\n  {text}\nthe plugin writes\n  {want}; ..."
    );
}
