//! The HTML report in a real browser (headless Chromium): the plots and the table render, the
//! table's script runs, and nothing is logged to the console. Ignored by default
//! (`cargo test -- --include-ignored` runs it; `.ci/run` installs Debian's chromium and does); the screenshot is kept as a CI artifact in
//! target/test-output/report.png.

use std::path::{Path, PathBuf};
use std::process::Command;

fn chromium() -> PathBuf {
    let path = std::env::var_os("CHROMIUM").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.exists(),
        "the browser test needs Chromium at {} (apt-get install chromium, or set CHROMIUM)",
        path.display()
    );
    path
}

fn headless(profile: &Path) -> Command {
    let mut c = Command::new(chromium());
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
    ]);
    c.arg(format!("--user-data-dir={}", profile.display()));
    c
}

#[test]
#[ignore = "needs Chromium; .ci/run installs it and runs this with --include-ignored"]
fn html_report_renders_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let demo = Command::new(env!("CARGO_BIN_EXE_layerwise"))
        .args(["demo", "--out-dir", "demo"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(demo.status.success(), "{}", String::from_utf8_lossy(&demo.stderr));
    let page = format!("file://{}", dir.path().join("demo/report.html").display());

    let dom = headless(&dir.path().join("profile-dom"))
        .args(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--dump-dom", &page])
        .output()
        .unwrap();
    assert!(dom.status.success(), "chromium failed: {}", String::from_utf8_lossy(&dom.stderr));
    let html = String::from_utf8_lossy(&dom.stdout);
    let log = String::from_utf8_lossy(&dom.stderr);
    // The script ran: it writes the row count.
    assert!(
        html.contains(r#"<span id="tensor-count">15 of 15 tensors</span>"#),
        "the table script did not run:\n{}",
        &html[html.len().saturating_sub(2000)..]
    );
    assert!(html.matches("<circle class=\"pt").count() >= 15, "the plots have their points");
    assert!(html.contains("id=\"neighbourhood-graph\"") && html.contains("encoder/ln/Pow"));
    let console: Vec<&str> = log.lines().filter(|l| l.contains("CONSOLE") || l.contains("Uncaught")).collect();
    assert!(console.is_empty(), "console messages: {console:?}");

    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-output");
    std::fs::create_dir_all(&out).unwrap();
    let shot = out.join("report.png");
    let _ = std::fs::remove_file(&shot);
    let status = headless(&dir.path().join("profile-shot"))
        .args(["--window-size=1280,2400", &format!("--screenshot={}", shot.display()), &page])
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 50_000, "screenshot too small: {} bytes", png.len());
}

/// In a notebook the report and the fix report stay legible.
/// Jupyter's own CSS right-aligns every table cell (`.jp-RenderedHTMLCommon td`); inside such a
/// cell container, as a notebook shows `_repr_html_`, the text columns of both stay left-aligned.
/// The screenshot is kept in target/test-output/notebook.png.
#[test]
#[ignore = "needs Chromium; .ci/run installs it and runs this with --include-ignored"]
fn report_and_fix_report_are_legible_in_a_notebook_cell() {
    let dir = tempfile::tempdir().unwrap();
    let demo = Command::new(env!("CARGO_BIN_EXE_layerwise"))
        .args(["demo", "--out-dir", "demo"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(demo.status.success(), "{}", String::from_utf8_lossy(&demo.stderr));
    let report = std::fs::read_to_string(dir.path().join("demo/report.html")).unwrap();
    let fix = layerwise_report::render_fix_html(
        &layerwise_report::read_fix_report(&dir.path().join("demo/fix.json")).unwrap(),
    );
    let page = format!(
        r#"<!DOCTYPE html><html><head><meta charset="utf-8"><style>.jp-RenderedHTMLCommon td,.jp-RenderedHTMLCommon th,.jp-RenderedHTMLCommon tr{{text-align:right}}</style></head><body>
<div class="jp-RenderedHTMLCommon" id="report"></div><div class="jp-RenderedHTMLCommon" id="fix"></div>
<script>
document.getElementById('report').innerHTML = {};
document.getElementById('fix').innerHTML = {};
var a = getComputedStyle(document.querySelector('#report #tensor-table tbody td:nth-child(2)')).textAlign;
var b = getComputedStyle(document.querySelector('#fix td')).textAlign;
document.body.setAttribute('data-align', a + ',' + b);
</script></body></html>"#,
        // As a JavaScript string: "</" written "<\/" so the report's own </script> cannot end ours.
        serde_json::to_string(&report).unwrap().replace("</", "<\\/"),
        serde_json::to_string(&fix).unwrap().replace("</", "<\\/")
    );
    let path = dir.path().join("notebook.html");
    std::fs::write(&path, page).unwrap();
    let url = format!("file://{}", path.display());
    let dom = headless(&dir.path().join("profile-nb"))
        .args(["--virtual-time-budget=3000", "--dump-dom", &url])
        .output()
        .unwrap();
    assert!(dom.status.success(), "chromium failed: {}", String::from_utf8_lossy(&dom.stderr));
    let html = String::from_utf8_lossy(&dom.stdout);
    let body = html.split("<body").nth(1).unwrap_or("");
    assert!(
        body.starts_with(r#" data-align="left,left""#),
        "a notebook's CSS moved the text columns (or the script failed): <body{}",
        &body[..80.min(body.len())]
    );
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-output");
    std::fs::create_dir_all(&out).unwrap();
    let shot = out.join("notebook.png");
    let _ = std::fs::remove_file(&shot);
    let status = headless(&dir.path().join("profile-nb-shot"))
        .args(["--window-size=1280,1600", &format!("--screenshot={}", shot.display()), &url])
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
}
