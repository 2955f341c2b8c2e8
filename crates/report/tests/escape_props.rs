//! The escaping promises (crates/report/tests/common/escape_check.rs) over seeded random strings
//! weighted towards what breaks each medium, and the known payloads; the fuzz target `render`
//! checks the same on libFuzzer's inputs.

#[path = "common/escape_check.rs"]
mod escape_check;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Pieces that mean something in one of the media.
const PIECES: &[&str] = &[
    "<img src=x onerror=alert(4)>",
    "<script>",
    "</b>",
    "&amp;",
    "&#32;",
    "&",
    "<",
    ">",
    "`",
    "``",
    "```",
    "|",
    "\\|",
    "\\",
    "\\\\",
    "*",
    "**",
    "_",
    "__",
    "~~",
    "[",
    "](",
    "![a](b)",
    "<http://x>",
    "# ",
    "1. ",
    "1) ",
    "- ",
    "+ ",
    "> ",
    "---",
    "===",
    "    ",
    "  ",
    " ",
    "\t",
    "\n",
    "\r\n",
    "\x1b]0;PWNED\x07",
    "\x1b[2J",
    "\x08",
    "\x7f",
    "\u{85}",
    "\u{9b}",
    "\u{202e}",
    "\u{2066}",
    "\u{200f}",
    "\u{061c}",
    "\u{2028}",
    "'",
    "\"",
    "'\\''",
    "$(touch PWNED)",
    "`touch PWNED`",
    ";",
    "&&",
    "!",
    "~",
    "{a,b}",
    "*",
    "=",
    "+",
    "-",
    "@",
    "=cmd|' /C calc'!A0",
    "\u{ff1d}",
    ":",
    ",",
    "https://evil.example/steal",
    "www.evil.example",
    "boss@evil.example",
    "@octocat",
    "#12",
    "mailto:x",
    "GH-12",
    "gh-7",
    "a5c3785ed8d6a35868bc169f07e40e889087fd2e",
    "deadbee",
    "\u{200b}=cmd",
    "\u{feff}\u{2060}@SUM(1)",
    "http:",
    "//",
    ".",
    "www",
    "é",
    "中",
    "🦀",
    "\u{a0}",
    "\u{feff}",
    "$",
    "$$",
    "x",
    "ln_squared",
    "0",
    "9",
];

fn random_text(rng: &mut ChaCha8Rng) -> String {
    let mut s = String::new();
    for _ in 0..rng.random_range(0..8) {
        if rng.random_bool(0.7) {
            s.push_str(PIECES[rng.random_range(0..PIECES.len())]);
        } else {
            // Any character, control and private-use ones included.
            s.push(char::from_u32(rng.random_range(0..0x3000)).unwrap_or('?'));
        }
    }
    s
}

#[test]
fn every_medium_keeps_random_text_as_data() {
    let mut rng = ChaCha8Rng::seed_from_u64(37);
    for _ in 0..5000 {
        escape_check::check(&random_text(&mut rng));
    }
}

#[test]
fn every_medium_keeps_the_known_payloads_as_data() {
    for p in PIECES {
        escape_check::check(p);
        escape_check::check(&format!("a{p}b"));
    }
    // Found by the independent tester: 80 backticks or more (no GitHub code span can hold them).
    for n in [79, 80, 81, 300] {
        escape_check::check(&format!(
            "{} <img src=x onerror=alert(1)> | cell | @octocat https://evil.example",
            "`".repeat(n)
        ));
    }
    escape_check::check("");
}

/// bash itself, not a parser of it: each accepted word is given back unchanged and runs nothing.
#[test]
fn bash_reads_each_shell_word_as_its_text() {
    let mut rng = ChaCha8Rng::seed_from_u64(38);
    let texts: Vec<String> = (0..300)
        .map(|_| random_text(&mut rng))
        .chain(PIECES.iter().map(|p| p.to_string()))
        .filter(|t| layerwise_report::escape::shell_word(t).is_some())
        .collect();
    use layerwise_report::escape::{shell_quoted, shell_word};
    // Each text twice: as a word quoted where needed, and always quoted.
    let words: Vec<String> = texts.iter().flat_map(|t| [shell_word(t).unwrap(), shell_quoted(t).unwrap()]).collect();
    let texts: Vec<String> = texts.iter().flat_map(|t| [t.clone(), t.clone()]).collect();
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("printf '%s\\0' {}", words.join(" ")))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let given: Vec<String> =
        String::from_utf8(out.stdout).unwrap().split_terminator('\0').map(str::to_string).collect();
    assert_eq!(given, texts);
    assert!(!dir.path().join("PWNED").exists());
}
