//! What ONNX Runtime (and TensorRT) log while layerwise runs them. Their lines never go straight to
//! the terminal: they are kept, deduplicated, and handed to the backend whose session logged them,
//! which puts them in its run notes (so in the report). With [`set_echo`] they are also written to
//! standard error as they arrive (the CLI's `--verbose`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// How bad a logged line is, in the libraries' own terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Info,
    Warning,
    Error,
    Fatal,
}

impl LogLevel {
    fn word(self) -> &'static str {
        match self {
            LogLevel::Info => "info",
            LogLevel::Warning => "warning",
            LogLevel::Error => "error",
            LogLevel::Fatal => "fatal",
        }
    }
}

/// One distinct line: the same message from the same session counts once, with how often it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedLine {
    /// The library (`ONNX Runtime`, `TensorRT`).
    pub source: &'static str,
    /// The session's log id (layerwise gives every backend its own); empty for environment lines.
    pub session: String,
    pub level: LogLevel,
    pub message: String,
    pub count: usize,
}

impl LoggedLine {
    /// The line as a run note: `ONNX Runtime warning: MESSAGE (3 times)`.
    pub fn note(&self) -> String {
        let times = if self.count > 1 { format!(" ({} times)", self.count) } else { String::new() };
        format!("{} {}: {}{times}", self.source, self.level.word(), self.message)
    }
}

/// Distinct lines kept before new ones are dropped: a model can log the same complaint for every
/// node, and the report should not grow with it.
const MOST_LINES: usize = 200;

static LINES: Mutex<Vec<LoggedLine>> = Mutex::new(Vec::new());
/// Distinct lines not kept since the last [`take`].
static DROPPED: Mutex<usize> = Mutex::new(0);
static ECHO: AtomicBool = AtomicBool::new(false);

/// Also write every logged line to standard error as it arrives.
pub fn set_echo(on: bool) {
    ECHO.store(on, Ordering::Relaxed);
}

pub fn echo() -> bool {
    ECHO.load(Ordering::Relaxed)
}

/// Keeps a line a library logged.
pub fn record(source: &'static str, session: &str, level: LogLevel, message: &str) {
    let message = message.trim();
    if echo() {
        eprintln!("[{source} {}] {}", level.word(), layerwise_model::terminal_text::terminal_lines(message));
    }
    // Informational lines (devices found, ...) are for `--verbose` only, not for reports.
    if level < LogLevel::Warning {
        return;
    }
    let Ok(mut lines) = LINES.lock() else { return };
    if let Some(line) = lines
        .iter_mut()
        .find(|l| l.source == source && l.session == session && l.level == level && l.message == message)
    {
        line.count += 1;
    } else if lines.len() < MOST_LINES {
        lines.push(LoggedLine { source, session: session.to_string(), level, message: message.to_string(), count: 1 });
    } else if let Ok(mut dropped) = DROPPED.lock() {
        *dropped += 1;
    }
}

/// Takes the lines logged by `session`, and those logged outside any session, in arrival order.
pub fn take(session: &str) -> Vec<LoggedLine> {
    let Ok(mut lines) = LINES.lock() else { return Vec::new() };
    let (mine, others): (Vec<_>, Vec<_>) =
        std::mem::take(&mut *lines).into_iter().partition(|l| l.session == session || l.session.is_empty());
    *lines = others;
    let mut mine = mine;
    if let Ok(mut dropped) = DROPPED.lock() {
        if *dropped > 0 {
            let message =
                format!("{} more log lines were not kept (only the first {MOST_LINES} distinct lines are)", *dropped);
            mine.push(LoggedLine {
                source: "layerwise",
                session: session.to_string(),
                level: LogLevel::Info,
                message,
                count: 1,
            });
            *dropped = 0;
        }
    }
    mine
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_lines_count_once_and_each_session_takes_its_own() {
        record("ONNX Runtime", "test-a", LogLevel::Error, "No execution plans support the graph ");
        record("ONNX Runtime", "test-a", LogLevel::Error, "No execution plans support the graph");
        record("ONNX Runtime", "test-b", LogLevel::Warning, "Removing initializer 'w'");
        let a = take("test-a");
        let a: Vec<_> = a.iter().filter(|l| l.session == "test-a").collect();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].note(), "ONNX Runtime error: No execution plans support the graph (2 times)");
        let b: Vec<_> = take("test-b").into_iter().filter(|l| l.session == "test-b").collect();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].note(), "ONNX Runtime warning: Removing initializer 'w'");
        assert!(take("test-b").iter().all(|l| l.session != "test-b"), "taken lines are gone");
    }
}
