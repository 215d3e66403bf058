//! Reporting `inferno bench`'s results: a llama-bench style table that grows row by row
//! with the notes that belong beside it printed under it, or every result with its samples
//! as JSON at the end.

use super::measure::{BenchResult, ModelFacts, Note, Sink, TimeSummary};
use crate::cli::args::OutputFormat;
use anyhow::Result;
use indicatif::ProgressBar;

impl TimeSummary {
    fn shown(&self) -> String {
        format!(
            "p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            self.p50_ms, self.p99_ms, self.max_ms
        )
    }
}

/// How results are shown.
pub enum Report {
    /// The table, its header already printed, and the notes for under it.
    Text {
        /// The roofline column is shown.
        roofline: bool,
        size: u64,
        params: u64,
        notes: Vec<String>,
    },
    /// Nothing until the end.
    Json,
}

impl Report {
    /// Starts the report (for text, the table's header), before the benchmark runs.
    pub fn start(output: OutputFormat, roofline: bool, facts: &ModelFacts) -> Self {
        if output != OutputFormat::Text {
            return Self::Json;
        }
        let (column, rule) = if roofline {
            (
                format!(" {:>18} |", "roofline t/s"),
                format!(" {:->18} |", ":"),
            )
        } else {
            (String::new(), String::new())
        };
        println!(
            "| {:<24} | {:>10} | {:>8} | {:<10} | {:<10} | {:>7} | {:>14} | {:>16} |{column}",
            "model", "size", "params", "backend", "simd", "threads", "test", "t/s"
        );
        println!(
            "| {:-<24} | {:->10} | {:->8} | {:-<10} | {:-<10} | {:->7} | {:->14} | {:->16} |{rule}",
            ":", ":", ":", ":", ":", ":", ":", ":"
        );
        Self::Text {
            roofline,
            size: facts.size,
            params: facts.params,
            notes: Vec::new(),
        }
    }

    /// Ends the report: the notes under the table, or the results as JSON.
    pub fn finish(self, results: &[BenchResult]) -> Result<()> {
        match self {
            Self::Text { notes, .. } => {
                for n in &notes {
                    println!("{n}");
                }
            }
            Self::Json => println!("{}", serde_json::to_string_pretty(results)?),
        }
        Ok(())
    }
}

impl Sink for Report {
    fn note(&mut self, note: Note) {
        let Self::Text { notes, .. } = self else {
            return;
        };
        notes.push(match note {
            Note::Moe {
                used,
                experts,
                step_bytes,
                active_params,
                params,
            } => format!(
                "mixture of experts, {used} of {experts} per token: one decode step reads {} of \
                 weights, {} active parameters of {}",
                bytes_shown(step_bytes),
                count_shown(active_params),
                count_shown(params)
            ),
            Note::Bandwidth {
                threads,
                bytes_per_second,
            } => format!(
                "memory read bandwidth, {threads} thread(s): {:.1} GB/s",
                bytes_per_second / 1e9
            ),
            Note::Experts { backend, why } => format!("{backend}: experts {why}"),
            Note::KvCache {
                backend,
                types: (kt, vt),
                bytes,
                positions,
                resident,
            } => format!(
                "{backend}: KV cache {kt}/{vt}, {} per sequence of {positions} positions; \
                 resident memory after load {}",
                bytes_shown(bytes),
                resident.map_or("unknown".into(), bytes_shown),
            ),
        });
    }

    fn result(&mut self, r: &BenchResult, bar: &ProgressBar) {
        let Self::Text {
            roofline,
            size,
            params,
            notes,
        } = self
        else {
            return;
        };
        let (backend, threads, test) = (&r.backend, r.threads, &r.test);
        if let Some(s) = &r.speculative {
            notes.push(format!(
                "{backend} x{threads} {test}: {:.3} × without; drafted {}, accepted {} \
                 ({:.1}%), {:.2} accepted per verification ({} verifications)",
                s.ratio,
                s.drafted,
                s.accepted,
                s.acceptance * 100.0,
                s.mean_accepted,
                s.verify_steps
            ));
        }
        if let Some(c) = &r.constraint {
            notes.push(format!(
                "{backend} x{threads} {test}: {:.3} × unconstrained; mask {}; sampling waited \
                 {} ({} masks, {} restarts)",
                c.ratio,
                c.mask.shown(),
                c.mask_wait.shown(),
                c.mask.n,
                c.restarts
            ));
        }
        let avg = r.avg_ts;
        let column = match (*roofline, r.roofline_ts) {
            (false, _) => String::new(),
            // The bound and how much of it this run reached.
            (true, Some(b)) => format!(" {:>18} |", format!("{b:.1} ({:.0}%)", avg / b * 100.0)),
            (true, None) => format!(" {:>18} |", "-"),
        };
        // Above the bar, which redraws under the table.
        bar.suspend(|| {
            println!(
                "| {:<24} | {:>10} | {:>8} | {:<10} | {:<10} | {:>7} | {:>14} | {:>7.2} ± {:>6.2} |{column}",
                truncate(&r.model, 24),
                bytes_shown(*size),
                count_shown(*params),
                backend,
                r.simd,
                threads,
                test,
                avg,
                r.stddev_ts
            )
        });
    }
}

/// A size in the largest binary unit that keeps it at least 1 (`1.20 GiB`, `5.47 MiB`), so
/// a small model does not read `0.00 GiB`.
pub fn bytes_shown(bytes: u64) -> String {
    const UNITS: &[(&str, u64)] = &[("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for &(unit, size) in UNITS {
        if bytes >= size {
            return format!("{:.2} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

/// A parameter count in billions, millions or thousands (`0.60 B`, `3.42 M`).
fn count_shown(n: u64) -> String {
    const UNITS: &[(&str, f64)] = &[("B", 1e9), ("M", 1e6), ("K", 1e3)];
    for &(unit, size) in UNITS {
        if n as f64 >= size {
            return format!("{:.2} {unit}", n as f64 / size);
        }
    }
    n.to_string()
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::{bytes_shown, count_shown};

    #[test]
    fn sizes_and_counts_keep_their_digits() {
        assert_eq!(bytes_shown(639_000_000), "609.40 MiB");
        assert_eq!(bytes_shown(3 << 30), "3.00 GiB");
        assert_eq!(bytes_shown(5_000), "4.88 KiB");
        assert_eq!(bytes_shown(12), "12 B");
        assert_eq!(count_shown(596_049_920), "596.05 M");
        assert_eq!(count_shown(1_500_000_000), "1.50 B");
        assert_eq!(count_shown(3_400), "3.40 K");
        assert_eq!(count_shown(7), "7");
    }
}
