//! The other report formats, all rendered from the typed report: Markdown for pull requests, CSV
//! with one row per tensor, and node data for Google's Model Explorer.

use std::fmt::Write;

use layerwise_analysis::{Status, TensorRecord};
use serde_json::{json, Value};

use crate::fix_report::{FixReport, FixStatus};

use crate::{error_of, fmt, input_error_text, Report};

/// A number as the JSON report writes it ("inf", "nan" for non-finite values), for CSV cells.
fn json_number(v: f64) -> String {
    match crate::special_number(v) {
        Some(s) if s != "0" => s.to_string(),
        _ => serde_json::Value::from(v).to_string(),
    }
}

use crate::escape::{csv_text, markdown_cell_code, markdown_code, markdown_text as md};

/// A short summary for a pull request or issue: verdict, first divergent layer, chain, the ten
/// worst tensors, and the fix if one is given (a `layerwise.fix/1` document).
pub fn render_markdown(report: &Report, fix: Option<&FixReport>) -> String {
    let v = &report.verdict;
    let mut m = String::new();
    let status = match v.status {
        Status::Pass if crate::nothing_judged(report) => "⚠️ PASS - nothing judged",
        Status::Pass => "✅ PASS",
        Status::Diverged => "❌ DIVERGED",
    };
    let _ = writeln!(m, "## layerwise: {status}\n");
    let _ = writeln!(
        m,
        "{} — reference {}, candidate {}\n",
        markdown_code(&report.model.path),
        markdown_code(&report.reference.spec),
        markdown_code(&report.cand.described())
    );
    for a in &report.extras.answers {
        let _ = writeln!(m, "**{}**\n", md(&a.line()));
    }
    let _ = writeln!(m, "{}\n", md(&v.summary));
    if !v.conclusions.is_empty() {
        for c in &v.conclusions {
            let _ = writeln!(m, "- {}", md(c));
        }
        m.push('\n');
    }
    if let Some(fd) = &v.first_divergent {
        let _ = writeln!(
            m,
            "**First divergent layer:** {} ({}) — tensor {}, relative L2 error {} → {}  ",
            markdown_code(&fd.node),
            md(&fd.op_type),
            markdown_code(&fd.tensor),
            input_error_text(fd.input_error),
            fmt(fd.output_error)
        );
        let _ = writeln!(m, "**Cause:** {} — {}\n", crate::cause_name(fd.cause.best.kind), md(&fd.cause.best.detail));
    }
    if !v.chain.is_empty() {
        let steps: Vec<String> = v
            .chain
            .iter()
            .map(|st| format!("{} ({}, {})", markdown_code(&st.tensor), md(&st.op_type), fmt(st.error)))
            .collect();
        let _ = writeln!(m, "**Blame chain** (worst output → first divergent): {}\n", steps.join(" ← "));
    }
    let mut worst: Vec<&TensorRecord> = report.tensors.iter().filter(|t| !t.constant_like).collect();
    worst.sort_by(|a, b| error_of(b).total_cmp(&error_of(a)));
    if !worst.is_empty() {
        let _ = writeln!(m, "| # | tensor | op | rel L2 | max abs | cosine | pass |\n|---|---|---|---|---|---|---|");
        for t in worst.iter().take(10) {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} |",
                t.topo_index,
                markdown_cell_code(&t.name),
                md(&t.op_type),
                fmt(error_of(t)),
                fmt(t.metrics.max_abs_err),
                fmt(t.metrics.cosine),
                if t.pass { "yes" } else { "**no**" }
            );
        }
        m.push('\n');
    }
    if let Some(fix) = fix {
        let status = if fix.status == FixStatus::Fixed { "fixed" } else { "not_fixed" };
        let _ = writeln!(m, "**Fix ({status}):** {}  ", md(&fix.summary));
        // The answers, as the terminal shows them.
        for a in &fix.answers {
            let _ = writeln!(m, "{}  ", md(&a.line()));
        }
        if !fix.keep_fp32.is_empty() {
            let names: Vec<String> = fix.keep_fp32.iter().map(|k| markdown_code(k)).collect();
            let _ = writeln!(m, "Keep in FP32: {}  ", names.join(", "));
            if !fix.trtexec_flags.is_empty() {
                let _ = writeln!(
                    m,
                    "TensorRT 10: {}",
                    markdown_code(&format!("trtexec --onnx=MODEL {}", fix.trtexec_flags))
                );
            }
            let left_out: Vec<(String, &str)> = crate::escape::trtexec_left_out(&fix.keep_fp32)
                .into_iter()
                .map(|(n, why)| (n.to_string(), why))
                .collect();
            if !left_out.is_empty() {
                let _ =
                    writeln!(m, "\n{}", md(&crate::fix_report::trtexec_left_out_note(&left_out, |n| format!("'{n}'"))));
            }
        }
        m.push('\n');
    }
    m
}

/// One row per compared tensor with every metric, in topological order. Text cells (names, op
/// types, messages) that a spreadsheet would read as a formula get a leading `'`; numbers are
/// written as numbers.
pub fn render_csv(report: &Report) -> Vec<u8> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let header = [
        "topo_index",
        "tensor",
        "node",
        "op_type",
        "shape",
        "ref_dtype",
        "cand_dtype",
        "is_output",
        "constant_like",
        "pass",
        "mismatch",
        "numel",
        "max_abs_err",
        "mean_abs_err",
        "max_rel_err",
        "rel_l2_err",
        "cosine",
        "snr_db",
        "ref_nan",
        "ref_inf",
        "cand_nan",
        "cand_inf",
        "nonfinite_mismatch",
        "ref_max_abs",
        "ref_fp16_overflow",
        "ref_fp16_subnormal_share",
        "violations",
        "worst_index",
    ];
    w.write_record(header).expect("csv to memory");
    for t in &report.tensors {
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        let m = &t.metrics;
        let row = [
            t.topo_index.to_string(),
            csv_text(&t.name).into_owned(),
            csv_text(&t.node).into_owned(),
            csv_text(&t.op_type).into_owned(),
            shape.join("x"),
            csv_text(&t.ref_dtype).into_owned(),
            csv_text(&t.cand_dtype).into_owned(),
            t.is_output.to_string(),
            t.constant_like.to_string(),
            t.pass.to_string(),
            csv_text(t.mismatch.as_deref().unwrap_or_default()).into_owned(),
            m.numel.to_string(),
            json_number(m.max_abs_err),
            json_number(m.mean_abs_err),
            json_number(m.max_rel_err),
            json_number(m.rel_l2_err),
            json_number(m.cosine),
            json_number(m.snr_db),
            m.ref_nan.to_string(),
            m.ref_inf.to_string(),
            m.cand_nan.to_string(),
            m.cand_inf.to_string(),
            m.nonfinite_mismatch.to_string(),
            json_number(m.ref_max_abs),
            m.ref_fp16_overflow.to_string(),
            json_number(m.ref_fp16_subnormal_share),
            m.violations.to_string(),
            m.worst_index.to_string(),
        ];
        w.write_record(&row).expect("csv to memory");
    }
    w.into_inner().expect("csv to memory")
}

/// Per-node error as Model Explorer node data (its `GraphNodeData` JSON: `results` keyed by
/// output tensor name, each `{value}`, plus colour `thresholds`). The value is the relative L2
/// error of the node's output; inf/NaN errors become 1e30 (JSON has no inf).
pub fn render_model_explorer(report: &Report) -> Value {
    // Keyed by the node ids Model Explorer's ONNX adapter gives (node names, with its own names for
    // unnamed and duplicate nodes and If branches), each node's worst output error.
    let mut results: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for t in &report.tensors {
        if t.node.is_empty() {
            continue;
        }
        let id = report.extras.explorer_ids.get(&t.node).cloned().unwrap_or_else(|| t.node.clone());
        let e = error_of(t);
        let value = if e.is_finite() { e } else { 1e30 };
        let previous = results.get(&id).copied().unwrap_or(f64::NEG_INFINITY);
        if value > previous {
            results.insert(id, value);
        }
    }
    let results: serde_json::Map<String, Value> =
        results.into_iter().map(|(id, value)| (id, json!({ "value": value }))).collect();
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
