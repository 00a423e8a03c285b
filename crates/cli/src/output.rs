//! Text output for people: aligned tables and key/value blocks.

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// Renders rows under headers, columns separated by two spaces, without
/// trailing whitespace.
pub fn table(columns: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = columns.iter().map(|(h, _)| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = columns.iter().map(|(h, _)| h.to_string()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, ((_, align), cell)) in columns.iter().zip(row).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            match align {
                Align::Left => {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                }
                Align::Right => {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                }
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Renders `key: value` lines with the values aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| format!("{:<width$} {v}\n", format!("{k}:")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let text = table(
            &[("NAME", Align::Left), ("SIZE", Align::Right)],
            &[
                vec!["a".into(), "10 GiB".into()],
                vec!["longer".into(), "4 KiB".into()],
            ],
        );
        assert_eq!(text, "NAME      SIZE\na       10 GiB\nlonger   4 KiB\n");
    }

    #[test]
    fn header_only_table() {
        assert_eq!(
            table(&[("NAME", Align::Left), ("X", Align::Left)], &[]),
            "NAME  X\n"
        );
    }

    #[test]
    fn aligns_fields() {
        let text = fields(&[
            ("name", "a".into()),
            ("size", "1 B".into()),
            ("id", "x".into()),
        ]);
        assert_eq!(text, "name: a\nsize: 1 B\nid:   x\n");
    }
}
