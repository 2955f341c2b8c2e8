//! The `layerwise fix` report (`layerwise.fix/1`, see docs/fix.md): typed like [`crate::Report`],
//! read back by the Markdown summary, the Python package and the golden tests.

use std::fmt::{self, Write};

use layerwise_analysis::num::FiniteOrString;
use layerwise_analysis::{NoiseFloor, Status};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{format_number, RunInfo};

pub const FIX_SCHEMA: &str = "layerwise.fix/1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FixStatus {
    Fixed,
    NotFixed,
}

/// A step of the keep-list search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FixStage {
    /// Nothing kept: the candidate as it is.
    Diagnose,
    /// The breaks' recognised patterns kept.
    Pattern,
    /// A contiguous run of nodes in topological order kept.
    Region,
    /// Parts of the region dropped again.
    Prune,
}

impl FixStage {
    pub const ALL: [FixStage; 4] = [FixStage::Diagnose, FixStage::Pattern, FixStage::Region, FixStage::Prune];

    pub fn name(self) -> &'static str {
        match self {
            FixStage::Diagnose => "diagnose",
            FixStage::Pattern => "pattern",
            FixStage::Region => "region",
            FixStage::Prune => "prune",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct KeptPattern {
    pub kind: String,
    pub nodes: Vec<String>,
    /// The break that made the search keep it.
    pub because: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Round {
    pub stage: FixStage,
    pub keep_fp32: usize,
    pub status: Status,
    pub worst_output: Option<String>,
    pub first_divergent: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OutputChange {
    pub name: String,
    #[serde(with = "layerwise_analysis::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub before_rel_l2: f64,
    pub before_pass: bool,
    #[serde(with = "layerwise_analysis::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub after_rel_l2: f64,
    pub after_pass: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ModelCheck {
    pub backend: String,
    pub structural_problems: Vec<String>,
    pub outputs: Vec<OutputChange>,
    pub pass: bool,
    /// Why the fixed model could not be evaluated; `null` when it was.
    pub not_run: Option<String>,
}

/// How a written model fared in ONNX Runtime's default session in a child process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoadStatus {
    /// A default session was created and run.
    Loads,
    /// The default session (optimization level `all`) fails, a lower level loads and runs it:
    /// a limitation of ONNX Runtime's graph optimizations, not of the model.
    RunsBelowDefault,
    /// ONNX Runtime refused it with a message.
    Error,
    /// The process died.
    Crashed,
    /// No layerwise executable to run the child with.
    NotChecked,
}

impl fmt::Display for LoadStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LoadStatus::Loads => "loads",
            LoadStatus::RunsBelowDefault => "runs_below_default",
            LoadStatus::Error => "error",
            LoadStatus::Crashed => "crashed",
            LoadStatus::NotChecked => "not_checked",
        })
    }
}

/// What the child process found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoadCheck {
    pub status: LoadStatus,
    pub detail: Option<String>,
    /// Op types kept in FP32 because the model crashed ONNX Runtime without that.
    pub kept_ops: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FixReport {
    #[schemars(extend("const" = FIX_SCHEMA))]
    pub schema: String,
    pub model: String,
    pub reference: String,
    pub candidate: String,
    pub status: FixStatus,
    pub summary: String,
    pub node_count: usize,
    pub keep_fp32: Vec<String>,
    pub patterns: Vec<KeptPattern>,
    pub rounds: Vec<Round>,
    /// Candidate runs the search made (the first, diagnosing run included); each runs every
    /// sample.
    pub candidate_runs: usize,
    /// The samples the keep list was searched and checked on (`--inputs DIR`, or a list of
    /// samples from Python); empty for one sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<String>,
    /// How sensitive the worst output is to one rounding of every value the candidate rounds
    /// (see bisect). Null where not measured: the search passed, `--no-noise-floor`, or the
    /// candidate's error on the worst output is not finite (no finite floor can match it, so it
    /// could not stop the search).
    pub noise_floor: Option<NoiseFloor>,
    /// Error of every model output before (nothing kept) and after (with the keep list).
    pub outputs: Vec<OutputChange>,
    /// The same fix for weakly typed TensorRT 10 (layer names = ONNX node names).
    pub trtexec_flags: String,
    pub fixed_model: Option<String>,
    /// Nodes FP32 in the fixed model: the keep list plus ops that always stay FP32.
    pub fixed_model_fp32_nodes: Vec<(String, String)>,
    /// The fixed model loaded and run with ONNX Runtime's defaults in a child process (an FP16
    /// model can crash ONNX Runtime), and the op types kept in FP32 because of a crash.
    pub fixed_model_load: Option<LoadCheck>,
    /// The fixed model (the file written with -o, or a scratch copy) evaluated in its own types
    /// against the reference: FIXED needs it to pass.
    pub fixed_model_check: Option<ModelCheck>,
    /// Where FP16 needs a large keep list (or none is found): the model run whole in BF16
    /// (`sim:bf16`, nothing kept) and judged by BF16's tolerances on every sample, measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_precision: Option<OtherPrecision>,
    /// What the keep list was held to, where not every output's element-wise tolerance (`fix
    /// --target`): `answer` (every case of each output judged by its answers unchanged; the other
    /// outputs within tolerance), or `answer:SHARE` (at least that share of each one's cases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The answers of the outputs judged by them (`--task`, or a classifier recognised by its
    /// Softmax), over the samples: of the written model where it was checked, else of the last
    /// candidate run. Empty where no output is judged by its answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<layerwise_analysis::AnswerRecord>,
    pub run_info: RunInfo,
}

/// Another precision tried whole, with nothing kept: what a user could switch to instead of a
/// large keep list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OtherPrecision {
    /// The candidate that ran (`sim:bf16`).
    pub candidate: String,
    /// Every output within that precision's tolerances on every sample.
    pub pass: bool,
    /// The worst model output's relative L2 error over the samples.
    pub worst_output_rel_l2: f64,
    /// The tolerance it was judged by (relative), that precision's default unless given.
    pub rtol: f64,
}

/// The terminal summary of a fix. `precision` names the candidate's reduced precision (`FP16`,
/// `BF16`) in the outputs' column heading. Every name and message in it is shown with its control
/// and bidi characters escaped.
/// Keep-list groups the terminal lists one by one, and nodes it names in a group.
const MOST_GROUPS_SHOWN: usize = 8;
const MOST_NODES_SHOWN: usize = 12;

/// A keep-list group's nodes in one line: all of them where there are few, else their count with
/// the first two and the last (the fix report and the keep-list file hold every one).
pub fn kept_nodes(nodes: &[String]) -> String {
    match nodes.len() {
        n if n > MOST_NODES_SHOWN => format!("{n} nodes: {}, {}, …, {}", nodes[0], nodes[1], nodes[n - 1]),
        _ => nodes.join(", "),
    }
}

pub fn render_fix_terminal(r: &FixReport, precision: &str) -> String {
    let left_out: Vec<(String, &str)> = crate::escape::trtexec_left_out(&r.keep_fp32)
        .into_iter()
        .map(|(n, why)| (crate::escape::terminal(n).into_owned(), why))
        .collect();
    let r = &crate::escape::for_terminal(r);
    let num = format_number;
    let mut out = String::new();
    let _ = writeln!(out, "FIX: {} - {}", if r.status == FixStatus::Fixed { "FIXED" } else { "NOT FIXED" }, r.summary);
    // A large keep list is shown by group, each cut to its first and last nodes; the full list is
    // in the JSON and the keep-list file.
    for p in r.patterns.iter().take(MOST_GROUPS_SHOWN) {
        let _ = writeln!(out, "  keep {} [{}]\n    because {}", p.kind, kept_nodes(&p.nodes), p.because);
    }
    if r.patterns.len() > MOST_GROUPS_SHOWN {
        let rest: usize = r.patterns[MOST_GROUPS_SHOWN..].iter().map(|p| p.nodes.len()).sum();
        let _ = writeln!(
            out,
            "  … and {} more groups ({rest} nodes): every node in the fix report (--json) and the keep list",
            r.patterns.len() - MOST_GROUPS_SHOWN
        );
    }
    let stages: Vec<String> = FixStage::ALL
        .iter()
        .map(|st| (st.name(), r.rounds.iter().filter(|x| x.stage == *st).count()))
        .filter(|(_, n)| *n > 0)
        .map(|(st, n)| format!("{st} {n}"))
        .collect();
    let _ = writeln!(out, "  rounds: {}", stages.join(", "));
    // A converted model's "before" is the file convert writes with nothing kept: its own FP32
    // nodes (ops that stay FP32, quantizers, weights beyond range) are FP32 there, which a plain
    // `bisect --cand sim:*` does not keep, so their numbers can differ.
    let before = match precision {
        "FP16" | "BF16" if r.fixed_model_fp32_nodes.iter().any(|(_, why)| why != "--keep-fp32") => {
            format!("{precision} as converted with nothing kept")
        }
        _ => precision.to_string(),
    };
    let _ = writeln!(out, "  outputs (relative L2, {before} -> with keep list):");
    for o in &r.outputs {
        let _ = writeln!(
            out,
            "    {:<30} {:>9} -> {:>9}  {}",
            o.name,
            num(o.before_rel_l2),
            num(o.after_rel_l2),
            if o.after_pass { "pass" } else { "FAIL" }
        );
    }
    // The answers of the outputs judged by them: the written model's where it was checked.
    if !r.answers.is_empty() {
        let whose = if r.fixed_model_check.as_ref().is_some_and(|c| c.not_run.is_none()) {
            "the written model"
        } else {
            "the last candidate run"
        };
        let held_to = match &r.target {
            Some(target) => format!("the keep list was held to them: --target {target}"),
            None => "the keep list was held to the element-wise tolerance".to_string(),
        };
        let _ = writeln!(out, "  answers of {whose} ({held_to}):");
        for a in &r.answers {
            let _ = writeln!(out, "    {}", a.line());
        }
    }
    if !r.trtexec_flags.is_empty() {
        let _ = writeln!(out, "  TensorRT 10 (weakly typed): trtexec --onnx=MODEL {}", r.trtexec_flags);
    }
    if !left_out.is_empty() {
        let _ = writeln!(out, "  {}", trtexec_left_out_note(&left_out, |n| format!("'{n}'")));
    }
    if let Some(o) = &r.other_precision {
        let _ = writeln!(
            out,
            // The relative L2 is shown, not tested: each element is judged by the tolerance, whose
            // relative term rtol is no bound on it (9.4e-2 beside an rtol of 8e-2 is no contradiction).
            "  {} with nothing kept: {} (worst output relative L2 {}; each element judged by the tolerance's absolute, relative (rtol {}) and range terms)",
            o.candidate,
            if o.pass { "every output within tolerance" } else { "out of tolerance too" },
            num(o.worst_output_rel_l2),
            num(o.rtol)
        );
    }
    if let Some(path) = &r.fixed_model {
        let _ = writeln!(
            out,
            "  fixed model: {path} ({} FP32 nodes), keep list: {path}.keep-fp32.json",
            r.fixed_model_fp32_nodes.len()
        );
    }
    if let Some(load) = &r.fixed_model_load {
        let kept = if load.kept_ops.is_empty() {
            String::new()
        } else {
            format!(" ({} kept in FP32 for that)", load.kept_ops.join(", "))
        };
        let _ = writeln!(
            out,
            "  load: ONNX Runtime's default session in a child process -> {}{kept}{}",
            load.status,
            load.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
        );
    }
    if let Some(check) = r.fixed_model_check.as_ref().filter(|c| c.not_run.is_some()) {
        let _ = writeln!(out, "  check: {} not run: {}", check.backend, check.not_run.as_deref().unwrap_or_default());
    } else if let Some(check) = &r.fixed_model_check {
        let worst = check.outputs.iter().map(|o| o.after_rel_l2).fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "  check: {} -> {} (worst output relative L2 {}){}",
            check.backend,
            if check.pass { "pass" } else { "FAIL" },
            num(worst),
            if check.structural_problems.is_empty() {
                String::new()
            } else {
                format!("; type problems: {}", check.structural_problems.join("; "))
            }
        );
    }
    out
}

/// The note under a printed trtexec line naming the kept nodes left out of it; `name` shows one
/// name in the medium.
pub(crate) fn trtexec_left_out_note(left_out: &[(String, &str)], name: impl Fn(&str) -> String) -> String {
    let names: Vec<String> = left_out.iter().map(|(n, why)| format!("{} ({why})", name(n))).collect();
    format!("not in --layerPrecisions, keep in FP32 by hand (the keep list has every node): {}", names.join(", "))
}

/// A fix report as HTML (a notebook's view of it): the status, the keep list with why, each
/// output before and after, and the check of the written file. Tables are left-aligned against a
/// notebook's own styles.
pub fn render_fix_html(r: &FixReport) -> String {
    use crate::svg::esc;
    let num = format_number;
    let fixed = r.status == FixStatus::Fixed;
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<div class="layerwise-fix"><style>.layerwise-fix table{{border-collapse:collapse;font-size:13px}}.layerwise-fix td,.layerwise-fix th{{text-align:left !important;padding:3px 8px;border-bottom:1px solid #eee;vertical-align:top}}.layerwise-fix td.n{{text-align:right !important;font-variant-numeric:tabular-nums}}.layerwise-fix h3{{margin:4px 0;padding:8px;color:#fff;background:{}}}</style><h3>{}</h3><p>{}</p>"#,
        if fixed { "#2e7d32" } else { "#c62828" },
        if fixed { "FIXED" } else { "NOT FIXED" },
        esc(&r.summary)
    );
    // The answers, as the terminal shows them.
    for a in &r.answers {
        let _ = write!(h, r#"<p class="answer"><b>{}</b></p>"#, esc(&a.line()));
    }
    if !r.patterns.is_empty() {
        h.push_str("<table><thead><tr><th>keep in FP32</th><th>nodes</th><th>because</th></tr></thead><tbody>");
        for p in &r.patterns {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&p.kind),
                esc(&p.nodes.join(", ")),
                esc(&p.because)
            );
        }
        h.push_str("</tbody></table>");
    }
    h.push_str("<table><thead><tr><th>output</th><th>relative L2, nothing kept</th><th>with the keep list</th><th></th></tr></thead><tbody>");
    for o in &r.outputs {
        let _ = write!(
            h,
            r#"<tr><td>{}</td><td class="n">{}</td><td class="n">{}</td><td>{}</td></tr>"#,
            esc(&o.name),
            num(o.before_rel_l2),
            num(o.after_rel_l2),
            if o.after_pass { "pass" } else { "<b>FAIL</b>" }
        );
    }
    h.push_str("</tbody></table>");
    if let Some(check) = &r.fixed_model_check {
        let said = match &check.not_run {
            Some(why) => format!("not run: {why}"),
            None => (if check.pass { "pass" } else { "FAIL" }).to_string(),
        };
        let _ = write!(h, "<p>Check of the written file: {} → {}</p>", esc(&check.backend), esc(&said));
    }
    if let Some(path) = &r.fixed_model {
        let _ =
            write!(h, "<p>Fixed model: <code>{}</code> ({} FP32 nodes)</p>", esc(path), r.fixed_model_fp32_nodes.len());
    }
    if !r.samples.is_empty() {
        let _ = write!(h, "<p>Searched and checked on {} samples.</p>", r.samples.len());
    }
    h.push_str("</div>");
    h
}
