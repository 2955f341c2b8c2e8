//! The native TensorRT build path, for real, with TensorRT-RTX's libraries (cargo feature
//! `tensorrt`): parse ONNX models, mark every tensor as an output, build engines on this machine
//! (no GPU needed), and map the engine's layers back to ONNX nodes. These tests fail when the
//! libraries are missing: `pip install tensorrt-rtx-cu13-libs==1.7.1.116` or set
//! LAYERWISE_TRT_LIB_DIR (`.ci/run` does).
#![cfg(feature = "tensorrt")]

use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::{DataType, GraphIndex, Model, Selection};
use layerwise_runtime::trt::{build_engine, TrtOptions};

fn conv_clip() -> Model {
    let mut b = ModelBuilder::new("conv-clip", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8), Dim::from(16), Dim::from(16)]);
    let w: Vec<f32> = (0..8 * 8 * 9).map(|i| ((i % 13) as f32 - 6.0) * 0.05).collect();
    b.initializer(f32_tensor("w", &[8, 8, 3, 3], &w));
    b.initializer(f32_tensor("lo", &[], &[0.0]));
    b.initializer(f32_tensor("hi", &[], &[6.0]));
    b.node("Conv", "conv", &["x", "w"], &["c"], vec![attr::ints("pads", &[1, 1, 1, 1])]);
    b.node("Clip", "clip", &["c", "lo", "hi"], &["y"], vec![]);
    b.node("Relu", "", &["y"], &["out"], vec![]);
    b.output("out", DataType::Float);
    Model::from_proto(b.build(), "conv-clip").unwrap()
}

#[test]
fn engines_build_on_this_machine_and_map_back_to_onnx_nodes() {
    let cache = tempfile::tempdir().unwrap();
    std::env::set_var("LAYERWISE_CACHE_DIR", cache.path());
    for model in [conv_clip(), Model::from_proto(layerwise::demo::demo_model(), "demo").unwrap()] {
        let index = GraphIndex::build(model.graph()).unwrap();
        let shapes = [(
            "x".to_string(),
            if model.path.to_string_lossy() == "demo" { vec![1, 8, 64] } else { vec![1, 8, 16, 16] },
        )];
        let built = build_engine(&model, &index, &Selection::All, &shapes, &TrtOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(built.size > 0 && !built.from_cache);
        assert_eq!(
            built.marked.len() + built.not_exposable.len(),
            index.nodes.len(),
            "every tensor marked, or reported as not exposable"
        );
        assert!(built.marked.len() * 2 > index.nodes.len(), "{:?} not exposable", built.not_exposable);
        assert!(!built.layers.is_empty());
        // Every ONNX node is computed by some engine layer, named as layerwise names it.
        for node in &index.nodes {
            assert!(
                built.layer_of(&node.name).is_some(),
                "{}: node '{}' in no layer: {:?}",
                model.path.display(),
                node.name,
                built.layers
            );
        }
        let again = build_engine(&model, &index, &Selection::All, &shapes, &TrtOptions::default()).unwrap();
        assert!(again.from_cache, "the second build comes from the engine cache");
        assert_eq!(again.layers, built.layers);
    }
}

#[test]
fn a_missing_library_is_a_clear_error() {
    // Checked through the locator so that the loaded library of the other test is not disturbed.
    let saved = std::env::var_os("LAYERWISE_TRT_LIB_DIR");
    std::env::set_var("LAYERWISE_TRT_LIB_DIR", "/nonexistent");
    let e = layerwise_runtime::trt::locate_libraries().unwrap_err().to_string();
    match saved {
        Some(v) => std::env::set_var("LAYERWISE_TRT_LIB_DIR", v),
        None => std::env::remove_var("LAYERWISE_TRT_LIB_DIR"),
    }
    assert!(e.contains("LAYERWISE_TRT_LIB_DIR=/nonexistent does not hold libtensorrt_rtx.so.1"), "{e}");
}
