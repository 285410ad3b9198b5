//! Reading a node's text log from a test: the numbers a line reports (`writes=8`), with colour
//! codes removed.

/// The value of `field=N` on every line of the file at `log` that contains `message`.
pub fn numbers(log: &std::path::Path, message: &str, field: &str) -> Vec<usize> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let key = format!("{field}=");
    text.lines()
        .map(strip_ansi)
        .filter(|l| l.contains(message))
        .filter_map(|l| {
            let rest = l.split(key.as_str()).nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// `s` without ANSI escape sequences.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_the_field_of_matching_lines() {
        let dir = std::env::temp_dir().join(format!("testkit-logs-{}", std::process::id()));
        std::fs::write(
            &dir,
            "a group commit flushed \u{1b}[3mwrites\u{1b}[0m=12 records=3\nother writes=5\n\
             group commit flushed writes=1\n",
        )
        .unwrap();
        assert_eq!(
            super::numbers(&dir, "group commit flushed", "writes"),
            vec![12, 1]
        );
        std::fs::remove_file(dir).unwrap();
    }
}
