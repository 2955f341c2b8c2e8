//! The self-contained HTML report: everything inline (styles, SVG charts, a small script), so it
//! opens from a file or an attachment with no network access.

use std::fmt::Write;

use layerwise_analysis::{FirstDivergent, Status, TensorRecord};

use crate::json::{Detail, Neighbour};
use crate::svg::{esc, histogram, LogChart, Point};
use crate::{cause_name, error_of, fmt, input_error_text, shorten, Report};

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

const STYLE: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#222;background:#fff}
main{max-width:1180px;margin:0 auto;padding:0 20px 40px}
header.verdict{padding:18px 20px;color:#fff}
header.pass{background:#2e7d32} header.diverged{background:#c62828}
header h1{margin:0 0 4px;font-size:24px} header p{margin:2px 0}
h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left !important;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0;cursor:pointer;user-select:none;white-space:nowrap}
td.n{text-align:right !important;font-variant-numeric:tabular-nums;white-space:nowrap}
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
        if v > 0.0 {
            "1e308".into()
        } else {
            "-1e308".into()
        }
    } else {
        format!("{v:e}")
    }
}

fn neighbourhood_svg(detail: &Detail, fd: &FirstDivergent) -> String {
    let (inputs, consumers) = (&detail.inputs, &detail.consumers);
    let rows = inputs.len().max(consumers.len()).max(1);
    let (w, box_w, box_h, gap) = (1000.0, 270.0, 46.0, 14.0);
    let h = 20.0 + rows as f64 * (box_h + gap);
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg id="neighbourhood-graph" class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img">"#
    );
    let _ = write!(
        out,
        r##"<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>"##
    );
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
    let error = |n: &Neighbour| n.error.unwrap_or(f64::NAN);
    let column = |list: &[Neighbour], i: usize| {
        10.0 + i as f64 * (box_h + gap) + (h - 20.0 - list.len() as f64 * (box_h + gap)) / 2.0
    };
    for (i, n) in inputs.iter().enumerate() {
        let y = column(inputs, i);
        let label = if n.weight { "weight" } else { n.op_type.as_str() };
        node_box(&mut out, 10.0, y, &n.tensor, label, error(n));
        let _ = write!(
            out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#555" marker-end="url(#arrow)"/>"##,
            10.0 + box_w,
            y + box_h / 2.0,
            365.0,
            center_y + box_h / 2.0
        );
    }
    let _ = write!(
        out,
        r##"<g class="node first"><rect class="sev-{}" x="365" y="{center_y:.1}" width="{box_w}" height="{box_h}" stroke-width="3"/><text x="373" y="{:.1}" font-weight="bold">{}</text><text class="sub" x="373" y="{:.1}">{} · rel L2 {}</text></g>"##,
        severity(fd.output_error),
        center_y + 18.0,
        esc(&shorten(&fd.node, 36)),
        center_y + 36.0,
        esc(&fd.op_type),
        fmt(fd.output_error)
    );
    for (i, n) in consumers.iter().enumerate() {
        let y = column(consumers, i);
        let _ = write!(
            out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="718" y2="{:.1}" stroke="#555" marker-end="url(#arrow)"/>"##,
            365.0 + box_w,
            center_y + box_h / 2.0,
            y + box_h / 2.0
        );
        node_box(&mut out, 720.0, y, &n.node, &format!("{} → {}", n.op_type, n.tensor), error(n));
    }
    out.push_str("</svg>");
    out
}

/// The verdict's conclusions as a list (every format shows the same sentences).
fn conclusions_list(conclusions: &[String]) -> String {
    let items: Vec<String> = conclusions.iter().map(|c| format!("<li>{}</li>", esc(c))).collect();
    if items.is_empty() {
        String::new()
    } else {
        format!(r#"<ul id="conclusions">{}</ul>"#, items.join(""))
    }
}

/// "Run alone", "Does keeping it help" and the noise floor: what the runs after the walk found.
fn after_walk_sections(report: &Report) -> String {
    let mut h = String::new();
    if let Some(floor) = &report.extras.noise_floor {
        let _ = write!(
            h,
            r#"<h2 id="noise-floor">Noise floor</h2><p>The float32 reference re-run with {}: output <code>{}</code> moves by rel L2 <b>{}</b>; the candidate's error is {} ({}x). {}</p>"#,
            esc(&floor.perturbation),
            esc(&floor.output),
            fmt(floor.output_error),
            fmt(floor.candidate_error),
            fmt(floor.ratio),
            if floor.ill_conditioned {
                "The output is ill-conditioned for these inputs: no layer is at fault."
            } else {
                "The candidate's error is not the model's own sensitivity."
            }
        );
    }
    if let Some(iso) = &report.extras.isolation {
        if !iso.nodes.is_empty() {
            h.push_str(r#"<h2 id="run-alone">Run alone</h2><p>Each blame-chain node run by itself on the candidate, fed the reference's values: a large error alone means the node introduces it; a small one means it passes on error from upstream.</p><table><thead><tr><th>node</th><th>op</th><th>alone (rel L2)</th><th>in the model</th><th>role</th><th>note</th></tr></thead><tbody>"#);
            for n in &iso.nodes {
                let _ = write!(
                    h,
                    r#"<tr><td>{}</td><td>{}</td><td class="n">{}</td><td class="n">{}</td><td>{}</td><td>{}</td></tr>"#,
                    esc(&n.node),
                    esc(&n.op_type),
                    fmt(n.local_error),
                    fmt(n.in_model_error),
                    esc(&n.role),
                    esc(n.note.as_deref().unwrap_or(""))
                );
            }
            h.push_str("</tbody></table>");
        }
        if !iso.skipped.is_empty() {
            h.push_str("<p>Not run alone:</p><ul>");
            for (node, why) in &iso.skipped {
                let _ = write!(h, "<li>{}: {}</li>", esc(node), esc(why));
            }
            h.push_str("</ul>");
        }
    }
    if let Some(cf) = &report.extras.counterfactual {
        let _ = write!(
            h,
            r#"<h2 id="keep-helps">Does keeping it help?</h2><p>The candidate re-run with each break (and its recognised pattern) kept at reference precision; output <code>{}</code> has rel L2 {} without any keep.</p><table><thead><tr><th>node</th><th>why checked</th><th>pattern (nodes)</th><th>error after</th><th>effect</th></tr></thead><tbody>"#,
            esc(&cf.output),
            fmt(cf.output_error)
        );
        for c in &cf.checks {
            let effect = format!(
                "{}{}",
                c.effect(cf.output_error, None, cf.shape_differs),
                if c.fixes && !c.contained { ", fixes every output" } else { "" }
            );
            let kept = c.kept.len();
            let _ = write!(
                h,
                r#"<tr><td>{}</td><td>{}</td><td>{} ({kept})</td><td class="n">{}</td><td>{}</td></tr>"#,
                esc(&c.node),
                esc(&c.reason),
                esc(&c.pattern),
                fmt(c.output_error_after),
                esc(&effect)
            );
        }
        let _ = write!(h, "</tbody></table><p><b>{}</b></p>", esc(&cf.conclusion));
    }
    h
}

/// Renders the HTML report.
pub fn render_html(report: &Report) -> String {
    let v = &report.verdict;
    let pass = v.status == Status::Pass;
    let fd = v.first_divergent.as_ref();
    let tensors = &report.tensors;
    let chain: Vec<&str> = v.chain.iter().map(|s| s.tensor.as_str()).collect();
    let first_tensor = fd.map_or("", |f| f.tensor.as_str());

    let mut h = String::with_capacity(64 * 1024 + tensors.len() * 600);
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>layerwise: {}</title><style>{STYLE}</style></head><body>",
        esc(&report.model.path)
    );
    let _ = write!(
        h,
        r#"<header class="verdict {}" id="verdict"><h1>{}</h1>{}<p>{}</p>{}<p>{} · reference <code>{}</code> · candidate <code>{}</code></p></header><main>"#,
        if pass { "pass" } else { "diverged" },
        if crate::nothing_judged(report) {
            "PASS - nothing judged"
        } else if pass {
            "PASS"
        } else {
            "DIVERGED"
        },
        report
            .extras
            .answers
            .iter()
            .map(|a| format!(r#"<p class="answer"><b>{}</b></p>"#, esc(&a.line())))
            .collect::<String>(),
        esc(&v.summary),
        conclusions_list(&v.conclusions),
        esc(&report.model.path),
        esc(&report.reference.spec),
        esc(&report.cand.described())
    );

    if let Some(fd) = fd {
        let _ = write!(
            h,
            r#"<h2 id="first-divergent">First divergent layer</h2><table class="kv"><tr><td>node</td><td><b>{}</b> ({})</td></tr><tr><td>tensor</td><td>{}</td></tr><tr><td>error</td><td>inputs {} → output {} (relative L2)</td></tr><tr><td>cause</td><td>{}: {}</td></tr></table>"#,
            esc(&fd.node),
            esc(&fd.op_type),
            esc(first_tensor),
            input_error_text(fd.input_error),
            fmt(fd.output_error),
            esc(&cause_name(fd.cause.best.kind)),
            esc(&fd.cause.best.detail)
        );
        if !fd.cause.alternatives.is_empty() {
            h.push_str(r#"<p>Other mechanisms considered (share of the error each can account for):</p><ul id="alternatives">"#);
            for a in &fd.cause.alternatives {
                let share = match a.explains {
                    None => "share unknown".to_string(),
                    Some(x) => format!("explains {:.0}%", 100.0 * x),
                };
                let _ = write!(h, "<li>{} ({share}): {}</li>", esc(&cause_name(a.kind)), esc(&a.detail));
            }
            h.push_str("</ul>");
        }
        if let Some(layer) = report.first_divergent_detail.as_ref().and_then(|d| d.engine_layer.as_ref()) {
            let _ = write!(
                h,
                r#"<p id="engine-layer">Inside TensorRT layer <code>{}</code> ({} ONNX nodes fused).</p>"#,
                esc(&layer.name),
                layer.onnx_nodes
            );
        }
    }

    if let Some(end) = &v.sight_ends {
        let _ = write!(
            h,
            r#"<h2 id="sight-ends">Where sight ends</h2><p>The error of the worst output can be followed back to <b>{}</b> ({}), tensor <code>{}</code> (rel L2 {}), whose inputs were not all compared: the error enters there or before it.</p><ul>"#,
            esc(&end.node),
            esc(&end.op_type),
            esc(&end.tensor),
            fmt(end.output_error)
        );
        for (tensor, why) in &end.unseen_inputs {
            let _ = write!(h, "<li><code>{}</code>: {}</li>", esc(tensor), esc(why));
        }
        h.push_str("</ul>");
    }
    h.push_str(&after_walk_sections(report));

    // Error and magnitude against depth.
    let x_max = tensors.iter().map(|t| t.topo_index as f64).fold(1.0, f64::max);
    let class_of = |t: &TensorRecord| -> &'static str {
        if t.name == first_tensor {
            "first"
        } else if chain.contains(&t.name.as_str()) {
            "chain"
        } else if !t.pass {
            "fail"
        } else {
            "ok"
        }
    };
    let layers: Vec<&TensorRecord> = tensors.iter().filter(|t| !t.constant_like).collect();
    let mut chain_line: Vec<(f64, f64)> = layers
        .iter()
        .filter(|t| chain.contains(&t.name.as_str()))
        .map(|t| (t.topo_index as f64, error_of(t)))
        .collect();
    chain_line.sort_by(|a, b| a.0.total_cmp(&b.0));
    let min_break = report.tolerances.walk.min_break;
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
                x: t.topo_index as f64,
                y: error_of(t).max(1e-12),
                class: class_of(t),
                title: format!("{} ({}): {}", t.name, t.op_type, fmt(error_of(t))),
            })
            .collect(),
        line: chain_line,
        rules: if min_break.is_finite() {
            vec![(min_break, format!("break threshold {}", fmt(min_break)))]
        } else {
            vec![]
        },
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
                x: t.topo_index as f64,
                y: t.metrics.ref_max_abs.max(1e-12),
                class: class_of(t),
                title: format!("{}: max |ref| {}", t.name, fmt(t.metrics.ref_max_abs)),
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

    if let (Some(detail), Some(fd)) = (&report.first_divergent_detail, fd) {
        let _ = write!(
            h,
            r#"<h2 id="neighbourhood">Around the first divergent layer</h2><p>Inputs (left), the node, and its consumers (right), coloured by relative L2 error: green &lt; 1e-3, yellow &lt; 1e-2, orange &lt; 0.1, red above.</p>{}"#,
            neighbourhood_svg(detail, fd)
        );
        if let Some(hist) = &detail.histogram {
            let _ = write!(
                h,
                r#"<h2 id="histogram">Values of <code>{}</code></h2><p>Reference and candidate on shared bins; inf/NaN outside the bins: reference {}, candidate {}.</p>{}"#,
                esc(first_tensor),
                hist.ref_nonfinite,
                hist.cand_nonfinite,
                histogram("value-histogram", &hist.edges, &hist.ref_counts, &hist.cand_counts, 1100.0, 280.0)
            );
        }
    }

    if !v.chain.is_empty() {
        h.push_str(r#"<h2 id="chain">Blame chain</h2><table><thead><tr><th>#</th><th>tensor</th><th>node</th><th>op</th><th>rel L2</th><th>max abs</th><th>inf/NaN</th></tr></thead><tbody>"#);
        for (i, st) in v.chain.iter().enumerate() {
            let _ = write!(
                h,
                r#"<tr><td class="n">{i}</td><td>{}</td><td>{}</td><td>{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td></tr>"#,
                esc(&st.tensor),
                esc(&st.node),
                esc(&st.op_type),
                fmt(st.error),
                fmt(st.max_abs_err),
                st.nonfinite
            );
        }
        h.push_str("</tbody></table>");
    }
    if !v.non_finite.is_empty() {
        let _ = write!(h, r#"<h2 id="non-finite">{}</h2>"#, crate::non_finite_heading(v));
        h.push_str(r#"<table><thead><tr><th>tensor</th><th>node</th><th>op</th><th>inf/NaN</th><th>born here</th><th>on chain</th></tr></thead><tbody>"#);
        for n in &v.non_finite {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
                esc(&n.tensor),
                esc(&n.node),
                esc(&n.op_type),
                n.mismatched,
                if n.origin { "yes" } else { "" },
                if n.on_chain { "yes" } else { "" }
            );
        }
        h.push_str("</tbody></table>");
    }

    let _ = write!(
        h,
        r#"<h2 id="tensors">All tensors</h2><div class="controls"><input type="search" id="tensor-filter" placeholder="filter by tensor, node or op"> <label><input type="checkbox" id="failing-only"> out of tolerance only</label> <span id="tensor-count"></span></div>"#
    );
    h.push_str(r#"<table id="tensor-table"><thead><tr><th data-type="num">#</th><th>tensor</th><th>node</th><th>op</th><th>shape</th><th data-type="num">rel L2</th><th data-type="num">max abs</th><th data-type="num">mean abs</th><th data-type="num">max rel</th><th data-type="num">cosine</th><th data-type="num">SNR dB</th><th data-type="num">inf/NaN</th><th data-type="num">max |ref|</th><th>pass</th></tr></thead><tbody>"#);
    for t in tensors {
        let m = &t.metrics;
        let class = match class_of(t) {
            "first" => "first fail",
            "chain" if !t.pass => "chain fail",
            "chain" => "chain",
            "fail" => "fail",
            _ => "",
        };
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        let cell = |v: f64| format!(r#"<td class="n" data-v="{}">{}</td>"#, key(v), fmt(v));
        let _ = write!(
            h,
            r#"<tr class="{class}" data-text="{}"><td class="n" data-v="{}">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}{}{}{}{}{}<td class="n" data-v="{}">{}</td>{}<td>{}</td></tr>"#,
            esc(&format!("{} {} {}", t.name, t.node, t.op_type).to_lowercase()),
            t.topo_index,
            t.topo_index,
            esc(&t.name),
            esc(&t.node),
            esc(&t.op_type),
            shape.join("×"),
            cell(error_of(t)),
            cell(m.max_abs_err),
            cell(m.mean_abs_err),
            cell(m.max_rel_err),
            cell(m.cosine),
            cell(m.snr_db),
            m.nonfinite_mismatch,
            m.nonfinite_mismatch,
            cell(m.ref_max_abs),
            if t.pass { "yes" } else { "<b>no</b>" }
        );
    }
    let _ = writeln!(
        h,
        "</tbody></table><p>layerwise {} · schema {} · tolerance: {}</p></main><script>{SCRIPT}</script></body></html>",
        esc(&report.layerwise_version),
        esc(&report.schema),
        esc(&report.tolerances.rule)
    );
    h
}
