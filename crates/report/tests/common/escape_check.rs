//! What each escaping function of `layerwise_report::escape` promises, checked by a parser of its
//! medium: no control or bidi character on a terminal; no HTML, markup or extra table cell from
//! pulldown-cmark, and the text shown as written; no formula cell read back by the csv crate; one
//! shell word per argument that splits back to the argument. Shared by tests/escape_props.rs and
//! the fuzz target `render` (fuzz/fuzz_targets/render.rs).
#![allow(dead_code)]

use layerwise_report::escape::{
    csv_text, for_terminal, is_shown_escaped, markdown_cell_code, markdown_code, markdown_text, shell_quoted,
    shell_word, terminal, terminal_lines, trtexec_layer_refusal,
};
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

pub fn check(text: &str) {
    check_terminal(text);
    check_markdown(text);
    check_csv(text);
    check_shell(text);
}

pub fn check_terminal(text: &str) {
    let one = terminal(text);
    assert!(!one.chars().any(is_shown_escaped), "{text:?} -> {one:?}");
    if !text.chars().any(is_shown_escaped) {
        assert_eq!(one, text, "text with nothing to escape is unchanged");
    }
    let lines = terminal_lines(text);
    assert!(!lines.chars().any(|c| c != '\n' && is_shown_escaped(c)), "{text:?} -> {lines:?}");
    assert_eq!(lines.matches('\n').count(), text.matches('\n').count());
    let map: std::collections::BTreeMap<String, Vec<String>> = [(text.to_string(), vec![text.to_string()])].into();
    let shown = for_terminal(&map);
    for (k, v) in &shown {
        assert_eq!(*k, one);
        assert_eq!(v[0], one);
    }
}

/// The text of each block (paragraph, table cell) of `md`, checking that nothing but tables,
/// one list and paragraphs of text and code spans appear.
fn blocks(md: &str) -> Vec<String> {
    let mut texts = Vec::new();
    let mut current: Option<String> = None;
    for e in Parser::new_ext(md, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH) {
        match e {
            // A tight list's item holds its text without a paragraph.
            Event::Start(Tag::Paragraph | Tag::TableCell | Tag::Item) => current = Some(String::new()),
            Event::End(TagEnd::Paragraph | TagEnd::TableCell | TagEnd::Item) => {
                texts.push(current.take().expect("a block was open"))
            }
            Event::Start(Tag::Table(_) | Tag::TableHead | Tag::TableRow | Tag::List(None)) => {}
            Event::End(TagEnd::Table | TagEnd::TableHead | TagEnd::TableRow | TagEnd::List(false)) => {}
            Event::Text(t) | Event::Code(t) => {
                current.as_mut().unwrap_or_else(|| panic!("text outside a block in {md:?}")).push_str(&t)
            }
            other => panic!("{other:?} in {md:?}"),
        }
    }
    texts
}

pub fn check_markdown(text: &str) {
    let shown = terminal(text).into_owned();
    let cell_code = markdown_cell_code(text);
    let cell_text = markdown_text(text);
    let md = format!(
        "| a | b | c |\n|---|---|---|\n| {cell_code} | {cell_text} | c |\n\n- x {cell_text}\n\nx {}\n\nx {cell_text}\n\n{cell_text}\n",
        markdown_code(text)
    );
    let texts = blocks(&md);
    // An empty text leaves its line-start paragraph out, and `x ` is read as `x`.
    let after_x = if shown.is_empty() { "x".to_string() } else { format!("x {shown}") };
    let mut expected = vec![
        "a".to_string(),
        "b".into(),
        "c".into(),
        shown.clone(),
        shown.clone(),
        "c".into(),
        after_x.clone(),
        after_x.clone(),
        after_x,
    ];
    if !shown.is_empty() {
        expected.push(shown);
    }
    assert_eq!(texts, expected, "{text:?} as Markdown:\n{md}");
    check_github_markdown(&md, text);
}

/// `md` rendered as GitHub renders Markdown (GFM with its autolink extension, comrak): no link,
/// no image, no raw HTML; and outside code spans no `@` (a mention) and no `#` before a digit (an
/// issue link), which GitHub adds after rendering.
pub fn check_github_markdown(md: &str, text: &str) {
    let html = github_html(md);
    for tag in ["<a ", "<img", "<script", "<iframe"] {
        assert!(!html.contains(tag), "{text:?}: {tag} in GitHub's rendering of:\n{md}\n{html}");
    }
    let outside = outside_code(&html);
    assert!(!outside.contains('@') && !outside.contains("&#64;"), "{text:?}: an @ outside code in:\n{md}\n{html}");
    let issue_link =
        outside.char_indices().any(|(i, c)| c == '#' && outside[i + 1..].starts_with(|d: char| d.is_ascii_digit()));
    assert!(!issue_link, "{text:?}: #N outside code in:\n{md}\n{html}");
    // GitHub's own references, which no CommonMark renderer makes: `GH-12`, a commit's hex digits.
    let lower = outside.to_ascii_lowercase();
    let gh = lower.match_indices("gh-").any(|(i, _)| lower[i + 3..].starts_with(|d: char| d.is_ascii_digit()));
    assert!(!gh, "{text:?}: GH-N outside code in:\n{md}\n{html}");
    let commit = outside
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| (7..=40).contains(&w.len()) && w.chars().all(|c| c.is_ascii_hexdigit()));
    assert!(!commit, "{text:?}: a commit-like word outside code in:\n{md}\n{html}");
    // cmark and cmark-gfm open no code span with a fence of more than 80 backticks.
    let mut run = 0;
    let mut escaped = false;
    for c in md.chars() {
        run = if c == '`' && !escaped { run + 1 } else { 0 };
        assert!(run <= 80, "{text:?}: a fence of more than 80 backticks in:\n{md}");
        escaped = c == '\\' && !escaped;
    }
}

pub fn check_csv(text: &str) {
    let mut w = csv::Writer::from_writer(Vec::new());
    // A header first, as render_csv writes (a reader drops a byte-order mark that opens a file).
    w.write_record(["name", "error", "count"]).unwrap();
    w.write_record([csv_text(text).as_ref(), "-1.5e-3", "7"]).unwrap();
    let bytes = w.into_inner().unwrap();
    let mut r = csv::ReaderBuilder::new().has_headers(true).from_reader(bytes.as_slice());
    let row = r.records().next().expect("one row").unwrap();
    assert_eq!(row.len(), 3);
    let cell = &row[0];
    let visible = cell.trim_start_matches(|c: char| {
        c.is_whitespace() || matches!(c, '\u{FEFF}' | '\u{200B}' | '\u{200C}' | '\u{200D}' | '\u{2060}')
    });
    let formula = cell.starts_with(['\t', '\r'])
        || visible.starts_with(['=', '+', '-', '@', '\u{FF1D}', '\u{FF0B}', '\u{FF0D}', '\u{FF20}']);
    assert!(!formula, "{text:?} is a formula cell: {cell:?}");
    assert!(cell == text || cell.strip_prefix('\'') == Some(text), "{text:?} read back as {cell:?}");
    assert_eq!(row[1].parse::<f64>().ok(), Some(-1.5e-3), "numbers stay numbers");
}

pub fn check_shell(text: &str) {
    for word in [shell_word(text), shell_quoted(text)] {
        match word {
            Some(word) => {
                assert_eq!(
                    shell_words::split(&word).unwrap_or_else(|e| panic!("{text:?} -> {word:?}: {e}")),
                    vec![text.to_string()],
                    "{word:?}"
                );
                assert!(!word.chars().any(is_shown_escaped));
            }
            None => assert!(text.chars().any(|c| is_shown_escaped(c) || c == '\0'), "{text:?} refused"),
        }
    }
    if trtexec_layer_refusal(text).is_none() {
        let value = shell_quoted(&format!("{text}:fp32,b:fp32")).expect("an accepted layer name is a shell word");
        let words = shell_words::split(&value).unwrap();
        assert_eq!(words.len(), 1);
        let layers: Vec<&str> = words[0].split(',').collect();
        assert_eq!(layers, [format!("{text}:fp32").as_str(), "b:fp32"], "{text:?}");
        assert_eq!(layers[0].rsplit_once(':'), Some((text, "fp32")));
        assert!(!text.contains(':'));
    }
}

/// Rendered HTML without its `<code>` elements: where GitHub makes links and mentions.
pub fn outside_code(html: &str) -> String {
    let mut outside = String::new();
    let mut rest = html;
    while let Some(start) = rest.find("<code>") {
        outside.push_str(&rest[..start]);
        rest = rest[start..].split_once("</code>").map_or("", |(_, after)| after);
    }
    outside.push_str(rest);
    outside
}

/// `md` as GitHub renders Markdown: GFM with its tables, strikethrough and autolinks (comrak).
pub fn github_html(md: &str) -> String {
    let mut options = comrak::Options::default();
    options.extension.autolink = true;
    options.extension.table = true;
    options.extension.strikethrough = true;
    comrak::markdown_to_html(md, &options)
}
