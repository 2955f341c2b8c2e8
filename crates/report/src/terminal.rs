use std::fmt::Write;

use layerwise_analysis::Status;

use crate::{shorten, Report};

fn num(v: f64) -> String {
    crate::format_number(v)
}

/// The terminal summary: verdict, first divergent layer, blame chain, non-finite values, and the
/// worst tensors. Every name and message in it is shown with its control and bidi characters
/// escaped.
pub fn render_terminal(report: &Report, top: usize) -> String {
    // Only the tensors shown are escaped: escaping goes through a JSON tree of what it is given,
    // and every tensor's record made that grow with the graph (1.9 s of a 50,000-node run).
    let compared = report.tensors.len();
    // Counted and read before `report` is narrowed to the tensors shown below.
    let judging_lines = judging_lines(report);
    let mut worst: Vec<&layerwise_analysis::TensorRecord> =
        report.tensors.iter().filter(|t| !t.constant_like).collect();
    worst.sort_by(|a, b| b.error_level().total_cmp(&a.error_level()).then(a.topo_index.cmp(&b.topo_index)));
    let shown = with_tensors(report, worst.iter().take(top).map(|t| (*t).clone()).collect());
    let report = &crate::escape::for_terminal(&shown);
    let mut out = String::new();
    let m = &report.model;
    let _ = writeln!(
        out,
        "model      {} (sha256 {}…, opset {}, {} nodes)",
        m.path,
        &m.sha256[..12.min(m.sha256.len())],
        m.opset,
        m.node_count
    );
    let _ = writeln!(out, "reference  {}", report.reference.spec);
    // Where the candidate file was evaluated by layerwise in its own types (ONNX Runtime's CPU
    // provider computes FP16 in float32, and would give another number), the header says so.
    let typed = report.cand.notes.iter().any(|n| n.starts_with("typed evaluation:"));
    let _ = writeln!(
        out,
        "candidate  {}{}",
        report.cand.described(),
        if typed {
            " (the file evaluated in its own types by layerwise, not by ONNX Runtime's CPU kernels, which compute FP16 and BF16 in float32)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "tolerance  |cand - ref| <= {} + {} * |ref| + {} * max|ref| ({})    compared {} tensors ({} not compared)",
        report.tolerances.atol,
        report.tolerances.rtol,
        report.tolerances.range_tol,
        tolerance_origin(&report.tolerances),
        compared,
        report.not_compared.len()
    );
    for t in &report.tolerances.by_tensor {
        let tol = &t.tolerance;
        let _ = writeln!(
            out,
            "           '{}': |cand - ref| <= {} + {} * |ref| + {} * max|ref| (given for it)",
            t.tensor, tol.atol, tol.rtol, tol.range_tol
        );
    }
    for line in &judging_lines {
        let _ = writeln!(out, "{line}");
    }
    if let Some(m) = &report.extras.matching {
        let _ = writeln!(
            out,
            "matching   {}: {} tensors by name, {} by structure; {} reference tensors unmatched (not compared), {} candidate tensors unpaired",
            m.mode,
            m.by_name,
            m.by_structure,
            m.unmatched_reference.len(),
            m.unmatched_candidate.len()
        );
    }
    if let Some(cf) = &report.extras.control_flow {
        for i in &cf.inlined {
            let mut what =
                if i.op_type == "Loop" { format!("unrolled, {}", i.taken) } else { format!("{} taken", i.taken) };
            if let Some(other) = &i.candidate_taken {
                what.push_str(&format!(" by the reference, {other} by the candidate model"));
            }
            let _ = writeln!(
                out,
                "control    {} '{}': {what}; its {} nodes compared as '{}/...'",
                i.op_type, i.node, i.nodes, i.node
            );
        }
        for (node, why) in &cf.kept {
            let _ = writeln!(out, "control    '{node}' left as it is, its body not compared: {why}");
        }
    }
    for i in &report.inputs {
        let nonfinite = if i.nan + i.inf > 0 {
            format!("  WARNING: {} NaN, {} inf in this input", i.nan, i.inf)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "input      {} {} {} from {}{nonfinite}",
            i.name,
            i.dtype,
            i.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x"),
            i.source
        );
    }
    out.push('\n');

    let v = &report.verdict;
    let _ = writeln!(out, "{}", crate::verdict_headline(report));
    for a in &report.extras.answers {
        let _ = writeln!(out, "  {}", a.line());
    }
    if let Some(fd) = &v.first_divergent {
        let _ = writeln!(out, "\nFirst divergent layer: {} ({})", fd.node, fd.op_type);
        let _ = writeln!(out, "  tensor  {}", fd.tensor);
        let _ = writeln!(
            out,
            "  error   inputs {} -> output {} (relative L2)",
            fd.input_error.map_or("not compared".to_string(), num),
            num(fd.output_error)
        );
        let _ = writeln!(out, "  cause   {}: {}", crate::cause_name(fd.cause.best.kind), fd.cause.best.detail);
        for alt in &fd.cause.alternatives {
            let share = alt.explains.map_or("share unknown".to_string(), |e| format!("explains {:.0}%", 100.0 * e));
            let _ = writeln!(out, "  also    {} ({share}): {}", crate::cause_name(alt.kind), alt.detail);
        }
        if let Some(layer) = report.first_divergent_detail.as_ref().and_then(|d| d.engine_layer.as_ref()) {
            let _ =
                writeln!(out, "  engine  inside TensorRT layer {} ({} ONNX nodes fused)", layer.name, layer.onnx_nodes);
        }
    } else if let Some(end) = &v.sight_ends {
        let _ = writeln!(
            out,
            "\nSight ends at: {} ({}), tensor {} (rel L2 {})",
            end.node,
            end.op_type,
            end.tensor,
            num(end.output_error)
        );
        for (t, why) in &end.unseen_inputs {
            let _ = writeln!(out, "  input not compared: {t}: {why}");
        }
    } else if v.status == Status::Diverged {
        let _ = writeln!(out, "\nNo single layer is named.");
    }
    let e = &report.extras;
    if !v.chain.is_empty() {
        let isolated = |node: &str| e.isolation.as_ref().and_then(|iso| iso.nodes.iter().find(|n| n.node == node));
        let header =
            if e.isolation.is_some() { "; 'alone' = the node run by itself on the reference's inputs" } else { "" };
        let _ = writeln!(out, "\nBlame chain (worst output back to the first divergent layer){header}:");
        let names = crate::shorten_distinct(&v.chain.iter().map(|s| s.tensor.as_str()).collect::<Vec<_>>(), 40);
        for (i, s) in v.chain.iter().enumerate() {
            let nf = if s.nonfinite > 0 { format!("  {} inf/NaN", s.nonfinite) } else { String::new() };
            let local =
                isolated(&s.node).map(|l| format!("  alone {:>9} {}", num(l.local_error), l.role)).unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:>3}. {:<40} {:<22} rel L2 {:>9}  max abs {:>9}{local}{nf}",
                i,
                names[i],
                shorten(&s.op_type, 22),
                num(s.error),
                num(s.max_abs_err)
            );
        }
    }
    if let Some(iso) = &e.isolation {
        // Why an 'alone' number does not decide the role, where it does not (an input beyond
        // FP16's range in the reference: the node's inf alone comes from upstream).
        for n in iso.nodes.iter().filter(|n| v.chain.iter().any(|s| s.node == n.node)) {
            if let Some(note) = &n.note {
                let _ = writeln!(out, "  {} {} ({}): {note}", n.role, n.tensor, n.node);
            }
        }
        for (node, why) in &iso.skipped {
            let _ = writeln!(out, "  not run alone: {node}: {why}");
        }
    }
    if let Some(cf) = &e.counterfactual {
        let _ = writeln!(
            out,
            "\nCounterfactual (candidate re-run with the break kept at reference precision; '{}' rel L2 {}):",
            cf.output,
            num(cf.output_error)
        );
        for c in &cf.checks {
            let effect = c.effect(cf.output_error, None, cf.shape_differs);
            let _ = writeln!(
                out,
                "  {:<40} {:<22} -> {:>9}  {effect}{}",
                shorten(&c.node, 40),
                format!("{} ({})", c.reason, c.kept.len()),
                num(c.output_error_after),
                if c.fixes { ", fixes every output" } else { "" }
            );
        }
    }
    if let Some(sr) = &e.search {
        let marked: usize = sr.runs.iter().map(|r| r.marked.len()).sum();
        let _ = writeln!(
            out,
            "\nSearch marking: {} candidate runs, {} tensors marked in all (divergence threshold rel L2 {})",
            sr.runs.len(),
            marked,
            num(sr.threshold)
        );
        for (i, r) in sr.runs.iter().enumerate() {
            let what = if r.marked.is_empty() { "model outputs only".to_string() } else { r.marked.join(", ") };
            let _ = writeln!(out, "  run {:>2} {:<8} {}", i + 1, r.purpose, shorten(&what, 100));
        }
    }
    if let Some(mp) = e.memory.as_ref().filter(|m| m.groups > 1) {
        let _ = writeln!(out, "\nMemory: exposed tensors ~{} MiB per run, over the budget of {} MiB: compared in {} groups (largest ~{} MiB)", mp.estimated_bytes >> 20, mp.budget_bytes.unwrap_or(0) >> 20, mp.groups, mp.largest_group_bytes >> 20);
    }
    // Why the two sides were not compared in one session: a failed pairing costs memory and
    // time, and the user should see it without opening the JSON.
    if let Some(why) = e.memory.as_ref().and_then(|m| m.separate_because.as_deref()) {
        let _ = writeln!(out, "\nCompared after separate runs: {why}");
    }
    if let Some(sm) = &e.samples {
        let _ = writeln!(
            out,
            "\nSamples: {} (verdict from {}: diverged samples first, then the largest output error)",
            sm.count, sm.worst_sample
        );
        for r in &sm.runs {
            let nonfinite = r
                .nonfinite_inputs
                .map(|n| format!("  WARNING: {n} NaN/inf input values (only finite values judged)"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<30} {:<8} worst output rel L2 {:>9}  first divergent {}{nonfinite}",
                shorten(&r.sample, 30),
                format!("{:?}", r.status).to_lowercase(),
                num(r.worst_output_error),
                r.first_divergent.as_deref().unwrap_or("-")
            );
        }
    }
    if !v.non_finite.is_empty() {
        let origins: Vec<String> =
            v.non_finite.iter().filter(|n| n.origin).map(|n| format!("{} ({})", n.node, n.op_type)).collect();
        let born = if origins.is_empty() {
            "born at no node: they enter with an input or a weight".to_string()
        } else {
            format!("born at: {}", origins.join(", "))
        };
        let _ = writeln!(out, "\n{}: {} tensors; {born}", crate::non_finite_heading(v), v.non_finite.len());
        for n in v.non_finite.iter().filter(|n| n.origin && !n.on_chain) {
            let what = if n.weight { "weight value" } else { "off the blame chain" };
            let _ = writeln!(
                out,
                "  {what}: '{}' from {} ({}) holds {} inf/NaN",
                n.tensor, n.node, n.op_type, n.mismatched
            );
        }
    }
    if !report.weights_out_of_fp16_range.is_empty() {
        let over: Vec<String> = report
            .weights_out_of_fp16_range
            .iter()
            .filter(|w| w.overflow_count > 0)
            .map(|w| format!("{} (max |w| {:.3e})", w.name, w.max_abs))
            .collect();
        if !over.is_empty() {
            let _ = writeln!(out, "\nWeights beyond the FP16 range: {}", over.join(", "));
        }
    }

    // The shown tensors, escaped, in the order sorted above.
    let worst = &report.tensors;
    let closing = render_verdict_text(report);
    if !worst.is_empty() && top > 0 {
        let _ = writeln!(out, "\nWorst tensors:");
        let _ = writeln!(
            out,
            "  {:<40} {:<18} {:>9} {:>9} {:>9} {:>8} {:>8}  pass",
            "tensor", "op", "rel L2", "max abs", "max rel", "cosine", "SNR dB"
        );
        let names = crate::shorten_distinct(&worst.iter().take(top).map(|t| t.name.as_str()).collect::<Vec<_>>(), 40);
        for (t, name) in worst.iter().take(top).zip(&names) {
            let mm = &t.metrics;
            let _ = writeln!(
                out,
                "  {:<40} {:<18} {:>9} {:>9} {:>9} {:>8.5} {:>8.1}  {}",
                name,
                shorten(&t.op_type, 18),
                num(t.error_level()),
                num(mm.max_abs_err),
                num(mm.max_rel_err),
                mm.cosine,
                mm.snr_db,
                if t.pass { "yes" } else { "NO" }
            );
        }
    }
    out.push_str(&closing);
    out
}

/// A copy of `report` holding `tensors` in place of its own (none of which is cloned).
fn with_tensors(report: &Report, tensors: Vec<layerwise_analysis::TensorRecord>) -> Report {
    Report {
        schema: report.schema.clone(),
        layerwise_version: report.layerwise_version.clone(),
        model: report.model.clone(),
        reference: report.reference.clone(),
        cand: report.cand.clone(),
        tolerances: report.tolerances.clone(),
        inputs: report.inputs.clone(),
        tensors,
        not_compared: report.not_compared.clone(),
        weights_out_of_fp16_range: report.weights_out_of_fp16_range.clone(),
        outputs: report.outputs.clone(),
        worst_output: report.worst_output.clone(),
        verdict: report.verdict.clone(),
        first_divergent_detail: report.first_divergent_detail.clone(),
        extras: report.extras.clone(),
        run_info: report.run_info.clone(),
    }
}

/// The verdict as every format states it: the headline, the summary, then the conclusions of the
/// runs after the walk. The terminal ends with it.
pub fn render_verdict_text(report: &Report) -> String {
    let report = &crate::escape::for_terminal(report);
    let mut out = String::new();
    let v = &report.verdict;
    let _ = writeln!(out, "\n{}", crate::verdict_headline(report));
    // What the numbers mean to the user first: did the answer change (`--task`).
    for a in &report.extras.answers {
        let _ = writeln!(out, "  {}", a.line());
    }
    let _ = writeln!(out, "  {}", v.summary);
    for c in &v.conclusions {
        let _ = writeln!(out, "  - {c}");
    }
    out
}

/// "TF32 defaults" where the tolerances are that precision's defaults, "as given" otherwise.
fn tolerance_origin(t: &crate::json::Tolerances) -> String {
    // A report read back may name defaults no arithmetic has (written by hand): said as given.
    let Some(arithmetic) = layerwise_model::Arithmetic::from_name(&t.defaults_for) else {
        return format!("as given; no defaults are named '{}'", t.defaults_for);
    };
    let (defaults, _) = layerwise_analysis::defaults_and_rule(arithmetic);
    if (t.atol, t.rtol, t.range_tol) == (defaults.atol, defaults.rtol, defaults.range_tol) {
        format!("{} defaults", t.defaults_for)
    } else {
        format!(
            "as given; {} defaults are {} + {} * |ref| + {} * max|ref|",
            t.defaults_for, defaults.atol, defaults.rtol, defaults.range_tol
        )
    }
}

/// The header's lines on how tensors were judged beyond the tolerance line: how many hold integers
/// (judged exactly), and each output judged part by part. Read from every record, names escaped.
fn judging_lines(report: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    let integers = report.tensors.iter().filter(|r| r.holds_integers).count();
    if integers > 0 {
        lines.push(format!(
            "           {integers} tensors hold integers (indices, counts, rounded values, truth values; not quantizer codes): judged exactly"
        ));
    }
    for r in report.tensors.iter().filter(|r| r.is_output) {
        if let Some(p) = &r.metrics.parts {
            let parts: Vec<String> = p
                .parts
                .iter()
                .zip(&p.ranges)
                .map(|((first, size), range)| format!("{first}..={} max|ref| {}", first + size - 1, num(*range)))
                .collect();
            lines.push(format!(
                "           '{}': judged part by part along axis {} (the parts its Concat joins: {}), each by its own range: {} of {} out of tolerance{}",
                crate::escape::terminal(&r.name),
                p.axis,
                parts.join(", "),
                p.failing.len(),
                p.parts.len(),
                match p.worst_part {
                    Some(k) => format!(
                        "; its relative L2 is part {k}'s ({}), the whole tensor's {}",
                        num(r.metrics.rel_l2_err),
                        num(p.whole_rel_l2)
                    ),
                    None => String::new(),
                }
            ));
        }
    }
    lines
}
