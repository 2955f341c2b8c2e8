//! Every report format from one run, and again later from the saved JSON with `layerwise report`.

use crate::common;
use crate::common::{layerwise, text};

#[test]
fn all_formats_from_one_run_and_from_the_saved_report() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    common::save(&common::planted(common::Ending::ExpOverflow), &d.join("m.onnx"));
    let p = |n: &str| d.join(n).display().to_string();
    let run = layerwise(
        &[
            "bisect",
            &p("m.onnx"),
            "--json",
            &p("r.json"),
            "--html",
            &p("r.html"),
            "--markdown",
            &p("r.md"),
            "--csv",
            &p("r.csv"),
            "--model-explorer",
            &p("me.json"),
        ],
        d,
    );
    assert_eq!(run.status.code(), Some(1), "{}", text(&run));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("r.json")).unwrap()).unwrap();
    let tensors = report["tensors"].as_array().unwrap().len();

    let html = std::fs::read_to_string(d.join("r.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("DIVERGED"));
    for id in ["error-plot", "range-plot", "neighbourhood-graph", "value-histogram", "tensor-table", "tensor-filter"] {
        assert!(html.contains(&format!("id=\"{id}\"")), "missing #{id}");
    }
    assert!(html.contains("head/Exp") && html.contains("FP16 max 65504"));
    assert!(
        !html.contains("http://") && !html.contains("https://") && !html.contains("src=\""),
        "the HTML loads nothing from outside"
    );
    let table = &html[html.find("id=\"tensor-table\"").unwrap()..];
    assert_eq!(table.matches("<tr class=").count(), tensors, "one table row per tensor");

    let csv = std::fs::read_to_string(d.join("r.csv")).unwrap();
    assert_eq!(csv.lines().count(), tensors + 1, "a header and one row per tensor");
    assert!(csv.lines().next().unwrap().starts_with("topo_index,tensor,node,op_type,shape"));
    assert!(csv.contains(",exp,head/Exp,Exp,1x256,") && csv.contains(",inf,"), "{csv}");

    let md = std::fs::read_to_string(d.join("r.md")).unwrap();
    assert!(md.contains("❌ DIVERGED") && md.contains("**First divergent layer:** `head/Exp` (Exp)"), "{md}");
    assert_eq!(md.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| #")).count(), 10, "top-10 table:\n{md}");

    let me: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("me.json")).unwrap()).unwrap();
    assert_eq!(me["results"].as_object().unwrap().len(), tensors, "one entry per node (one output each)");
    assert_eq!(me["results"]["head/Exp"]["value"], 1e30, "keyed by node (Model Explorer's ids), inf errors are 1e30");
    assert_eq!(me["thresholds"].as_array().unwrap().len(), 4);

    // The same files from the saved JSON.
    let later = layerwise(
        &[
            "report",
            &p("r.json"),
            "--html",
            &p("l.html"),
            "--markdown",
            &p("l.md"),
            "--csv",
            &p("l.csv"),
            "--model-explorer",
            &p("l.json"),
        ],
        d,
    );
    assert_eq!(later.status.code(), Some(0), "{}", text(&later));
    for (a, b) in [("r.html", "l.html"), ("r.md", "l.md"), ("r.csv", "l.csv"), ("me.json", "l.json")] {
        let (x, y) = (std::fs::read_to_string(d.join(a)).unwrap(), std::fs::read_to_string(d.join(b)).unwrap());
        let at = x.chars().zip(y.chars()).position(|(p, q)| p != q).unwrap_or(x.len().min(y.len()));
        assert!(
            x == y,
            "{a} and {b} differ at char {at}: {:?} vs {:?}",
            x.chars().skip(at.saturating_sub(40)).take(80).collect::<String>(),
            y.chars().skip(at.saturating_sub(40)).take(80).collect::<String>()
        );
    }
    // Bad input to `report`.
    std::fs::write(d.join("not.json"), "{ nope").unwrap();
    let bad = layerwise(&["report", &p("not.json"), "--html", &p("x.html")], d);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad).contains("is not JSON"));
    let other = layerwise(&["report", &p("me.json"), "--html", &p("x.html")], d);
    assert_eq!(other.status.code(), Some(2));
    assert!(text(&other).contains("is not a layerwise report"));
    let nothing = layerwise(&["report", &p("r.json")], d);
    assert_eq!(nothing.status.code(), Some(2));
    assert!(!d.join("x.html").exists());
}

/// Without `alone` values (`--no-isolate`) the blame chain's heading ends cleanly: it printed
/// "...first divergent layer);:" before.
#[test]
fn the_blame_chain_heading_without_isolation_has_no_stray_punctuation() {
    let dir = tempfile::tempdir().unwrap();
    common::save(&common::planted(common::Ending::ExpOverflow), &dir.path().join("m.onnx"));
    let out = layerwise(&["bisect", "m.onnx", "--no-isolate"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("\nBlame chain (worst output back to the first divergent layer):\n"), "{}", text(&out));
    assert!(!text(&out).contains(");:"), "{}", text(&out));
}
