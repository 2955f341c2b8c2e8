//! Is the reference the model? Every tensor exposed as an output can change how ONNX Runtime runs
//! a graph (which buffers it reuses, which nodes it fuses), and a graph with random ops computes
//! something else each run. The chosen sample's model outputs from the exposed run are checked
//! against a plain run of the same reference (outputs only, as the model is deployed): where they
//! differ, the verdict says so, since the comparison is then of a run the model does not make.

use layerwise_analysis::Comparison;
use layerwise_model::{shape_string, GraphIndex};
use layerwise_runtime::RunOutput;

/// Relative difference of an output's largest magnitude between the two runs beyond which they
/// are different computations (another fusion moves float32 values by far less).
const SAME_RUN: f64 = 1e-4;

/// The outputs on which the exposed reference run and `plain` differ, in words: shape, largest
/// magnitude, or inf/NaN counts. Outputs either run lacks are left out (a weight or an input passed
/// straight to an output).
pub(super) fn differences(index: &GraphIndex, comparison: &Comparison, plain: &RunOutput) -> Vec<String> {
    let mut found = Vec::new();
    for output in &index.outputs {
        let (Some(exposed), Some(plain)) = (comparison.get(output), plain.tensors.get(output)) else { continue };
        if exposed.shape != plain.shape {
            found.push(format!(
                "'{output}' has shape {} in the run with every tensor exposed and {} in a plain run",
                shape_string(&exposed.shape),
                shape_string(&plain.shape)
            ));
            continue;
        }
        // A record whose two sides could not be compared (another shape in the candidate) holds no
        // reference statistics: its zeros are no value of the run (piper's output "reached 0").
        if exposed.mismatch.is_some() {
            continue;
        }
        let values = plain.to_f32();
        let (nan, inf) = plain.non_finite_counts();
        let largest = values.iter().filter(|v| v.is_finite()).fold(0f64, |m, v| m.max(v.abs() as f64));
        let m = &exposed.metrics;
        if (nan, inf) != (m.ref_nan, m.ref_inf) {
            found.push(format!(
                "'{output}' holds {} NaN and {} inf in the run with every tensor exposed, {nan} and {inf} in a plain run",
                m.ref_nan, m.ref_inf
            ));
        } else if (largest - m.ref_max_abs).abs() > SAME_RUN * largest.max(m.ref_max_abs) {
            found.push(format!(
                "'{output}' reaches {} at most in the run with every tensor exposed and {} in a plain run",
                layerwise_report::format_number(m.ref_max_abs),
                layerwise_report::format_number(largest)
            ));
        }
    }
    found
}

/// What a plain run with ONNX Runtime's graph optimizations off told of the differences: with
/// them off the plain run gives the exposed run's outputs (the fusions differ), or it still
/// differs (buffer reuse or random ops), or it was not made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    Fusions,
    NotFusions,
    NotMeasured,
}

/// The verdict's sentence for `differences`, where there are any.
pub(super) fn conclusion(differences: &[String], why: Why) -> Option<String> {
    let why = match why {
        Why::Fusions => "why, measured: ONNX Runtime's graph optimizations; a plain run with them off gives the exposed run's outputs, so the two runs fuse the graph differently",
        Why::NotFusions => "a plain run with ONNX Runtime's graph optimizations off differs from the exposed run too, so it is not the fusions; buffer reuse or random ops remain, which this check does not tell apart",
        Why::NotMeasured => "why is not known from this check: exposing outputs can change ONNX Runtime's buffer reuse and fusions, and random ops differ run to run",
    };
    (!differences.is_empty()).then(|| {
        format!(
            "the reference with every tensor exposed is not what the model computes: {}; every number here compares runs with every tensor exposed, which the deployed model does not make ({why})",
            differences.join("; ")
        )
    })
}

/// Ops that draw random values: without a `seed` attribute each run draws others.
const RANDOM_OPS: &[&str] =
    &["RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"];

/// The main-graph nodes that draw random values without a seed, in graph order.
pub(super) fn unseeded_random_nodes(graph: &layerwise_model::onnx::GraphProto, index: &GraphIndex) -> Vec<String> {
    index
        .nodes
        .iter()
        .filter(|n| n.domain.is_empty() && RANDOM_OPS.contains(&n.op_type.as_str()))
        .filter(|n| !graph.node[n.proto_index].attribute.iter().any(|a| a.name() == "seed"))
        .map(|n| format!("{} ({})", n.name, n.op_type))
        .collect()
}

/// The verdict's sentence for unseeded random nodes, where there are any: the reference and the
/// candidate draw different values there, so what follows them differs for that reason too (a
/// VITS voice's noise scales made two plain runs of the reference differ in length).
pub(super) fn random_conclusion(nodes: &[String]) -> Option<String> {
    (!nodes.is_empty()).then(|| {
        format!(
            "the model draws random values without a seed at {} node{} ({}): every run, the reference's and the candidate's, draws others, so what they feed differs run to run whatever the precision; feed them fixed values (a noise scale of 0, or the node's output as an input) to compare precision alone",
            nodes.len(),
            if nodes.len() == 1 { "" } else { "s" },
            nodes.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
                + &if nodes.len() > 3 { format!(" and {} more", nodes.len() - 3) } else { String::new() }
        )
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use layerwise_analysis::{compare_all, Tolerance};
    use layerwise_model::builder::{Dim, ModelBuilder};
    use layerwise_model::{DataType, GraphIndex, Model};
    use layerwise_runtime::{RunOutput, Tensor};

    use super::{conclusion, differences};

    /// The exposed run's output `y` (the comparison's reference side) against a plain run's.
    fn check(exposed: Tensor, plain: Tensor) -> Vec<String> {
        let mut b = ModelBuilder::new("one", 17);
        b.input("x", DataType::Float, &[Dim::from(4)]);
        b.node("Relu", "relu", &["x"], &["y"], vec![]);
        b.output("y", DataType::Float);
        let model = Model::from_proto(b.build(), "one").unwrap();
        let index = GraphIndex::build(model.graph()).unwrap();
        let side: HashMap<String, Tensor> = [("y".to_string(), exposed)].into();
        let comparison = compare_all(&index, &index.outputs, &side, &side, &Tolerance::FP16.into());
        let plain = RunOutput { tensors: [("y".to_string(), plain)].into(), ..Default::default() };
        differences(&index, &comparison, &plain)
    }

    #[test]
    fn the_same_run_differs_in_nothing() {
        let y = Tensor::f32(vec![4], vec![1.0, -2.0, 3.0, 0.5]);
        assert!(check(y.clone(), y).is_empty());
        // Another fusion moves float32 values by far less than the threshold.
        let moved = Tensor::f32(vec![4], vec![1.0, -2.0, 3.000_000_2, 0.5]);
        assert!(check(Tensor::f32(vec![4], vec![1.0, -2.0, 3.0, 0.5]), moved).is_empty());
    }

    #[test]
    fn another_length_values_or_inf_count_are_named() {
        let exposed = Tensor::f32(vec![4], vec![1.0, -2.0, 3.0, 0.5]);
        let longer = check(exposed.clone(), Tensor::f32(vec![5], vec![1.0, -2.0, 3.0, 0.5, 0.0]));
        assert_eq!(longer, ["'y' has shape 4 in the run with every tensor exposed and 5 in a plain run"]);
        let other = check(exposed.clone(), Tensor::f32(vec![4], vec![1.0, -2.0, 3.5, 0.5]));
        assert!(other[0].contains("reaches 3") && other[0].contains("3.5"), "{other:?}");
        let inf = check(exposed, Tensor::f32(vec![4], vec![1.0, f32::INFINITY, 3.0, 0.5]));
        assert!(inf[0].contains("0 NaN and 0 inf") && inf[0].contains("0 and 1 in a plain run"), "{inf:?}");
        let said = conclusion(&inf, super::Why::NotMeasured).unwrap();
        assert!(said.starts_with("the reference with every tensor exposed is not what the model computes"), "{said}");
        assert!(conclusion(&[], super::Why::Fusions).is_none());
    }
}
