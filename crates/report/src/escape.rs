//! Text from a model (tensor, node and op names, and messages quoting them) is data in every medium
//! layerwise writes: one escaping function per medium, used by every writer.
//!
//! - terminal: control characters (C0, DEL, C1) and Unicode bidi controls are shown escaped
//!   (`\x1b`, `\n`, `\u{202e}`), so a name can neither drive the terminal nor forge a line;
//! - Markdown: a name is text or a code span, never markup, HTML, a link, or a cell boundary;
//! - CSV: a text cell that a spreadsheet would read as a formula gets a leading `'`;
//! - shell: a printed command is one command whose words are the intended arguments; a word
//!   that cannot be pasted faithfully (control or bidi characters) is refused.
//!
//! JSON keeps names exact; HTML is escaped by [`html`].

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde::Serialize;

// The terminal's escaping lives in the model crate, the first in the data flow, so that the
// runtime's echo of backend logs (`--verbose`) uses the same function.
pub use layerwise_model::terminal_text::{is_shown_escaped, terminal, terminal_lines};

/// A copy of `value` (a report) with every string and map key escaped with [`terminal`]: what the
/// terminal summaries render, so no field can reach the terminal raw. Reports read back from their
/// JSON (`layerwise report`); one that did not would be rendered as it is, and the printing
/// backstop ([`terminal_lines`]) would still escape its control characters.
pub fn for_terminal<T: Serialize + DeserializeOwned + Clone>(value: &T) -> T {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => {
                if let Cow::Owned(e) = terminal(s) {
                    *s = e;
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            serde_json::Value::Object(map) => {
                let entries = std::mem::take(map);
                for (k, mut v) in entries {
                    walk(&mut v);
                    map.insert(terminal(&k).into_owned(), v);
                }
            }
            _ => {}
        }
    }
    let Ok(mut tree) = serde_json::to_value(value) else { return value.clone() };
    walk(&mut tree);
    serde_json::from_value(tree).unwrap_or_else(|_| value.clone())
}

/// `text` as Markdown text (a paragraph, list item or table cell): shown as written, never
/// markup. Control and bidi characters are shown escaped as on a terminal (a newline would end a
/// table row); the characters that open HTML, entities, code spans, links, emphasis or a cell
/// boundary are backslash-escaped, and so is a leading character that would start a block.
pub fn markdown_text(text: &str) -> String {
    let text = terminal(text);
    // GitHub's Markdown (GFM) links more than CommonMark does: bare URLs, `www.` domains and email
    // addresses become links, `@name` notifies a user and `#12` links an issue. A word of a name
    // that could do any of that is shown as a code span, where GitHub does none of it (a word
    // holding a pipe stays escaped text: a pipe in a code span would split a table row).
    if text.split_whitespace().any(links_on_github) {
        return markdown_words(&text);
    }
    markdown_chars(&text)
}

/// Whether GitHub could turn `word` (no whitespace) into a link or a mention.
fn links_on_github(word: &str) -> bool {
    let lower = word.to_ascii_lowercase();
    let issue = word.char_indices().any(|(i, c)| c == '#' && word[i + 1..].starts_with(|d: char| d.is_ascii_digit()));
    // `GH-12` is an issue link, and 7 to 40 hex digits a commit link, in GitHub's conversations.
    let gh_issue = lower.match_indices("gh-").any(|(i, _)| lower[i + 3..].starts_with(|d: char| d.is_ascii_digit()));
    // A number (`1.6326e10`) is no commit.
    let number = word
        .trim_end_matches(|c: char| c.is_ascii_punctuation() && c != '.')
        .trim_start_matches(['(', '['])
        .parse::<f64>()
        .is_ok();
    let commit = !number
        && word
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|part| (7..=40).contains(&part.len()) && part.chars().all(|c| c.is_ascii_hexdigit()));
    lower.contains("://")
        || lower.contains("www.")
        || lower.contains('@')
        || lower.contains("mailto:")
        || lower.contains("xmpp:")
        || issue
        || gh_issue
        || commit
}

/// `text` word by word: a word GitHub could link as a code span, the rest escaped as text; the
/// whitespace between words as it is (spaces at either end as character references).
fn markdown_words(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.is_empty() {
            return;
        }
        if links_on_github(word) {
            // A pipe stays escaped text between code spans: in a code span it would split a
            // table row.
            let pieces: Vec<String> = word
                .split('|')
                .map(|piece| if links_on_github(piece) { linkable_piece(piece) } else { markdown_chars(piece) })
                .collect();
            out.push_str(&pieces.join("\\|"));
        } else {
            // Escaped as text of its own (a leading punctuation mark escaped as a block opener is
            // harmless mid-line: a backslash before punctuation is always an escape).
            out.push_str(&markdown_chars(word));
        }
        word.clear();
    };
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_whitespace() {
            flush(&mut word, &mut out);
            if i == 0 || i + 1 == chars.len() {
                out.push_str(&format!("&#{};", c as u32));
            } else {
                out.push(c);
            }
        } else {
            word.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// A word GitHub could link: a code span, with the sentence's brackets, quotes and punctuation
/// around it left outside as text where the rest still links (`[a, ArgMax#98])` showed "])" in the
/// code span, as part of the name).
fn linkable_piece(piece: &str) -> String {
    let core = piece
        .trim_start_matches(['(', '[', '{', '\'', '"'])
        .trim_end_matches([')', ']', '}', ',', ';', '.', '\'', '"']);
    if core.is_empty() || !links_on_github(core) {
        return code_span(piece);
    }
    let start = piece.find(core).unwrap_or(0);
    let (head, tail) = (&piece[..start], &piece[start + core.len()..]);
    format!("{}{}{}", markdown_chars(head), code_span(core), markdown_chars(tail))
}

fn markdown_chars(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 8);
    let mut leading_digits = true;
    for (i, &c) in chars.iter().enumerate() {
        // `_` only emphasises at a word boundary: `ln_squared` stays as it is.
        let intraword =
            |i: usize| i > 0 && i + 1 < chars.len() && chars[i - 1].is_alphanumeric() && chars[i + 1].is_alphanumeric();
        let special =
            matches!(c, '\\' | '`' | '*' | '[' | ']' | '<' | '&' | '|' | '~' | '$') || (c == '_' && !intraword(i));
        // A block opener at the start (`#`, `-`, `+`, `=`, `>`, `1.`, `1)`), where the text starts
        // a line.
        let block = (i == 0 && c.is_ascii_punctuation()) || (leading_digits && i > 0 && matches!(c, '.' | ')'));
        leading_digits &= c.is_ascii_digit();
        // A space at either end as a character reference: a cell's content is trimmed, a
        // paragraph's leading spaces can make it code and its trailing ones a line break.
        if c == ' ' && (i == 0 || i + 1 == chars.len()) {
            out.push_str("&#32;");
            continue;
        }
        if special || block {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `text` as a Markdown code span outside a table: a fence longer than any run of backticks in
/// it, so it cannot be closed early; control and bidi characters shown escaped.
pub fn markdown_code(text: &str) -> String {
    code_span(&terminal(text))
}

/// `text` as a Markdown code span inside a table cell: as [`markdown_code`], or as
/// [`markdown_text`] where it holds a pipe (GFM splits a row at a pipe inside a code span unless it
/// is escaped, and a backslash before it cannot be told from that escape).
pub fn markdown_cell_code(text: &str) -> String {
    let shown = terminal(text);
    if shown.contains('|') {
        markdown_text(text)
    } else {
        code_span(&shown)
    }
}

/// cmark and cmark-gfm (GitHub's renderers) open no code span with a fence of more than 80
/// backticks (`MAXBACKTICKS`): such a span never closes, and what follows renders as Markdown.
const LONGEST_FENCE: usize = 80;

fn code_span(text: &str) -> String {
    if text.is_empty() {
        return String::new();
    }
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    if longest + 1 > LONGEST_FENCE {
        // Text instead: each run of backticks escaped, the rest as text (its linkable words in
        // code spans of their own, which hold no backtick).
        let mut out = String::new();
        let mut piece = String::new();
        for c in text.chars() {
            if c == '`' {
                if !piece.is_empty() {
                    out.push_str(&markdown_words(&piece));
                    piece.clear();
                }
                out.push_str("\\`");
            } else {
                piece.push(c);
            }
        }
        if !piece.is_empty() {
            out.push_str(&markdown_words(&piece));
        }
        return out;
    }
    let fence = "`".repeat(longest + 1);
    // CommonMark strips one space from each end of a span that begins and ends with one: pad
    // where the text begins or ends with a backtick (which would join the fence) or with spaces.
    let all_spaces = text.chars().all(|c| c == ' ');
    let pad =
        text.starts_with('`') || text.ends_with('`') || (!all_spaces && text.starts_with(' ') && text.ends_with(' '));
    let pad = if pad { " " } else { "" };
    format!("{fence}{pad}{text}{pad}{fence}")
}

/// `text` as a CSV text cell (names, op types, messages): one that a spreadsheet would read as a
/// formula gets a leading `'`, as spreadsheets document. What decides is what a spreadsheet sees:
/// the first character that is not white space, a format character (soft hyphen, bidi marks, the
/// invisible operators) or otherwise default-ignorable (variation selectors, Hangul fillers), taken
/// in its compatibility form (small and fullwidth `=`, `+`, `-`, `@` are those); a leading tab or
/// carriage return counts too. Numbers are written as numbers, not through this.
pub fn csv_text(text: &str) -> Cow<'_, str> {
    let visible = text.trim_start_matches(|c: char| c.is_whitespace() || unseen_in_a_cell(c));
    let formula = visible.chars().next().is_some_and(|c| {
        use unicode_normalization::char::decompose_compatible;
        let mut folded = String::new();
        decompose_compatible(c, |d| folded.push(d));
        matches!(folded.as_str(), "=" | "+" | "-" | "@") || c == '\u{2212}'
    });
    if text.starts_with(['\t', '\r']) || formula {
        Cow::Owned(format!("'{text}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// Characters a spreadsheet may drop or not show before a formula sign: format characters (Cf)
/// and the other default-ignorable code points of Unicode's DerivedCoreProperties.
fn unseen_in_a_cell(c: char) -> bool {
    use unicode_general_category::{get_general_category, GeneralCategory};
    get_general_category(c) == GeneralCategory::Format
        || matches!(
            c as u32,
            0x00AD
                | 0x034F
                | 0x061C
                | 0x115F..=0x1160
                | 0x17B4..=0x17B5
                | 0x180B..=0x180F
                | 0x200B..=0x200F
                | 0x202A..=0x202E
                | 0x2060..=0x206F
                | 0x3164
                | 0xFE00..=0xFE0F
                | 0xFEFF
                | 0xFFA0
                | 0xFFF0..=0xFFF8
                | 0x1BCA0..=0x1BCA3
                | 0x1D173..=0x1D17A
                | 0xE0000..=0xE0FFF
        )
}

/// `text` as one word of a printed POSIX shell command (bash, zsh, sh): bare where it is made of
/// letters, digits and `_./-:,@%+` (and `=` after its first character: zsh expands a leading one),
/// single-quoted otherwise ([`shell_quoted`]). `None` where it holds a character the terminal
/// shows escaped, which a pasted line would not keep.
pub fn shell_word(text: &str) -> Option<String> {
    let bare_char = |(i, c): (usize, char)| {
        c.is_ascii_alphanumeric()
            || matches!(c, '_' | '.' | '/' | '-' | ':' | ',' | '@' | '%' | '+')
            || (c == '=' && i > 0)
    };
    if !text.is_empty() && text.chars().enumerate().all(bare_char) {
        Some(text.to_string())
    } else {
        shell_quoted(text)
    }
}

/// `text` as one single-quoted shell word (a `'` inside as `'\''`), as the trtexec line prints
/// its `--layerPrecisions` value; `None` as for [`shell_word`].
pub fn shell_quoted(text: &str) -> Option<String> {
    if text.chars().any(|c| is_shown_escaped(c) || c == '\0') {
        return None;
    }
    Some(format!("'{}'", text.replace('\'', "'\\''")))
}

/// Why a node name is left out of the printed `trtexec --layerPrecisions=NAME:fp32,...`, if it
/// is: the value is one shell word, and trtexec splits it at `,` and `:` and reads `*` as every
/// layer.
pub fn trtexec_layer_refusal(name: &str) -> Option<&'static str> {
    if name.chars().any(|c| is_shown_escaped(c) || c == '\0') {
        Some("a control or bidi character, which a pasted command does not keep")
    } else if name.contains([',', ':']) {
        Some("',' or ':', where trtexec splits --layerPrecisions")
    } else if name == "*" || name.is_empty() {
        Some("a name trtexec reads as every layer")
    } else if made_up_name(name) {
        Some("the node has no name of its own in the file (layerwise calls an unnamed or twice-named node OP#INDEX), so TensorRT names its layer otherwise")
    } else {
        None
    }
}

/// `NAME#INDEX`: how layerwise names a node whose name in the file is empty or shared
/// (`GraphIndex`); no TensorRT layer is called so.
fn made_up_name(name: &str) -> bool {
    name.rsplit_once('#')
        .is_some_and(|(head, index)| !head.is_empty() && !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
}

/// The names of `keep` that [`trtexec_layer_refusal`] leaves out of a printed trtexec line, each
/// with why.
pub fn trtexec_left_out(keep: &[String]) -> Vec<(&str, &'static str)> {
    keep.iter().filter_map(|n| trtexec_layer_refusal(n).map(|why| (n.as_str(), why))).collect()
}

/// `text` for HTML text and double-quoted attributes. A NUL, which HTML does not allow (a parser
/// shows U+FFFD for it), is written as that U+FFFD (the red team found raw NUL bytes from a node
/// name `a\0b` in a report).
pub fn html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\0', "&#xFFFD;")
}

#[cfg(test)]
mod tests {
    use super::csv_text;

    /// Found by the independent tester (issue 51): `fix` printed `--layerPrecisions=...,ArgMax#98:fp32`
    /// for a node with no name in the file, a layer TensorRT does not call so.
    #[test]
    fn a_name_layerwise_made_up_is_left_out_of_trtexec() {
        for made_up in ["ArgMax#98", "block/Add#1204"] {
            assert!(super::trtexec_layer_refusal(made_up).is_some_and(|why| why.contains("no name of its own")));
        }
        for real in ["ArgMax_98", "a#b", "#12", "x#"] {
            assert_eq!(super::trtexec_layer_refusal(real), None, "{real}");
        }
    }

    /// Found by the independent tester (issue 51): "[v_/value_head/Add, ArgMax#98])" rendered
    /// "])" inside the code span, as if part of the name.
    #[test]
    fn brackets_around_a_linkable_name_stay_outside_its_code_span() {
        let shown = super::markdown_text("kept (integer_from_float [v_/value_head/Add, ArgMax#98])");
        assert!(shown.contains("`ArgMax#98`"), "{shown}");
        assert!(!shown.contains("ArgMax#98]"), "{shown}");
        assert!(shown.ends_with("`ArgMax#98`\\])"), "{shown}");
    }

    /// Found by the red team (issue 54): a node name `a\0b` put a raw NUL into the HTML report.
    #[test]
    fn html_holds_no_nul() {
        assert_eq!(super::html("a\0b<"), "a&#xFFFD;b&lt;");
    }

    /// Found by the red team (issue 54 item 6): these before `=` got no quote.
    #[test]
    fn a_formula_after_invisible_characters_or_in_a_compatibility_form_is_quoted() {
        for text in
            ["\u{00AD}=1+1", "\u{200E}=1+1", "\u{2061}=1+1", "\u{3164}=1+1", "\u{FE66}1+1", "\u{FE62}1", "\u{FE6B}x"]
        {
            assert!(csv_text(text).starts_with('\''), "{text:?}");
        }
        for text in ["a=1", "conv1", "\u{3164}a", "1e-3", "\u{00C9}=1"] {
            assert_eq!(csv_text(text), text, "{text:?}");
        }
    }
}
