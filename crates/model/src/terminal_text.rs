//! Text for a terminal: control characters (C0 with newline and tab, DEL, C1), Unicode bidi
//! controls and line separators shown escaped (`\x1b`, `\n`, `\u{202e}`), so that a name from a
//! model can neither drive the terminal nor forge a line. The other media's escaping is in
//! `layerwise_report::escape`, which re-exports these.

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` is shown escaped on a terminal: control characters (C0 with newline and tab, DEL,
/// C1), the bidi controls that reorder what follows (Trojan Source), and the Unicode line and
/// paragraph separators.
pub fn is_shown_escaped(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}')
}

fn push_escaped(c: char, out: &mut String) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

fn escape_where(text: &str, escaped: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            push_escaped(c, &mut out);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` for one line of a terminal: every control and bidi character shown escaped, newlines
/// included.
pub fn terminal(text: &str) -> Cow<'_, str> {
    escape_where(text, is_shown_escaped)
}

/// A whole printed text (lines layerwise composed): as [`terminal`], but its newlines kept. The
/// backstop before printing; names inside were escaped with [`terminal`] where they were inserted.
pub fn terminal_lines(text: &str) -> Cow<'_, str> {
    escape_where(text, |c| c != '\n' && is_shown_escaped(c))
}
