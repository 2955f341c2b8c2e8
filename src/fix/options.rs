//! What `fix` takes and gives, and the files it writes, checked against what it reads before any
//! work.

use std::path::{Path, PathBuf};

use anyhow::Result;
use layerwise_model::Model;
use layerwise_report::FixReport;

use crate::pipeline::BisectOptions;
use crate::write_rule::check_writable_target;

/// Everything `layerwise fix` takes.
#[derive(Debug, Clone)]
pub struct FixOptions {
    pub bisect: BisectOptions,
    /// Where to write the fixed FP16 model (and `<output>.keep-fp32.json` beside it).
    pub output: Option<PathBuf>,
    /// Most rounds of adding a pattern before giving up.
    pub max_rounds: usize,
    /// What the keep list must bring about.
    pub target: FixTarget,
}

/// What a keep list must bring about (`--target`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FixTarget {
    /// Every output within tolerance, element by element (the default).
    Elementwise,
    /// The answers of the outputs judged by them (`--task`, or a classifier recognised by its
    /// Softmax) held on at least `share` of their cases (1: every case); every other output within
    /// tolerance.
    Answers { share: f64 },
}

impl FixTarget {
    /// `elementwise`, `answer`, or `answer:SHARE` with 0 < SHARE <= 1.
    pub fn parse(s: &str) -> Result<FixTarget, String> {
        match s.split_once(':') {
            None if s == "elementwise" => Ok(FixTarget::Elementwise),
            None if s == "answer" => Ok(FixTarget::Answers { share: 1.0 }),
            Some(("answer", share)) => match share.trim().parse::<f64>() {
                Ok(v) if v > 0.0 && v <= 1.0 => Ok(FixTarget::Answers { share: v }),
                _ => Err(format!(
                    "'{s}': the share of cases whose answer must hold is a number above 0 and at most 1 (e.g. answer:0.99)"
                )),
            },
            _ => Err(format!("'{s}' is not a target: elementwise, answer or answer:SHARE (e.g. answer:0.99)")),
        }
    }

    /// The share of cases whose answers must hold; `None` for the element-wise default.
    pub fn share(&self) -> Option<f64> {
        match self {
            FixTarget::Elementwise => None,
            FixTarget::Answers { share } => Some(*share),
        }
    }

    /// How the report names it: `answer`, `answer:0.99`; `None` for the element-wise default.
    pub fn name(&self) -> Option<String> {
        match self {
            FixTarget::Elementwise => None,
            FixTarget::Answers { share } if *share >= 1.0 => Some("answer".into()),
            FixTarget::Answers { share } => Some(format!("answer:{share}")),
        }
    }
}

pub struct FixOutcome {
    pub report: FixReport,
    pub text: String,
}

/// The keep list `fix -o OUT` writes beside the model: `OUT.keep-fp32.json`.
pub(crate) fn keep_list_path(out: &Path) -> PathBuf {
    PathBuf::from(format!("{}.keep-fp32.json", out.display()))
}

/// The exclusion list `fix -o OUT --cand-model QDQ.onnx` writes beside the model:
/// `OUT.nodes-to-exclude.json`.
pub(super) fn exclusion_list_path(out: &Path) -> PathBuf {
    PathBuf::from(format!("{}.nodes-to-exclude.json", out.display()))
}

/// What `fix -o OUT` writes: the model, and beside it the keep list (an output too: it must not
/// replace an input named like it), the weights file of a model over 1 GiB, and a quantized
/// candidate's exclusion list.
pub(super) fn files_written_at(out: &Path) -> [(&'static str, PathBuf); 4] {
    [
        ("-o", out.to_path_buf()),
        ("the keep list written beside -o", keep_list_path(out)),
        ("the weights file written beside -o (for a model over 1 GiB)", Model::oversized_data_path(out)),
        ("the exclusion list written beside -o (a quantized candidate)", exclusion_list_path(out)),
    ]
}

/// Every output of `fix` against what the run reads and each other ([`crate::write_rule`]),
/// before any work.
pub fn check_fix_outputs(options: &FixOptions) -> Result<()> {
    let b = &options.bisect;
    let mut reads = crate::pipeline::bisect_reads(b);
    for (what, path) in b.outputs.paths() {
        reads.check_output_file(path, &format!("the {what}"))?;
    }
    if let Some(out) = &options.output {
        check_writable_target(out, "the fixed model")?;
        if std::fs::metadata(out).is_ok_and(|m| !m.is_file()) {
            anyhow::bail!("-o {} is not a regular file: fix checks the model it writes by reading it back; give a file path, or leave -o out", out.display());
        }
        for (what, path) in files_written_at(out) {
            reads.check_output_file(&path, what)?;
        }
    }
    Ok(())
}
