//! The other report formats, all rendered from the JSON report: Markdown for pull requests, CSV
//! with one row per tensor, and node data for Google's Model Explorer.

use std::fmt::Write;

use serde_json::{json, Value};

use crate::html::{error_of, fmt, num, s};

/// Markdown escaping for table cells.
fn md(text: &str) -> String {
    text.replace('|', "\\|").replace('`', "'")
}

/// A short summary for a pull request or issue: verdict, first divergent layer, chain, the ten
/// worst tensors, and the fix if one is given (a `layerwise.fix/1` document).
pub fn render_markdown(report: &Value, fix: Option<&Value>) -> String {
    let v = &report["verdict"];
    let mut m = String::new();
    let status = if s(&v["status"]) == "pass" { "✅ PASS" } else { "❌ DIVERGED" };
    let _ = writeln!(m, "## layerwise: {status}\n");
    let _ = writeln!(m, "`{}` — reference `{}`, candidate `{}`\n", md(s(&report["model"]["path"])), md(s(&report["ref"]["spec"])), md(s(&report["cand"]["spec"])));
    let _ = writeln!(m, "{}\n", md(s(&v["summary"])));
    if let Some(conclusions) = v["conclusions"].as_array().filter(|c| !c.is_empty()) {
        for c in conclusions {
            let _ = writeln!(m, "- {}", md(s(c)));
        }
        m.push('\n');
    }
    let fd = &v["first_divergent"];
    if fd.is_object() {
        let _ = writeln!(m, "**First divergent layer:** `{}` ({}) — tensor `{}`, relative L2 error {} → {}  ", md(s(&fd["node"])), md(s(&fd["op_type"])), md(s(&fd["tensor"])), crate::html::input_error_text(&fd["input_error"]), fmt(num(&fd["output_error"])));
        let _ = writeln!(m, "**Cause:** {} — {}\n", s(&fd["cause"]["kind"]), md(s(&fd["cause"]["detail"])));
    }
    if let Some(chain) = v["chain"].as_array().filter(|c| !c.is_empty()) {
        let steps: Vec<String> = chain.iter().map(|st| format!("`{}` ({}, {})", md(s(&st["tensor"])), md(s(&st["op_type"])), fmt(num(&st["error"])))).collect();
        let _ = writeln!(m, "**Blame chain** (worst output → first divergent): {}\n", steps.join(" ← "));
    }
    let mut worst: Vec<&Value> = report["tensors"].as_array().map(|t| t.iter().filter(|t| !t["constant_like"].as_bool().unwrap_or(false)).collect()).unwrap_or_default();
    worst.sort_by(|a, b| error_of(b).total_cmp(&error_of(a)));
    if !worst.is_empty() {
        let _ = writeln!(m, "| # | tensor | op | rel L2 | max abs | cosine | pass |\n|---|---|---|---|---|---|---|");
        for t in worst.iter().take(10) {
            let _ = writeln!(
                m,
                "| {} | `{}` | {} | {} | {} | {} | {} |",
                t["topo_index"],
                md(s(&t["name"])),
                md(s(&t["op_type"])),
                fmt(error_of(t)),
                fmt(num(&t["metrics"]["max_abs_err"])),
                fmt(num(&t["metrics"]["cosine"])),
                if t["pass"].as_bool() == Some(true) { "yes" } else { "**no**" }
            );
        }
        m.push('\n');
    }
    if let Some(fix) = fix {
        let _ = writeln!(m, "**Fix ({}):** {}  ", s(&fix["status"]), md(s(&fix["summary"])));
        if let Some(keep) = fix["keep_fp32"].as_array().filter(|k| !k.is_empty()) {
            let names: Vec<String> = keep.iter().map(|k| format!("`{}`", md(s(k)))).collect();
            let _ = writeln!(m, "Keep in FP32: {}  ", names.join(", "));
            let _ = writeln!(m, "TensorRT 10: `trtexec --onnx=MODEL {}`", s(&fix["trtexec_flags"]));
        }
        m.push('\n');
    }
    m
}

/// One row per compared tensor with every metric, in topological order.
pub fn render_csv(report: &Value) -> Vec<u8> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let metrics = [
        "numel", "max_abs_err", "mean_abs_err", "max_rel_err", "rel_l2_err", "cosine", "snr_db", "ref_nan", "ref_inf", "cand_nan",
        "cand_inf", "nonfinite_mismatch", "ref_max_abs", "ref_fp16_overflow", "ref_fp16_subnormal_share", "violations", "worst_index",
    ];
    let mut header = vec!["topo_index", "tensor", "node", "op_type", "shape", "ref_dtype", "cand_dtype", "is_output", "constant_like", "pass", "mismatch"];
    header.extend(metrics);
    w.write_record(&header).expect("csv to memory");
    for t in report["tensors"].as_array().into_iter().flatten() {
        let shape: Vec<String> = t["shape"].as_array().map(|a| a.iter().map(|d| d.to_string()).collect()).unwrap_or_default();
        let mut row = vec![
            t["topo_index"].to_string(),
            s(&t["name"]).to_string(),
            s(&t["node"]).to_string(),
            s(&t["op_type"]).to_string(),
            shape.join("x"),
            s(&t["ref_dtype"]).to_string(),
            s(&t["cand_dtype"]).to_string(),
            t["is_output"].to_string(),
            t["constant_like"].to_string(),
            t["pass"].to_string(),
            s(&t["mismatch"]).to_string(),
        ];
        for key in metrics {
            let v = &t["metrics"][key];
            row.push(match v {
                Value::String(x) => x.clone(),
                other => other.to_string(),
            });
        }
        w.write_record(&row).expect("csv to memory");
    }
    w.into_inner().expect("csv to memory")
}

/// Per-node error as Model Explorer node data (its `GraphNodeData` JSON: `results` keyed by
/// output tensor name, each `{value}`, plus colour `thresholds`). The value is the relative L2
/// error of the node's output; inf/NaN errors become 1e30 (JSON has no inf).
pub fn render_model_explorer(report: &Value) -> Value {
    // Keyed by the node ids Model Explorer's ONNX adapter gives (node names, with its own names for
    // unnamed and duplicate nodes and If branches), each node's worst output error.
    let mut results = serde_json::Map::new();
    for t in report["tensors"].as_array().into_iter().flatten() {
        let node = s(&t["node"]);
        if node.is_empty() {
            continue;
        }
        let id = report["explorer_ids"][node].as_str().unwrap_or(node).to_string();
        let e = error_of(t);
        let value = if e.is_finite() { e } else { 1e30 };
        let previous = results.get(&id).and_then(|v| v["value"].as_f64()).unwrap_or(f64::NEG_INFINITY);
        if value > previous {
            results.insert(id, json!({ "value": value }));
        }
    }
    json!({
        "results": results,
        "thresholds": [
            { "value": 1e-3, "bgColor": "#c8e6c9" },
            { "value": 1e-2, "bgColor": "#fff59d" },
            { "value": 1e-1, "bgColor": "#ffcc80" },
            { "value": 1e30, "bgColor": "#ef9a9a" }
        ]
    })
}
