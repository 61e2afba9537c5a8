//! Prometheus's text exposition format, as far as every writer of a metric
//! needs it ([`crate::reports::metrics`], and the lines of
//! [`crate::slurm::release`] and [`crate::sources::network`]).

/// A label value as the text exposition format writes it between its
/// double quotes: a backslash, a double quote and a line feed escaped
/// (`\\`, `\"`, `\n`), every other character as it is. A node name, a
/// plugin's path or a driver's version is any text; escaped, it stays itself
/// for the reader (node_exporter's textfile collector), and cannot end the
/// value or the line early.
pub fn label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}
