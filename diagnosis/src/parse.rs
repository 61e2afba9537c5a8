//! Slurm's `--parsable2` tables (`sacct -P`, `sacctmgr -P`).

use std::collections::BTreeMap;

use super::Row;

/// The `--parsable2` columns whose values are user (or admin) text and may
/// hold the `|` separator. A row with more `|` than its header reads the
/// columns before the first text column from the left and those after the
/// last one from the right; between them, one text column takes the rest,
/// several are left empty (skipped: nothing says where one ends). Ask for
/// text columns last. (`sacct`'s `Reason` is a reason's string, not text.)
pub const TEXT_COLUMNS: &[&str] = &["JobName", "WorkDir", "StdOut", "StdErr", "StdIn", "SubmitLine"];

/// The rows of `sacct -P` output with its header line, each as header name
/// → value (see [`TEXT_COLUMNS`]).
pub fn parse_parsable(text: &str) -> Vec<Row> {
    parse_parsable_with(text, TEXT_COLUMNS)
}

/// The rows of `--parsable2` output with its header line, with `text`
/// the columns that hold user or admin text (`sacctmgr show event`'s
/// `Reason`), read as [`TEXT_COLUMNS`] says.
pub fn parse_parsable_with(text: &str, text_columns: &[&str]) -> Vec<Row> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else { return Vec::new() };
    let names: Vec<&str> = header.split('|').collect();
    let is_text = |n: &&str| text_columns.contains(n);
    let span = names.iter().position(is_text).zip(names.iter().rposition(is_text));
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            let mut row: Row = BTreeMap::new();
            let Some((first, last)) = span.filter(|_| cells.len() > names.len()) else {
                for (k, v) in names.iter().zip(&cells) {
                    row.insert((*k).to_owned(), (*v).to_owned());
                }
                return row;
            };
            let trailing = names.len() - last - 1;
            for (k, v) in names[..first].iter().zip(&cells) {
                row.insert((*k).to_owned(), (*v).to_owned());
            }
            for (k, v) in names[last + 1..].iter().zip(&cells[cells.len() - trailing..]) {
                row.insert((*k).to_owned(), (*v).to_owned());
            }
            let middle = cells[first..cells.len() - trailing].join("|");
            for k in &names[first..=last] {
                let value = if first == last { middle.clone() } else { String::new() };
                row.insert((*k).to_owned(), value);
            }
            row
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsable_rows_keep_user_text_apart() {
        let rows = parse_parsable("JobID|State|JobName\n5|FAILED|a|b|c\n6|COMPLETED|plain\n");
        assert_eq!((rows[0]["State"].as_str(), rows[0]["JobName"].as_str()), ("FAILED", "a|b|c"));
        assert_eq!(rows[1]["JobName"], "plain");
        // Two text columns and too many separators: both skipped, the rest kept.
        let rows = parse_parsable("JobID|State|JobName|WorkDir\n5|FAILED|a|b|/w|x\n");
        assert_eq!((rows[0]["State"].as_str(), rows[0]["JobName"].as_str()), ("FAILED", ""));
        assert_eq!(rows[0]["WorkDir"], "");
        // Plain columns after the text one read from the right.
        let rows = parse_parsable_with("NodeName|Reason|State\nn1|gpu: a|b|DRAIN\n", &["Reason"]);
        assert_eq!((rows[0]["Reason"].as_str(), rows[0]["State"].as_str()), ("gpu: a|b", "DRAIN"));
        // A short row (a step without some fields) as it is.
        let rows = parse_parsable("JobID|State|JobName\n5.batch|FAILED\n");
        assert_eq!(rows[0].get("JobName"), None);
        assert!(parse_parsable("").is_empty());
    }
}
