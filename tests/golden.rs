//! Golden files (issue "one typed report, one parsed spec"): every format `bisect` writes (JSON,
//! terminal, HTML, Markdown, CSV, Model Explorer) and `fix`'s JSON and terminal output, on the
//! demo and on the models the tests build, byte for byte as committed under tests/golden/, with
//! `run_info` and wall-clock times left out. A redesign must keep them; a change of behaviour on
//! purpose updates them: `LAYERWISE_BLESS=1 cargo test --test tests golden::` rewrites the files, and the
//! diff is reviewed like code.

use std::path::{Path, PathBuf};

use crate::common;
use crate::common::{layerwise, text};
use layerwise_model::onnx::ModelProto;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn models() -> Vec<(&'static str, ModelProto)> {
    let mut all: Vec<(&'static str, ModelProto)> = common::breaking_models()
        .into_iter()
        .map(|(label, m)| {
            (
                match label {
                    "demo" => "demo",
                    "planted exp" => "planted_exp",
                    "planted softmax" => "planted_softmax",
                    "planted layernorm" => "planted_layernorm",
                    "bn overflow" => "bn_overflow",
                    other => panic!("name a golden folder for '{other}'"),
                },
                m,
            )
        })
        .collect();
    all.push(("healthy", common::planted(common::Ending::Healthy)));
    all.push(("convertible", common::convertible()));
    all
}

/// Wall-clock times ("1.23 s", "45 ms", "0.8s") replaced by `<time>`: they are the only part of
/// a run's output that is not fixed by its inputs and seed.
fn without_times(text: &str) -> String {
    let re = regex_lite::Regex::new(r"\b\d+(\.\d+)?\s?(ms|s|µs)\b").unwrap();
    re.replace_all(text, "<time>").into_owned()
}

/// A JSON document with `run_info` (versions, timings, host) removed, pretty-printed.
fn json_without_run_info(path: &Path) -> String {
    let mut v = common::json(path);
    if let Some(o) = v.as_object_mut() {
        o.remove("run_info");
    }
    serde_json::to_string_pretty(&v).unwrap() + "\n"
}

/// The HTML report embeds its JSON: `run_info` in it is replaced by the same placeholder.
fn html_without_run_info(html: &str) -> String {
    let re = regex_lite::Regex::new(r#""run_info":\{[^{}]*(\{[^{}]*\}[^{}]*)*\}"#).unwrap();
    without_times(&re.replace_all(html, r#""run_info":"<run_info>""#))
}

/// Where ONNX Runtime's library was found (layerwise's cache, an installed Python package, a
/// path given) depends on the machine, not on the run: it becomes `<library>`.
fn without_library_path(text: &str) -> String {
    let re = regex_lite::Regex::new(r"ONNX Runtime from [^\s]+ \(found by [^)]*\)").unwrap();
    re.replace_all(text, "ONNX Runtime from <library>").into_owned()
}

/// Compares `actual` with the golden file `name` of `model`, or writes it when blessing.
fn check(model: &str, name: &str, actual: &str, failures: &mut Vec<String>) {
    let actual = &without_library_path(actual);
    let path = golden_dir().join(model).join(name);
    if std::env::var_os("LAYERWISE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("{}: {e} (write it with LAYERWISE_BLESS=1 cargo test --test tests golden::)", path.display())
    });
    let (golden_lines, now_lines) = (expected.lines().count(), actual.lines().count());
    let differing = expected.lines().zip(actual.lines()).position(|(a, b)| !same_but_for_float_noise(a, b));
    if differing.is_some() || golden_lines != now_lines {
        let line = differing.unwrap_or(golden_lines.min(now_lines));
        failures.push(format!(
            "{}: differs from line {}:\n  golden: {:?}\n  now:    {:?}",
            path.display(),
            line + 1,
            expected.lines().nth(line).unwrap_or("<end>"),
            actual.lines().nth(line).unwrap_or("<end>")
        ));
    }
}

/// The numbers in a line, and the text between them.
fn numbers_and_text(line: &str) -> (Vec<f64>, String) {
    let (mut numbers, mut text) = (Vec::new(), String::new());
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            text.push(b[i] as char);
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
            i += 1;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
        }
        if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
            let mut j = i + 1;
            if j < b.len() && (b[j] == b'-' || b[j] == b'+') {
                j += 1;
            }
            if j < b.len() && b[j].is_ascii_digit() {
                i = j;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
        }
        numbers.push(line[start..i].parse().unwrap_or(f64::NAN));
        text.push('#');
    }
    (numbers, text)
}

/// Two lines that say the same, where numbers may differ in float32's last bits: ONNX Runtime's
/// CPU kernels differ by instruction set (a Softmax's error gave 0.3146649313292048 on the CPU that
/// blessed these files and 0.3146648934839726 on an AMD EPYC with AVX2 only; the noise floor
/// 2.134076e-3 and 2.134004e-3). Every number within 1e-4 of the golden one, relative: a rounded
/// figure one digit off (0.3147 against 0.3148) and a count one off (108 against 109) still differ.
fn same_but_for_float_noise(golden: &str, now: &str) -> bool {
    if golden == now {
        return true;
    }
    let ((a, ta), (b, tb)) = (numbers_and_text(golden), numbers_and_text(now));
    ta == tb && a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-4 * x.abs().max(y.abs()))
}

#[test]
fn golden_lines_differ_only_by_float_noise() {
    assert!(same_but_for_float_noise("\"a\": 0.3146649313292048,", "\"a\": 0.3146648934839726,"));
    assert!(same_but_for_float_noise("x 1.469e-4 y", "x 1.469e-4 y"));
    assert!(!same_but_for_float_noise("rel L2 0.3147", "rel L2 0.3148"));
    assert!(!same_but_for_float_noise("108 of 252", "109 of 252"));
    assert!(!same_but_for_float_noise("'mm1' 3.2e-1", "'mm2' 3.2e-1"));
    assert!(!same_but_for_float_noise("FIXED 0.5", "NOT FIXED 0.5"));
}

#[test]
fn bisect_and_fix_outputs_match_the_golden_files() {
    let mut failures = Vec::new();
    for (name, proto) in models() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        common::save(&proto, &d.join("m.onnx"));
        let bisect = layerwise(
            &[
                "bisect",
                "m.onnx",
                "--json",
                "r.json",
                "--html",
                "r.html",
                "--markdown",
                "r.md",
                "--csv",
                "r.csv",
                "--model-explorer",
                "me.json",
            ],
            d,
        );
        assert!(matches!(bisect.status.code(), Some(0 | 1)), "{name}: {}", text(&bisect));
        check(
            name,
            "bisect.txt",
            &format!("exit {:?}\n{}", bisect.status.code(), without_times(&text(&bisect))),
            &mut failures,
        );
        check(name, "bisect.json", &json_without_run_info(&d.join("r.json")), &mut failures);
        // The typed report is the document model: the JSON reads back into it and writes out
        // unchanged, field for field.
        let written = common::json(&d.join("r.json"));
        let typed: layerwise_report::Report = serde_json::from_value(written.clone())
            .unwrap_or_else(|e| panic!("{name}: the JSON report does not read back into Report: {e}"));
        assert_eq!(serde_json::to_value(&typed).unwrap(), written, "{name}: Report round trip");
        check(
            name,
            "bisect.html",
            &html_without_run_info(&std::fs::read_to_string(d.join("r.html")).unwrap()),
            &mut failures,
        );
        check(name, "bisect.md", &without_times(&std::fs::read_to_string(d.join("r.md")).unwrap()), &mut failures);
        check(name, "bisect.csv", &std::fs::read_to_string(d.join("r.csv")).unwrap(), &mut failures);
        check(name, "model-explorer.json", &std::fs::read_to_string(d.join("me.json")).unwrap(), &mut failures);

        let fix = layerwise(&["fix", "m.onnx", "-o", "fixed.onnx", "--json", "fix.json"], d);
        assert!(matches!(fix.status.code(), Some(0 | 1)), "{name}: {}", text(&fix));
        check(name, "fix.txt", &format!("exit {:?}\n{}", fix.status.code(), without_times(&text(&fix))), &mut failures);
        check(name, "fix.json", &json_without_run_info(&d.join("fix.json")), &mut failures);
        let written = common::json(&d.join("fix.json"));
        let typed = layerwise_report::read_fix_report(&d.join("fix.json"))
            .unwrap_or_else(|e| panic!("{name}: the fix report does not read back into FixReport: {e}"));
        assert_eq!(serde_json::to_value(&typed).unwrap(), written, "{name}: FixReport round trip");
    }
    assert!(failures.is_empty(), "{} golden files differ:\n{}", failures.len(), failures.join("\n"));
}
