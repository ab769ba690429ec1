//! Aligned text tables: left-aligned words, right-aligned numbers.

/// A table of text cells printed with columns aligned.
pub struct Table {
    headers: Vec<String>,
    /// Right-align this column.
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these headers; a header starting with `>` is a
    /// right-aligned (number) column, the `>` not printed.
    pub fn new(headers: &[&str]) -> Table {
        Table {
            right: headers.iter().map(|h| h.starts_with('>')).collect(),
            headers: headers.iter().map(|h| h.trim_start_matches('>').to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines: header, a rule, the rows.
    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let cell = |r: &Vec<String>, i: usize| r.get(i).cloned().unwrap_or_default();
        let width: Vec<usize> = (0..cols)
            .map(|i| {
                self.rows.iter().map(|r| cell(r, i).chars().count()).chain([self.headers[i].chars().count()]).max()
            })
            .map(|w| w.unwrap_or(0))
            .collect();
        let line = |cells: Vec<String>| {
            let parts: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let pad = width[i].saturating_sub(c.chars().count());
                    if self.right[i] { format!("{}{c}", " ".repeat(pad)) } else { format!("{c}{}", " ".repeat(pad)) }
                })
                .collect();
            parts.join("  ").trim_end().to_string()
        };
        let mut out = vec![line(self.headers.clone())];
        out.push(width.iter().map(|&w| "-".repeat(w)).collect::<Vec<_>>().join("  "));
        for r in &self.rows {
            out.push(line((0..cols).map(|i| cell(r, i)).collect()));
        }
        out.join("\n") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let mut t = Table::new(&["stage", ">GB"]);
        t.row(vec!["DDP".into(), "120".into()]);
        t.row(vec!["ZeRO-3".into(), "1.875".into()]);
        assert_eq!(t.render(), "stage      GB\n------  -----\nDDP       120\nZeRO-3  1.875\n");
    }
}
