//! The self-contained HTML report: everything inline (styles, SVG charts, a small script), so it
//! opens from a file or an attachment with no network access.

use std::fmt::Write;

use serde_json::Value;

use crate::shorten;
use crate::svg::{esc, histogram, LogChart, Point};

/// A JSON number, or the strings "inf"/"-inf"/"nan" the report uses for non-finite values.
pub fn num(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
        Value::String(s) if s == "inf" => f64::INFINITY,
        Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
        _ => f64::NAN,
    }
}

pub fn fmt(v: f64) -> String {
    if let Some(s) = crate::special_number(v) {
        s.into()
    } else if (1e-3..1e4).contains(&v.abs()) {
        format!("{v:.4}")
    } else {
        format!("{v:.3e}")
    }
}

fn severity(error: f64) -> &'static str {
    if error.is_nan() {
        "none"
    } else if error < 1e-3 {
        "ok"
    } else if error < 1e-2 {
        "warn"
    } else if error < 1e-1 {
        "bad"
    } else {
        "broken"
    }
}

/// A string field of the report, or "".
pub(crate) fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// A tensor record's error level: relative L2, inf when it could not be compared.
pub(crate) fn error_of(t: &Value) -> f64 {
    if t["mismatch"].is_null() {
        num(&t["metrics"]["rel_l2_err"])
    } else {
        f64::INFINITY
    }
}

const STYLE: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#222;background:#fff}
main{max-width:1180px;margin:0 auto;padding:0 20px 40px}
header.verdict{padding:18px 20px;color:#fff}
header.pass{background:#2e7d32} header.diverged{background:#c62828}
header h1{margin:0 0 4px;font-size:24px} header p{margin:2px 0}
h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0;cursor:pointer;user-select:none;white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.fail td:first-child{border-left:3px solid #c62828} tr.chain{background:#e3f2fd} tr.first{background:#ffcdd2}
.kv td:first-child{color:#666;white-space:nowrap}
.chart{max-width:100%;height:auto;display:block;margin:6px 0}
.chart .tick{font-size:11px;fill:#555} .chart .axis{font-size:12px;fill:#333} .chart .rule{font-size:11px;fill:#c62828}
.pt{fill:#9e9e9e} .pt.fail{fill:#ef6c00} .pt.chain{fill:#1565c0} .pt.first{fill:#c62828;stroke:#000;stroke-width:1.5}
.bar.ref{fill:#1565c0;opacity:.75} .bar.cand{fill:#ef6c00;opacity:.75}
.node rect{stroke:#555;rx:6} .node text{font-size:12px} .node .sub{font-size:11px;fill:#444}
.sev-ok{fill:#c8e6c9} .sev-warn{fill:#fff59d} .sev-bad{fill:#ffcc80} .sev-broken{fill:#ef9a9a} .sev-none{fill:#eeeeee}
.controls{margin:8px 0} .controls input[type=search]{width:320px;padding:4px}
.legend span{display:inline-block;margin-right:14px} .legend i{display:inline-block;width:10px;height:10px;border-radius:5px;margin-right:4px;vertical-align:middle}
code{background:#f5f5f5;padding:1px 4px;border-radius:3px}
header code{background:rgba(255,255,255,.22);color:#fff}
"#;

const SCRIPT: &str = r#"
(function(){
  var table=document.getElementById('tensor-table'); if(!table) return;
  var body=table.tBodies[0], rows=Array.prototype.slice.call(body.rows);
  var filter=document.getElementById('tensor-filter'), failing=document.getElementById('failing-only');
  var count=document.getElementById('tensor-count');
  function apply(){
    var q=(filter.value||'').toLowerCase(), only=failing.checked, shown=0;
    rows.forEach(function(r){
      var ok=(!q||r.getAttribute('data-text').indexOf(q)>=0)&&(!only||r.classList.contains('fail'));
      r.style.display=ok?'':'none'; if(ok) shown++;
    });
    count.textContent=shown+' of '+rows.length+' tensors';
  }
  filter.addEventListener('input',apply); failing.addEventListener('change',apply);
  Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,i){
    th.addEventListener('click',function(){
      var asc=th.getAttribute('data-dir')!=='asc'; th.setAttribute('data-dir',asc?'asc':'desc');
      var numeric=th.getAttribute('data-type')==='num';
      rows.sort(function(a,b){
        var x=a.cells[i].getAttribute('data-v')||a.cells[i].textContent, y=b.cells[i].getAttribute('data-v')||b.cells[i].textContent;
        if(numeric){x=parseFloat(x);y=parseFloat(y); if(isNaN(x))x=-Infinity; if(isNaN(y))y=-Infinity; return asc?x-y:y-x;}
        return asc?x.localeCompare(y):y.localeCompare(x);
      });
      rows.forEach(function(r){body.appendChild(r);});
    });
  });
  apply();
})();
"#;

/// The numeric sort key of a value: inf sorts above every finite number.
fn key(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "1e308".into() } else { "-1e308".into() }
    } else {
        format!("{v:e}")
    }
}

fn neighbourhood_svg(detail: &Value, fd: &Value) -> String {
    let inputs = detail["inputs"].as_array().cloned().unwrap_or_default();
    let consumers = detail["consumers"].as_array().cloned().unwrap_or_default();
    let rows = inputs.len().max(consumers.len()).max(1);
    let (w, box_w, box_h, gap) = (1000.0, 270.0, 46.0, 14.0);
    let h = 20.0 + rows as f64 * (box_h + gap);
    let mut out = String::new();
    let _ = write!(out, r#"<svg id="neighbourhood-graph" class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img">"#);
    let _ = write!(out, r##"<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>"##);
    let center_y = h / 2.0 - box_h / 2.0;
    let node_box = |out: &mut String, x: f64, y: f64, title: &str, sub: &str, error: f64| {
        let _ = write!(
            out,
            r#"<g class="node"><rect class="sev-{}" x="{x:.1}" y="{y:.1}" width="{box_w}" height="{box_h}"/><text x="{:.1}" y="{:.1}">{}</text><text class="sub" x="{:.1}" y="{:.1}">{} · {}</text><title>{} ({})</title></g>"#,
            severity(error),
            x + 8.0,
            y + 18.0,
            esc(&shorten(title, 38)),
            x + 8.0,
            y + 36.0,
            esc(&shorten(sub, 22)),
            if error.is_nan() { "not compared".to_string() } else { format!("rel L2 {}", fmt(error)) },
            esc(title),
            esc(sub)
        );
    };
    let column = |list: &[Value], i: usize| 10.0 + i as f64 * (box_h + gap) + (h - 20.0 - list.len() as f64 * (box_h + gap)) / 2.0;
    for (i, n) in inputs.iter().enumerate() {
        let y = column(&inputs, i);
        let label = if n["weight"].as_bool().unwrap_or(false) { "weight" } else { s(&n["op_type"]) };
        node_box(&mut out, 10.0, y, s(&n["tensor"]), label, num(&n["error"]));
        let _ = write!(out, r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#555" marker-end="url(#arrow)"/>"##, 10.0 + box_w, y + box_h / 2.0, 365.0, center_y + box_h / 2.0);
    }
    let _ = write!(out, r##"<g class="node first"><rect class="sev-{}" x="365" y="{center_y:.1}" width="{box_w}" height="{box_h}" stroke-width="3"/><text x="373" y="{:.1}" font-weight="bold">{}</text><text class="sub" x="373" y="{:.1}">{} · rel L2 {}</text></g>"##,
        severity(num(&fd["output_error"])), center_y + 18.0, esc(&shorten(s(&fd["node"]), 36)), center_y + 36.0, esc(s(&fd["op_type"])), fmt(num(&fd["output_error"])));
    for (i, n) in consumers.iter().enumerate() {
        let y = column(&consumers, i);
        let _ = write!(out, r##"<line x1="{:.1}" y1="{:.1}" x2="718" y2="{:.1}" stroke="#555" marker-end="url(#arrow)"/>"##, 365.0 + box_w, center_y + box_h / 2.0, y + box_h / 2.0);
        node_box(&mut out, 720.0, y, s(&n["node"]), &format!("{} → {}", s(&n["op_type"]), s(&n["tensor"])), num(&n["error"]));
    }
    out.push_str("</svg>");
    out
}

/// A first divergent node's input error: a number, or "not compared" (JSON null).
pub(crate) fn input_error_text(v: &Value) -> String {
    if v.is_null() {
        "not compared".to_string()
    } else {
        fmt(num(v))
    }
}

/// The verdict's conclusions as a list (every format shows the same sentences).
fn conclusions_list(v: &Value) -> String {
    let items: Vec<String> = v["conclusions"].as_array().into_iter().flatten().map(|c| format!("<li>{}</li>", esc(s(c)))).collect();
    if items.is_empty() {
        String::new()
    } else {
        format!(r#"<ul id="conclusions">{}</ul>"#, items.join(""))
    }
}

/// "Run alone", "Does keeping it help" and the noise floor: what the runs after the walk found.
fn after_walk_sections(report: &Value) -> String {
    let mut h = String::new();
    let floor = &report["noise_floor"];
    if floor.is_object() {
        let _ = write!(
            h,
            r#"<h2 id="noise-floor">Noise floor</h2><p>The float32 reference re-run with {}: output <code>{}</code> moves by rel L2 <b>{}</b>; the candidate's error is {} ({}x). {}</p>"#,
            esc(s(&floor["perturbation"])),
            esc(s(&floor["output"])),
            fmt(num(&floor["output_error"])),
            fmt(num(&floor["candidate_error"])),
            fmt(num(&floor["ratio"])),
            if floor["ill_conditioned"].as_bool() == Some(true) { "The output is ill-conditioned for these inputs: no layer is at fault." } else { "The candidate's error is not the model's own sensitivity." }
        );
    }
    let iso = &report["isolation"];
    if let Some(nodes) = iso["nodes"].as_array().filter(|n| !n.is_empty()) {
        h.push_str(r#"<h2 id="run-alone">Run alone</h2><p>Each blame-chain node run by itself on the candidate, fed the reference's values: a large error alone means the node introduces it; a small one means it passes on error from upstream.</p><table><thead><tr><th>node</th><th>op</th><th>alone (rel L2)</th><th>in the model</th><th>role</th><th>note</th></tr></thead><tbody>"#);
        for n in nodes {
            let _ = write!(h, r#"<tr><td>{}</td><td>{}</td><td class="n">{}</td><td class="n">{}</td><td>{}</td><td>{}</td></tr>"#, esc(s(&n["node"])), esc(s(&n["op_type"])), fmt(num(&n["local_error"])), fmt(num(&n["in_model_error"])), esc(s(&n["role"])), esc(s(&n["note"])));
        }
        h.push_str("</tbody></table>");
    }
    if let Some(skipped) = iso["skipped"].as_array().filter(|n| !n.is_empty()) {
        h.push_str("<p>Not run alone:</p><ul>");
        for k in skipped {
            let _ = write!(h, "<li>{}: {}</li>", esc(s(&k[0])), esc(s(&k[1])));
        }
        h.push_str("</ul>");
    }
    let cf = &report["counterfactual"];
    if cf.is_object() {
        let _ = write!(h, r#"<h2 id="keep-helps">Does keeping it help?</h2><p>The candidate re-run with each break (and its recognised pattern) kept at reference precision; output <code>{}</code> has rel L2 {} without any keep.</p><table><thead><tr><th>node</th><th>why checked</th><th>pattern (nodes)</th><th>error after</th><th>effect</th></tr></thead><tbody>"#, esc(s(&cf["output"])), fmt(num(&cf["output_error"])));
        for c in cf["checks"].as_array().into_iter().flatten() {
            let effect = if c["contained"].as_bool() == Some(true) {
                "contained: the output error does not change".to_string()
            } else {
                format!("removes {:.0}% of the output error{}", 100.0 * num(&c["explained"]), if c["fixes"].as_bool() == Some(true) { ", fixes every output" } else { "" })
            };
            let kept = c["kept"].as_array().map_or(0, Vec::len);
            let _ = write!(h, r#"<tr><td>{}</td><td>{}</td><td>{} ({kept})</td><td class="n">{}</td><td>{}</td></tr>"#, esc(s(&c["node"])), esc(s(&c["reason"])), esc(s(&c["pattern"])), fmt(num(&c["output_error_after"])), esc(&effect));
        }
        let _ = write!(h, "</tbody></table><p><b>{}</b></p>", esc(s(&cf["conclusion"])));
    }
    h
}

/// Renders the HTML report of a `layerwise.report/1` document.
pub fn render_html(report: &Value) -> String {
    let v = &report["verdict"];
    let status = s(&v["status"]);
    let fd = &v["first_divergent"];
    let tensors = report["tensors"].as_array().cloned().unwrap_or_default();
    let chain: Vec<&str> = v["chain"].as_array().map(|c| c.iter().map(|s| s["tensor"].as_str().unwrap_or("")).collect()).unwrap_or_default();
    let first_tensor = fd["tensor"].as_str().unwrap_or("");

    let mut h = String::with_capacity(64 * 1024 + tensors.len() * 600);
    let _ = write!(h, "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>layerwise: {}</title><style>{STYLE}</style></head><body>", esc(s(&report["model"]["path"])));
    let _ = write!(
        h,
        r#"<header class="verdict {}" id="verdict"><h1>{}</h1><p>{}</p>{}<p>{} · reference <code>{}</code> · candidate <code>{}</code></p></header><main>"#,
        if status == "pass" { "pass" } else { "diverged" },
        if status == "pass" { "PASS" } else { "DIVERGED" },
        esc(s(&v["summary"])),
        conclusions_list(v),
        esc(s(&report["model"]["path"])),
        esc(s(&report["ref"]["spec"])),
        esc(s(&report["cand"]["spec"]))
    );

    if fd.is_object() {
        let _ = write!(
            h,
            r#"<h2 id="first-divergent">First divergent layer</h2><table class="kv"><tr><td>node</td><td><b>{}</b> ({})</td></tr><tr><td>tensor</td><td>{}</td></tr><tr><td>error</td><td>inputs {} → output {} (relative L2)</td></tr><tr><td>cause</td><td>{}: {}</td></tr></table>"#,
            esc(s(&fd["node"])),
            esc(s(&fd["op_type"])),
            esc(first_tensor),
            input_error_text(&fd["input_error"]),
            fmt(num(&fd["output_error"])),
            esc(s(&fd["cause"]["kind"])),
            esc(s(&fd["cause"]["detail"]))
        );
        if let Some(alts) = fd["cause"]["alternatives"].as_array().filter(|a| !a.is_empty()) {
            h.push_str(r#"<p>Other mechanisms considered (share of the error each can account for):</p><ul id="alternatives">"#);
            for a in alts {
                let share = if a["explains"].is_null() { "share unknown".to_string() } else { format!("explains {:.0}%", 100.0 * num(&a["explains"])) };
                let _ = write!(h, "<li>{} ({share}): {}</li>", esc(s(&a["kind"])), esc(s(&a["detail"])));
            }
            h.push_str("</ul>");
        }
        let layer = &report["first_divergent_detail"]["engine_layer"];
        if layer.is_object() {
            let _ = write!(h, r#"<p id="engine-layer">Inside TensorRT layer <code>{}</code> ({} ONNX nodes fused).</p>"#, esc(s(&layer["name"])), layer["onnx_nodes"]);
        }
    }

    let end = &v["sight_ends"];
    if end.is_object() {
        let _ = write!(h, r#"<h2 id="sight-ends">Where sight ends</h2><p>The error of the worst output can be followed back to <b>{}</b> ({}), tensor <code>{}</code> (rel L2 {}), whose inputs were not all compared: the error enters there or before it.</p><ul>"#, esc(s(&end["node"])), esc(s(&end["op_type"])), esc(s(&end["tensor"])), fmt(num(&end["output_error"])));
        for u in end["unseen_inputs"].as_array().into_iter().flatten() {
            let _ = write!(h, "<li><code>{}</code>: {}</li>", esc(s(&u[0])), esc(s(&u[1])));
        }
        h.push_str("</ul>");
    }
    h.push_str(&after_walk_sections(report));

    // Error and magnitude against depth.
    let x_max = tensors.iter().map(|t| t["topo_index"].as_f64().unwrap_or(0.0)).fold(1.0, f64::max);
    let class_of = |t: &Value| -> &'static str {
        let name = s(&t["name"]);
        if name == first_tensor {
            "first"
        } else if chain.contains(&name) {
            "chain"
        } else if !t["pass"].as_bool().unwrap_or(true) {
            "fail"
        } else {
            "ok"
        }
    };
    let layers: Vec<&Value> = tensors.iter().filter(|t| !t["constant_like"].as_bool().unwrap_or(false)).collect();
    let mut chain_line: Vec<(f64, f64)> = layers
        .iter()
        .filter(|t| chain.contains(&s(&t["name"])))
        .map(|t| (t["topo_index"].as_f64().unwrap_or(0.0), error_of(t)))
        .collect();
    chain_line.sort_by(|a, b| a.0.total_cmp(&b.0));
    let min_break = num(&report["tolerances"]["walk"]["min_break"]);
    let error_chart = LogChart {
        id: "error-plot",
        width: 1100.0,
        height: 340.0,
        x_label: "topological index of the producing node",
        y_label: "relative L2 error",
        x_max,
        points: layers
            .iter()
            .map(|t| Point {
                x: t["topo_index"].as_f64().unwrap_or(0.0),
                y: error_of(t).max(1e-12),
                class: class_of(t),
                title: format!("{} ({}): {}", s(&t["name"]), s(&t["op_type"]), fmt(error_of(t))),
            })
            .collect(),
        line: chain_line,
        rules: if min_break.is_finite() { vec![(min_break, format!("break threshold {}", fmt(min_break)))] } else { vec![] },
    };
    let range_chart = LogChart {
        id: "range-plot",
        width: 1100.0,
        height: 300.0,
        x_label: "topological index of the producing node",
        y_label: "reference max |value|",
        x_max,
        points: tensors
            .iter()
            .map(|t| Point {
                x: t["topo_index"].as_f64().unwrap_or(0.0),
                y: num(&t["metrics"]["ref_max_abs"]).max(1e-12),
                class: class_of(t),
                title: format!("{}: max |ref| {}", s(&t["name"]), fmt(num(&t["metrics"]["ref_max_abs"]))),
            })
            .collect(),
        line: vec![],
        rules: vec![(65504.0, "FP16 max 65504".into())],
    };
    let _ = write!(
        h,
        r##"<h2>Error by depth</h2><p class="legend"><span><i style="background:#9e9e9e"></i>within tolerance</span><span><i style="background:#ef6c00"></i>out of tolerance</span><span><i style="background:#1565c0"></i>blame chain</span><span><i style="background:#c62828"></i>first divergent</span><span>▲ inf/NaN</span></p>{}<h2>Reference magnitude by depth</h2><p>Values above the dashed line overflow to inf when stored as FP16.</p>{}"##,
        error_chart.render(),
        range_chart.render()
    );

    let detail = &report["first_divergent_detail"];
    if detail.is_object() {
        let _ = write!(h, r#"<h2 id="neighbourhood">Around the first divergent layer</h2><p>Inputs (left), the node, and its consumers (right), coloured by relative L2 error: green &lt; 1e-3, yellow &lt; 1e-2, orange &lt; 0.1, red above.</p>{}"#, neighbourhood_svg(detail, fd));
        let hist = &detail["histogram"];
        if let (Some(edges), Some(r), Some(c)) = (hist["edges"].as_array(), hist["ref_counts"].as_array(), hist["cand_counts"].as_array()) {
            let edges: Vec<f64> = edges.iter().map(num).collect();
            let r: Vec<u64> = r.iter().filter_map(Value::as_u64).collect();
            let c: Vec<u64> = c.iter().filter_map(Value::as_u64).collect();
            let _ = write!(
                h,
                r#"<h2 id="histogram">Values of <code>{}</code></h2><p>Reference and candidate on shared bins; inf/NaN outside the bins: reference {}, candidate {}.</p>{}"#,
                esc(first_tensor),
                hist["ref_nonfinite"],
                hist["cand_nonfinite"],
                histogram("value-histogram", &edges, &r, &c, 1100.0, 280.0)
            );
        }
    }

    if let Some(steps) = v["chain"].as_array().filter(|c| !c.is_empty()) {
        h.push_str(r#"<h2 id="chain">Blame chain</h2><table><thead><tr><th>#</th><th>tensor</th><th>node</th><th>op</th><th>rel L2</th><th>max abs</th><th>inf/NaN</th></tr></thead><tbody>"#);
        for (i, st) in steps.iter().enumerate() {
            let _ = write!(h, r#"<tr><td class="n">{i}</td><td>{}</td><td>{}</td><td>{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td></tr>"#, esc(s(&st["tensor"])), esc(s(&st["node"])), esc(s(&st["op_type"])), fmt(num(&st["error"])), fmt(num(&st["max_abs_err"])), st["nonfinite"]);
        }
        h.push_str("</tbody></table>");
    }
    if let Some(nf) = v["non_finite"].as_array().filter(|n| !n.is_empty()) {
        h.push_str(r#"<h2 id="non-finite">Non-finite values in the candidate</h2><table><thead><tr><th>tensor</th><th>node</th><th>op</th><th>inf/NaN</th><th>born here</th><th>on chain</th></tr></thead><tbody>"#);
        for n in nf {
            let _ = write!(h, "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>", esc(s(&n["tensor"])), esc(s(&n["node"])), esc(s(&n["op_type"])), n["mismatched"], if n["origin"].as_bool() == Some(true) { "yes" } else { "" }, if n["on_chain"].as_bool() == Some(true) { "yes" } else { "" });
        }
        h.push_str("</tbody></table>");
    }

    let _ = write!(h, r#"<h2 id="tensors">All tensors</h2><div class="controls"><input type="search" id="tensor-filter" placeholder="filter by tensor, node or op"> <label><input type="checkbox" id="failing-only"> out of tolerance only</label> <span id="tensor-count"></span></div>"#);
    h.push_str(r#"<table id="tensor-table"><thead><tr><th data-type="num">#</th><th>tensor</th><th>node</th><th>op</th><th>shape</th><th data-type="num">rel L2</th><th data-type="num">max abs</th><th data-type="num">mean abs</th><th data-type="num">max rel</th><th data-type="num">cosine</th><th data-type="num">SNR dB</th><th data-type="num">inf/NaN</th><th data-type="num">max |ref|</th><th>pass</th></tr></thead><tbody>"#);
    for t in &tensors {
        let m = &t["metrics"];
        let name = s(&t["name"]);
        let class = match class_of(t) {
            "first" => "first fail",
            "chain" if !t["pass"].as_bool().unwrap_or(true) => "chain fail",
            "chain" => "chain",
            "fail" => "fail",
            _ => "",
        };
        let shape: Vec<String> = t["shape"].as_array().map(|a| a.iter().map(|d| d.to_string()).collect()).unwrap_or_default();
        let cell = |v: f64| format!(r#"<td class="n" data-v="{}">{}</td>"#, key(v), fmt(v));
        let _ = write!(
            h,
            r#"<tr class="{class}" data-text="{}"><td class="n" data-v="{}">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}{}{}{}{}{}<td class="n" data-v="{}">{}</td>{}<td>{}</td></tr>"#,
            esc(&format!("{} {} {}", name, s(&t["node"]), s(&t["op_type"])).to_lowercase()),
            t["topo_index"],
            t["topo_index"],
            esc(name),
            esc(s(&t["node"])),
            esc(s(&t["op_type"])),
            shape.join("×"),
            cell(error_of(t)),
            cell(num(&m["max_abs_err"])),
            cell(num(&m["mean_abs_err"])),
            cell(num(&m["max_rel_err"])),
            cell(num(&m["cosine"])),
            cell(num(&m["snr_db"])),
            m["nonfinite_mismatch"],
            m["nonfinite_mismatch"],
            cell(num(&m["ref_max_abs"])),
            if t["pass"].as_bool() == Some(true) { "yes" } else { "<b>no</b>" }
        );
    }
    let _ = writeln!(h, "</tbody></table><p>layerwise {} · schema {} · tolerance: {}</p></main><script>{SCRIPT}</script></body></html>", esc(s(&report["layerwise_version"])), esc(s(&report["schema"])), esc(s(&report["tolerances"]["rule"])));
    h
}
