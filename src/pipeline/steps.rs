//! What a long job shows while it works: a spinner on a terminal, or one line per step, and how
//! long each step took (the report's `run_info`).

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
}

impl Steps {
    pub(crate) fn new(show: bool, lines: bool) -> Steps {
        let bar = ProgressBar::new_spinner();
        bar.set_draw_target(if show && !lines { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() });
        bar.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("template"));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        Steps { bar, lines: show && lines, started: Instant::now(), durations: Vec::new() }
    }

    pub(crate) fn run<T>(&mut self, label: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if CANCEL.load(std::sync::atomic::Ordering::Relaxed) {
            bail!("interrupted before '{label}'");
        }
        self.bar.set_message(label.to_string());
        if self.lines {
            eprintln!("layerwise: {label} ({:.1} s)", self.started.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        let r = f();
        self.durations.push((label.to_string(), t.elapsed().as_secs_f64()));
        r
    }

    pub(crate) fn finish(self) -> Vec<(String, f64)> {
        self.bar.finish_and_clear();
        let mut d = self.durations;
        d.push(("total".into(), self.started.elapsed().as_secs_f64()));
        d
    }
}
