//! Results: rows of named cells, printed as a table in the seeds' style (one row per
//! step per target) and written as JSON and CSV for later comparison and plotting.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};

/// One value of a row.
#[derive(Clone, Debug)]
pub enum Cell {
    Int(u64),
    /// A number shown with this many decimals.
    Float(f64, usize),
    Text(String),
    /// Not known (for example RSS of a target without a pid).
    Empty,
}

impl Cell {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Cell::Int(v) => Some(*v as f64),
            Cell::Float(v, _) => Some(*v),
            _ => None,
        }
    }

    /// The cell as the table shows it.
    pub fn text(&self) -> String {
        self.display()
    }

    fn display(&self) -> String {
        match self {
            Cell::Int(v) => v.to_string(),
            Cell::Float(v, d) => format!("{v:.d$}", d = *d),
            Cell::Text(s) => s.clone(),
            Cell::Empty => "-".to_string(),
        }
    }

    fn json(&self) -> Value {
        match self {
            Cell::Int(v) => json!(v),
            Cell::Float(v, _) => json!(v),
            Cell::Text(s) => json!(s),
            Cell::Empty => Value::Null,
        }
    }
}

impl From<u64> for Cell {
    fn from(v: u64) -> Cell {
        Cell::Int(v)
    }
}

impl From<Option<u64>> for Cell {
    fn from(v: Option<u64>) -> Cell {
        v.map_or(Cell::Empty, Cell::Int)
    }
}

impl From<&str> for Cell {
    fn from(v: &str) -> Cell {
        Cell::Text(v.to_string())
    }
}

impl From<String> for Cell {
    fn from(v: String) -> Cell {
        Cell::Text(v)
    }
}

/// A float with `d` decimals.
pub fn f(v: f64, d: usize) -> Cell {
    Cell::Float(v, d)
}

/// Bytes shown as MiB with one decimal.
pub fn mib(bytes: Option<u64>) -> Cell {
    bytes.map_or(Cell::Empty, |b| {
        Cell::Float(b as f64 / (1024.0 * 1024.0), 1)
    })
}

/// One row: a step of a benchmark on one target.
#[derive(Clone, Debug)]
pub struct Row {
    pub cells: Vec<(&'static str, Cell)>,
}

impl Row {
    pub fn new() -> Row {
        Row { cells: Vec::new() }
    }

    pub fn with(mut self, name: &'static str, cell: impl Into<Cell>) -> Row {
        self.cells.push((name, cell.into()));
        self
    }

    pub fn get(&self, name: &str) -> Option<&Cell> {
        self.cells.iter().find(|(n, _)| *n == name).map(|(_, c)| c)
    }
}

/// All rows of one benchmark run.
#[derive(Clone, Debug)]
pub struct Report {
    /// File stem: `flood`, `packing`, ...
    pub bench: &'static str,
    pub title: String,
    pub rows: Vec<Row>,
    /// Lines printed under the table (references, ratios, notes).
    pub notes: Vec<String>,
}

impl Report {
    pub fn new(bench: &'static str, title: impl Into<String>) -> Report {
        Report {
            bench,
            title: title.into(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Column names, in first-seen order over all rows.
    pub fn columns(&self) -> Vec<&'static str> {
        let mut cols: Vec<&'static str> = Vec::new();
        for row in &self.rows {
            for (name, _) in &row.cells {
                if !cols.contains(name) {
                    cols.push(name);
                }
            }
        }
        cols
    }

    /// The table as text, columns right-aligned.
    pub fn table(&self) -> String {
        let cols = self.columns();
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|row| {
                cols.iter()
                    .map(|c| row.get(c).map_or_else(|| "-".to_string(), Cell::display))
                    .collect()
            })
            .collect();
        let widths: Vec<usize> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| {
                cells
                    .iter()
                    .map(|r| r[i].len())
                    .max()
                    .unwrap_or(0)
                    .max(c.len())
            })
            .collect();
        let mut out = String::new();
        let _ = writeln!(out, "== {} ==", self.title);
        let line = |out: &mut String, items: &[String]| {
            let parts: Vec<String> = items
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (s, w))| {
                    if i == 0 {
                        format!("{s:<w$}")
                    } else {
                        format!("{s:>w$}")
                    }
                })
                .collect();
            let _ = writeln!(out, "{}", parts.join("  ").trim_end());
        };
        let header: Vec<String> = cols.iter().map(|c| c.to_string()).collect();
        line(&mut out, &header);
        for row in &cells {
            line(&mut out, row);
        }
        for note in &self.notes {
            let _ = writeln!(out, "{note}");
        }
        out
    }

    pub fn to_json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|row| {
                let mut m = Map::new();
                for (name, cell) in &row.cells {
                    m.insert(name.to_string(), cell.json());
                }
                Value::Object(m)
            })
            .collect();
        json!({
            "bench": self.bench,
            "title": self.title,
            "columns": self.columns(),
            "rows": rows,
            "notes": self.notes,
        })
    }

    pub fn to_csv(&self) -> String {
        let cols = self.columns();
        let mut out = cols.join(",");
        out.push('\n');
        for row in &self.rows {
            let line: Vec<String> = cols
                .iter()
                .map(|c| match row.get(c) {
                    None | Some(Cell::Empty) => String::new(),
                    Some(Cell::Text(s)) if s.contains([',', '"', '\n']) => {
                        format!("\"{}\"", s.replace('"', "\"\""))
                    }
                    Some(cell) => cell.display(),
                })
                .collect();
            out.push_str(&line.join(","));
            out.push('\n');
        }
        out
    }

    /// The report as Markdown: a heading, a table (numbers right-aligned) and the
    /// notes as a list.
    pub fn markdown(&self) -> String {
        let cols = self.columns();
        let esc = |s: String| s.replace('|', "\\|");
        let mut out = format!("### {}\n\n", self.title);
        let _ = writeln!(out, "| {} |", cols.join(" | "));
        let align: Vec<&str> = cols
            .iter()
            .map(|c| {
                let numeric = self
                    .rows
                    .iter()
                    .any(|r| matches!(r.get(c), Some(Cell::Int(_) | Cell::Float(..))));
                if numeric {
                    "---:"
                } else {
                    "---"
                }
            })
            .collect();
        let _ = writeln!(out, "| {} |", align.join(" | "));
        for row in &self.rows {
            let cells: Vec<String> = cols
                .iter()
                .map(|c| esc(row.get(c).map_or_else(|| "-".to_string(), Cell::display)))
                .collect();
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for note in &self.notes {
                let _ = writeln!(out, "- {note}");
            }
        }
        out
    }

    /// Writes `BENCH.json` and `BENCH.csv` into `dir`.
    pub fn write_files(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let json_path = dir.join(format!("{}.json", self.bench));
        let text = serde_json::to_string_pretty(&self.to_json()).context("encoding JSON")?;
        std::fs::write(&json_path, text + "\n")
            .with_context(|| format!("writing {}", json_path.display()))?;
        let csv_path = dir.join(format!("{}.csv", self.bench));
        std::fs::write(&csv_path, self.to_csv())
            .with_context(|| format!("writing {}", csv_path.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_json_csv_agree() {
        let mut r = Report::new("t", "Test");
        r.rows
            .push(Row::new().with("target", "a").with("ops/s", f(1.5, 1)));
        r.rows
            .push(Row::new().with("target", "b,c").with("rss", Cell::Empty));
        let t = r.table();
        assert!(t.contains("ops/s") && t.contains("1.5"));
        assert_eq!(r.to_csv(), "target,ops/s,rss\na,1.5,\n\"b,c\",,\n");
        assert_eq!(r.to_json()["rows"][0]["ops/s"], json!(1.5));
        r.notes.push("a note".into());
        let md = r.markdown();
        assert!(md.contains("| target | ops/s | rss |\n| --- | ---: | --- |\n| a | 1.5 | - |"));
        assert!(md.ends_with("- a note\n"));
    }
}
