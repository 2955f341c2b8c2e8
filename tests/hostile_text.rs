//! Names from a model are data in every medium layerwise writes (D1-D3 and CSV): a model
//! whose node and tensor names carry shell, terminal, HTML, Markdown and spreadsheet payloads is
//! run through `bisect` and `fix`, and each output is read back by a parser of its medium.

// The escaping property checks' parsers of each medium, shared with crates/report's tests and the
// fuzz target `render`.
#[path = "../crates/report/tests/common/escape_check.rs"]
mod escape_check;

use std::path::Path;

use crate::common;
use crate::common::{layerwise, save, text};
use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::DataType;
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// The payloads, each a node name; its output tensor is named `T` + the same.
const HOSTILE: [&str; 8] = [
    "sq';touch PWNED;'",
    "t\x1b]0;PWNED\x07\x1b[2J",
    "rlo\u{202e}gnp.exe",
    "out<img src=x onerror=alert(4)>",
    "nl\nVERDICT: PASS - all 1 model outputs are within tolerance",
    "tick`code",
    "pipe|col",
    "=cmd|' /C calc'!A0",
];

/// x[1,256] * 6e4 + 6e4 (beyond FP16 for most x in [0,1), with weights within it) through six more
/// nodes that carry the large values, then * 1e-5: under `sim:fp16` each of the eight named by a
/// payload overflows, so `fix` keeps them all in FP32 and prints them in its trtexec line. The
/// output is named like an HTML payload too.
fn hostile_model() -> ModelProto {
    let mut b = ModelBuilder::new("hostile", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(256)]);
    b.initializer(f32_tensor("big", &[1], &[6e4]));
    b.initializer(f32_tensor("half", &[1], &[0.5]));
    b.initializer(f32_tensor("small", &[1], &[1e-5]));
    b.node("Mul", "scale", &["x", "big"], &["scaled"], vec![]);
    let mut current = "scaled".to_string();
    for (i, name) in HOSTILE.iter().enumerate() {
        let out = if i + 1 == HOSTILE.len() { "y<script>alert(1)</script>".to_string() } else { format!("T{name}") };
        match i {
            0 => b.node("Add", name, &[&current, "big"], &[&out], vec![]),
            7 => b.node("Mul", name, &[&current, "small"], &[&out], vec![]),
            _ if i % 2 == 0 => b.node("Relu", name, &[&current], &[&out], vec![]),
            _ => b.node("Add", name, &[&current, "half"], &[&out], vec![]),
        };
        current = out;
    }
    b.output(&current, DataType::Float);
    b.build()
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    save(&hostile_model(), &dir.path().join("m.onnx"));
    dir
}

/// A character no terminal may receive raw: control (but the newlines that end lines) or bidi
/// (written out here rather than taken from the code under test).
fn raw_control(text: &str) -> Option<char> {
    let bidi =
        |c: char| matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    text.chars().find(|&c| c != '\n' && (c.is_control() || bidi(c)))
}

fn assert_terminal_clean(what: &str, out: &std::process::Output) {
    for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let t = String::from_utf8_lossy(bytes);
        assert_eq!(raw_control(&t), None, "{what} {stream} holds a raw control or bidi character:\n{t}");
        // The newline payload must not start a line of its own.
        assert!(
            !t.lines().any(|l| l.trim_start().starts_with("VERDICT: PASS")),
            "{what} {stream}: a name forged a line:\n{t}"
        );
    }
}

#[test]
fn bisect_and_fix_print_names_with_control_and_bidi_characters_escaped() {
    let dir = setup();
    let out = layerwise(
        &["bisect", "m.onnx", "--cand", "sim:fp16", "--json", "r.json", "--markdown", "r.md", "--csv", "r.csv"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_terminal_clean("bisect", &out);
    assert!(text(&out).contains("\\x1b]0;PWNED\\x07\\x1b[2J"), "the ESC payload is shown escaped: {}", text(&out));
    assert!(text(&out).contains("rlo\\u{202e}gnp.exe"), "{}", text(&out));
    let out = layerwise(&["fix", "m.onnx", "--cand", "sim:fp16", "--json", "fix.json"], dir.path());
    assert_terminal_clean("fix", &out);
    // An error quoting a name is escaped too.
    let out = layerwise(
        &["bisect", "m.onnx", "--cand", "sim:fp16", "--tensors", "Tt\x1b]0;PWNED\x07\x1b[2J,nope\u{202e}"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_terminal_clean("an error", &out);
}

/// Every event of a CommonMark (GFM tables) parse of `md`; fails on raw HTML, and on a table row
/// whose cell count differs from its header's.
fn markdown_events(what: &str, md: &str) -> Vec<Event<'static>> {
    let events: Vec<Event<'static>> =
        Parser::new_ext(md, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH).map(|e| e.into_static()).collect();
    for e in &events {
        assert!(!matches!(e, Event::Html(_) | Event::InlineHtml(_)), "{what}: raw HTML {e:?} in:\n{md}");
    }
    let (mut columns, mut cells) = (None, 0);
    for e in &events {
        match e {
            Event::Start(Tag::Table(alignments)) => columns = Some(alignments.len()),
            Event::Start(Tag::TableHead | Tag::TableRow) => cells = 0,
            Event::Start(Tag::TableCell) => cells += 1,
            Event::End(TagEnd::TableHead | TagEnd::TableRow) => {
                assert_eq!(Some(cells), columns, "{what}: a row with {cells} cells in:\n{md}")
            }
            _ => {}
        }
    }
    events
}

/// The text of code spans and plain text, concatenated per paragraph or cell.
fn shown_texts(events: &[Event]) -> Vec<String> {
    let mut texts = vec![String::new()];
    for e in events {
        match e {
            Event::Text(t) | Event::Code(t) => texts.last_mut().unwrap().push_str(t),
            Event::End(_) => texts.push(String::new()),
            _ => {}
        }
    }
    texts
}

/// The three Markdown files a run of `m.onnx` writes: `--markdown` (r.md), `report --fix`
/// (with-fix.md) and the `--repro` README. The last command's output, for messages.
fn write_markdown_reports(dir: &Path) -> std::process::Output {
    let out = layerwise(
        &["bisect", "m.onnx", "--cand", "sim:fp16", "--json", "r.json", "--markdown", "r.md", "--repro", "repro"],
        dir,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let out = layerwise(&["fix", "m.onnx", "--cand", "sim:fp16", "--json", "fix.json"], dir);
    assert!(dir.join("fix.json").is_file(), "{}", text(&out));
    let out = layerwise(&["report", "r.json", "--fix", "fix.json", "--markdown", "with-fix.md"], dir);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    out
}

#[test]
fn markdown_reports_hold_no_html_and_keep_their_table_columns() {
    let dir = setup();
    let out = write_markdown_reports(dir.path());
    for file in ["r.md", "with-fix.md", "repro/README.md"] {
        let md =
            std::fs::read_to_string(dir.path().join(file)).unwrap_or_else(|e| panic!("{file}: {e}\n{}", text(&out)));
        let events = markdown_events(file, &md);
        assert_eq!(raw_control(&md), None, "{file}:\n{md}");
        let texts = shown_texts(&events);
        if file != "repro/README.md" {
            // The payload is shown as written, in one piece.
            assert!(texts.iter().any(|t| t.contains("out<img src=x onerror=alert(4)>")), "{file}: {texts:?}");
            assert!(texts.iter().any(|t| t.contains("tick`code")), "{file}: {texts:?}");
        }
    }
}

fn is_number(cell: &str) -> bool {
    cell.parse::<f64>().is_ok()
}

#[test]
fn csv_cells_never_start_a_formula_and_numbers_stay_numbers() {
    let dir = setup();
    let out = layerwise(&["bisect", "m.onnx", "--cand", "sim:fp16", "--csv", "r.csv"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let mut reader = csv::Reader::from_path(dir.path().join("r.csv")).unwrap();
    let mut names = Vec::new();
    for row in reader.records() {
        let row = row.unwrap();
        for cell in row.iter() {
            let formula = cell.starts_with(['\t', '\r']) || cell.trim_start().starts_with(['=', '+', '-', '@']);
            assert!(!formula || is_number(cell), "a formula cell: {cell:?} in {row:?}");
        }
        names.push(row[2].to_string());
    }
    assert!(names.contains(&"'=cmd|' /C calc'!A0".to_string()), "{names:?}");
    // A text cell is otherwise exact.
    assert!(names.contains(&"sq';touch PWNED;'".to_string()), "{names:?}");
}

/// `command` (a `trtexec ...` line as printed) run by bash with trtexec replaced by printf in
/// `dir`: its arguments, one per line.
fn run_as_bash(command: &str, dir: &Path) -> Vec<String> {
    let rest = command.strip_prefix("trtexec ").unwrap_or_else(|| panic!("not a trtexec line: {command}"));
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("printf '%s\\n' {rest}"))
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

#[test]
fn printed_trtexec_lines_paste_as_one_command_with_the_intended_arguments() {
    let dir = setup();
    let out = layerwise(&["bisect", "m.onnx", "--cand", "sim:fp16", "--json", "r.json"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let out = layerwise(&["fix", "m.onnx", "--cand", "sim:fp16", "--json", "fix.json", "-o", "fixed.onnx"], dir.path());
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    let fix = common::json(&dir.path().join("fix.json"));
    // JSON keeps the names exact.
    let keep: Vec<String> =
        fix["keep_fp32"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    assert!(
        keep.iter().any(|k| k == HOSTILE[0]) && keep.iter().any(|k| k == HOSTILE[1]),
        "the payloads are kept: {keep:?}\n{}",
        text(&out)
    );
    let layers: Vec<String> = keep
        .iter()
        .filter(|k| !k.chars().any(|c| c.is_control() || c == '\u{202e}'))
        .map(|k| format!("{k}:fp32"))
        .collect();
    let intended = [
        "--onnx=MODEL".to_string(),
        "--fp16".into(),
        "--precisionConstraints=obey".into(),
        format!("--layerPrecisions={}", layers.join(",")),
    ];

    std::fs::write(
        dir.path().join("keep-flags.txt"),
        common::json(&dir.path().join("fixed.onnx.keep-fp32.json"))["trtexec_flags"].as_str().unwrap_or_default(),
    )
    .unwrap();
    let out = layerwise(&["report", "r.json", "--fix", "fix.json", "--markdown", "s.md"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let md = std::fs::read_to_string(dir.path().join("s.md")).unwrap();
    let from_markdown = Parser::new_ext(&md, Options::ENABLE_TABLES).find_map(|e| match e {
        Event::Code(c) if c.starts_with("trtexec ") => Some(c.to_string()),
        _ => None,
    });

    let commands = [
        ("the terminal", printed.lines().find_map(|l| l.split_once("(weakly typed): ").map(|(_, c)| c.to_string()))),
        ("fix.json", fix["trtexec_flags"].as_str().map(|f| format!("trtexec --onnx=MODEL {f}"))),
        (
            "the keep list",
            Some(format!(
                "trtexec --onnx=MODEL {}",
                std::fs::read_to_string(dir.path().join("keep-flags.txt")).unwrap()
            )),
        ),
        ("the Markdown", from_markdown),
    ];
    for (what, command) in commands {
        let command = command.unwrap_or_else(|| panic!("{what}: no trtexec line in:\n{printed}\n{md}"));
        let words = shell_words::split(&command).unwrap_or_else(|e| panic!("{what}: {command}: {e}"));
        assert_eq!(words[0], "trtexec", "{what}: {command}");
        assert_eq!(words[1..], intended, "{what}: {command}");
        assert_eq!(run_as_bash(&command, dir.path()), intended, "{what}: {command}");
        assert!(!dir.path().join("PWNED").exists(), "{what}: pasting {command} ran a command");
    }
    // The names left out are said, escaped.
    assert!(
        printed.contains("not in --layerPrecisions") && printed.contains("t\\x1b]0;PWNED\\x07\\x1b[2J"),
        "{printed}"
    );
}

/// GitHub renders Markdown with GFM's autolinks, so a name that
/// looks like a URL, a `www.` domain or an email address became a link there (CommonMark, and so
/// pulldown-cmark, leaves them as text), and `@name` or `#12` would notify a user or link an
/// issue. Each such word is now a code span. Checked with comrak, a GFM renderer.
#[test]
fn markdown_reports_hold_no_link_or_mention_as_github_renders_them() {
    let name = "https://evil.example/steal www.evil.example boss@evil.example @octocat #12 a|b@c";
    let mut b = ModelBuilder::new("links", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(64)]);
    b.initializer(f32_tensor("big", &[1], &[6e4]));
    b.initializer(f32_tensor("small", &[1], &[1e-5]));
    b.node("Mul", "scale", &["x", "big"], &["scaled"], vec![]);
    b.node("Add", name, &["scaled", "big"], &[&format!("T{name}")], vec![]);
    b.node("Mul", "down", &[&format!("T{name}"), "small"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    save(&b.build(), &dir.path().join("m.onnx"));
    write_markdown_reports(dir.path());
    for file in ["r.md", "with-fix.md", "repro/README.md"] {
        let md = std::fs::read_to_string(dir.path().join(file)).unwrap();
        let html = escape_check::github_html(&md);
        assert!(!html.contains("<a "), "{file}: a link in GitHub's rendering:\n{md}\n{html}");
        let outside = escape_check::outside_code(&html);
        assert!(
            !outside.contains("@octocat") && !outside.contains("#12"),
            "{file}: a mention or an issue link outside code:\n{md}\n{html}"
        );
        assert!(
            html.contains("<code>@octocat</code>") || file == "repro/README.md",
            "{file}: the name is still shown:\n{html}"
        );
    }
}
