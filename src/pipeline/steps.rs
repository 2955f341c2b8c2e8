//! What a long job shows while it works: a spinner on a terminal, or one plain line per step
//! where stderr is not one (a file, a pipe, a notebook), and how long each step took (the
//! report's `run_info`). Where the total is known (samples, candidate runs), it says how far it is.

use std::io::IsTerminal;
use std::time::Instant;

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::options::CANCEL;

pub(crate) struct Steps {
    bar: ProgressBar,
    /// One line per step on stderr (no spinner).
    lines: bool,
    started: Instant,
    durations: Vec<(String, f64)>,
    /// Where a counted stretch of work (`count`) began, for its estimate.
    counting_since: Option<Instant>,
    /// "sample 2 of 7: b.npz", shown before each step's label while counting.
    position: String,
}

impl Steps {
    /// `show`: say what is going on at all; `lines`: as plain lines even on a terminal. Where
    /// stderr is not a terminal, plain lines are what shows.
    pub(crate) fn new(show: bool, lines: bool) -> Steps {
        let lines = show && (lines || !std::io::stderr().is_terminal());
        let bar = ProgressBar::new_spinner();
        bar.set_draw_target(if show && !lines { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() });
        bar.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("template"));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        Steps {
            bar,
            lines,
            started: Instant::now(),
            durations: Vec::new(),
            counting_since: None,
            position: String::new(),
        }
    }

    pub(crate) fn run<T>(&mut self, label: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if CANCEL.load(std::sync::atomic::Ordering::Relaxed) {
            bail!("interrupted before '{label}'");
        }
        let label = self.show(label);
        let t = Instant::now();
        let r = f();
        self.durations.push((label, t.elapsed().as_secs_f64()));
        r
    }

    /// Says that `label` is what goes on now; the label as recorded.
    fn show(&mut self, label: &str) -> String {
        // Labels and sample names can quote names from the model or the user's files.
        let label = layerwise_report::escape::terminal(label);
        let shown = if self.position.is_empty() { label.to_string() } else { format!("{}: {label}", self.position) };
        self.bar.set_message(shown.clone());
        if self.lines {
            eprintln!("layerwise: {shown} ({:.1} s)", self.started.elapsed().as_secs_f64());
        }
        label.to_string()
    }

    /// A step that ran on another thread, shown where its result is taken as a step `run` there
    /// would be: its own duration.
    pub(crate) fn ran_beside(&mut self, label: &str, seconds: f64) {
        let label = self.show(label);
        self.durations.push((label, seconds));
    }

    /// A step that ran on another thread, beside the ones `run` timed: its own duration.
    pub(crate) fn record(&mut self, label: &str, seconds: f64) {
        self.durations.push((label.to_string(), seconds));
    }

    /// Item `k` (from 1) of `total` begins (`what`: "sample", `name`: which one): shown before
    /// each step's label until the next item, with an estimate of the time left once one item
    /// has finished.
    pub(crate) fn count(&mut self, what: &str, k: usize, total: usize, name: &str) {
        let since = *self.counting_since.get_or_insert_with(Instant::now);
        let left = if k > 1 {
            let per_item = since.elapsed().as_secs_f64() / (k - 1) as f64;
            format!(", about {:.0} s left", per_item * (total + 1 - k) as f64)
        } else {
            String::new()
        };
        let named =
            if name.is_empty() { String::new() } else { format!(" ({})", layerwise_report::escape::terminal(name)) };
        self.position = format!("{what} {k} of {total}{named}{left}");
        if self.lines {
            eprintln!("layerwise: {} ({:.1} s)", self.position, self.started.elapsed().as_secs_f64());
        }
        self.bar.set_message(self.position.clone());
    }

    /// The counted stretch is over: labels stand alone again.
    pub(crate) fn end_count(&mut self) {
        self.position.clear();
        self.counting_since = None;
    }

    pub(crate) fn finish(self) -> Vec<(String, f64)> {
        self.bar.finish_and_clear();
        let mut d = self.durations;
        d.push(("total".into(), self.started.elapsed().as_secs_f64()));
        d
    }
}

/// With `LAYERWISE_TIMING` set, prints how long `what` took since `started` (stderr, as a
/// [`layerwise_runtime::timing_mark`]), for the benchmarks' breakdown of a step.
pub(crate) fn timing(what: &str, started: Instant) {
    layerwise_runtime::timing_mark(|| format!("{what}: {:.2}s", started.elapsed().as_secs_f64()));
}
