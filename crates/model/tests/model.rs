use std::collections::HashSet;
use std::fs;

use bytes::Bytes;
use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::{tensor_proto, GraphProto, ModelProto, StringStringEntryProto, TensorProto};
use layerwise_model::perturb::{Perturbation, Perturbed};
use layerwise_model::rounding::Rounding;
use layerwise_model::{
    emulate, emulate_reusing, expose, float_weight_values, fp16, scan_fp16_weight_range, DataType, GraphIndex, Model,
    ModelError, RoundedWeights, Selection,
};
use prost::Message;

/// x -> Mul(w) -> a -> Relu -> b (output), with a Constant feeding an Add.
fn small_model() -> ModelProto {
    let mut b = ModelBuilder::new("small", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.initializer(f32_tensor("w", &[4], &[1.0001, 1e5, 2.0, -3.0]));
    b.node("Constant", "", &[], &["c"], vec![attr::tensor("value", f32_tensor("", &[1], &[70000.0]))]);
    b.node("Mul", "mul", &["x", "w"], &["a"], vec![]);
    b.node("Add", "", &["a", "c"], &["a2"], vec![]);
    b.node("Relu", "relu", &["a2"], &["b"], vec![]);
    b.output("b", DataType::Float);
    b.build()
}

fn values(model: &Model, t: &TensorProto) -> Vec<f32> {
    float_weight_values(model, t).unwrap()
}

#[test]
fn fp16_rounding_matches_ieee_half() {
    assert!(fp16::round_f32(1e5).is_infinite());
    assert_eq!(fp16::round_f32(1.0001), 1.0);
    assert_eq!(fp16::round_f32(65504.0), 65504.0);
    assert_eq!(fp16::round_f32(65519.0), 65504.0, "rounds to nearest, below the overflow threshold");
    assert!(fp16::round_f32(65520.0).is_infinite());
    assert_eq!(fp16::round_f32(-3.0), -3.0);
    assert!(fp16::overflows(-1e6) && !fp16::overflows(f32::INFINITY));
}

#[test]
fn index_orders_names_and_classifies() {
    // Nodes written out of order must come back topologically sorted.
    let mut proto = small_model();
    proto.graph.as_mut().unwrap().node.reverse();
    let index = GraphIndex::build(proto.graph.as_ref().unwrap()).unwrap();
    let order: Vec<&str> = index.nodes.iter().map(|n| n.op_type.as_str()).collect();
    assert_eq!(order, ["Mul", "Constant", "Add", "Relu"]);
    // Unnamed nodes get OpType#<position in the file> (reversed file: Add is at 1, Constant at 3).
    let names: HashSet<&str> = index.nodes.iter().map(|n| n.name.as_str()).collect();
    assert!(names.contains("Add#1") && names.contains("Constant#3"), "{names:?}");
    assert_eq!(index.producer("a2").unwrap().op_type, "Add");
    assert_eq!(index.consumers("a").len(), 1);
    assert!(index.is_constant_like("c") && index.is_constant_like("w") && !index.is_constant_like("a"));
    assert_eq!(index.inputs, ["x"]);
}

#[test]
fn duplicate_node_names_are_made_unique() {
    let mut b = ModelBuilder::new("dup", 17);
    b.input("x", DataType::Float, &[Dim::from(2)]);
    b.node("Relu", "same", &["x"], &["y"], vec![]);
    b.node("Relu", "same", &["y"], &["z"], vec![]);
    b.output("z", DataType::Float);
    let index = GraphIndex::build(b.build().graph.as_ref().unwrap()).unwrap();
    let names: Vec<&str> = index.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["same#0", "same#1"]);
}

#[test]
fn invalid_graphs_are_rejected_with_the_culprit_named() {
    let graph = |nodes: &[(&str, &[&str], &[&str])]| {
        let mut b = ModelBuilder::new("g", 17);
        b.input("x", DataType::Float, &[Dim::from(2)]);
        for (name, i, o) in nodes {
            b.node("Relu", name, i, o, vec![]);
        }
        b.output("y", DataType::Float);
        b.build().graph.unwrap()
    };
    let err = |g: GraphProto| GraphIndex::build(&g).unwrap_err().to_string();
    assert!(err(graph(&[("a", &["y"], &["t"]), ("b", &["t"], &["y"])])).contains("cycle"));
    assert!(err(graph(&[("a", &["nobody"], &["y"])])).contains("'nobody'"));
    assert!(err(graph(&[("a", &["x"], &["y"]), ("b", &["x"], &["y"])])).contains("produced by two nodes"));
    assert!(err(graph(&[("a", &["x"], &["t"])])).contains("graph output 'y' is not produced"));
}

#[test]
fn expose_all_adds_every_computed_tensor_once() {
    let proto = small_model();
    let index = GraphIndex::build(proto.graph.as_ref().unwrap()).unwrap();
    let (exposed, names) = expose(&proto, &index, &Selection::All).unwrap();
    let outputs: Vec<&str> = exposed.graph.as_ref().unwrap().output.iter().map(|o| o.name()).collect();
    assert_eq!(outputs, ["b", "c", "a", "a2"], "existing output first, then the rest, no duplicates");
    assert_eq!(names, ["c", "a", "a2", "b"], "reported in topological order");
    assert!(!outputs.contains(&"x") && !outputs.contains(&"w"), "inputs and initializers are not exposed");
    // Added outputs carry a name only.
    assert!(exposed.graph.as_ref().unwrap().output[1].r#type.is_none());
}

#[test]
fn expose_names_checks_each_name() {
    let mut b = ModelBuilder::new("if", 17);
    b.input("x", DataType::Float, &[Dim::from(2)]);
    b.input("cond", DataType::Bool, &[]);
    let mut branch = ModelBuilder::new("then", 17);
    branch.node("Relu", "inner", &["x"], &["inner_out"], vec![]);
    branch.output("inner_out", DataType::Float);
    let g = branch.build().graph.unwrap();
    b.node(
        "If",
        "branch",
        &["cond"],
        &["y"],
        vec![attr::graph("then_branch", g.clone()), attr::graph("else_branch", g)],
    );
    b.output("y", DataType::Float);
    let proto = b.build();
    let index = GraphIndex::build(proto.graph.as_ref().unwrap()).unwrap();
    assert_eq!(index.subgraph_owner("inner_out"), Some("branch"));
    let e = expose(&proto, &index, &Selection::Names(vec!["inner_out".into()])).unwrap_err();
    assert!(matches!(e, ModelError::SubgraphTensor { .. }), "{e}");
    let e = expose(&proto, &index, &Selection::Names(vec!["x".into()])).unwrap_err();
    assert!(matches!(e, ModelError::NotComputed(_)), "{e}");
    let e = expose(&proto, &index, &Selection::Names(vec!["nope".into()])).unwrap_err();
    assert!(matches!(e, ModelError::UnknownTensor(_)), "{e}");
    // Selecting all must not crash on the subgraph and must not expose its tensors.
    let (_, names) = expose(&proto, &index, &Selection::All).unwrap();
    assert_eq!(names, ["y"]);
}

#[test]
fn emulation_rounds_weights_and_wraps_float_outputs_in_cast_pairs() {
    let model = Model::from_proto(small_model(), "small").unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let (exposed, _) = expose(&model.proto, &index, &Selection::All).unwrap();
    let float: HashSet<String> = ["a", "a2", "b", "c"].iter().map(|s| s.to_string()).collect();
    let emu = emulate(&model, &exposed, &float, &HashSet::new(), layerwise_model::Rounding::Fp16).unwrap();
    let g = emu.proto.graph.as_ref().unwrap();
    let w = values(&model, &g.initializer[0]);
    assert_eq!(w[0], 1.0, "1.0001 rounds to 1.0");
    assert!(w[1].is_infinite(), "1e5 overflows to inf");
    assert_eq!(&w[2..], &[2.0, -3.0]);
    let constant = g.node.iter().find(|n| n.op_type() == "Constant").unwrap();
    let c = values(&model, constant.attribute[0].t.as_ref().unwrap());
    assert!(c[0].is_infinite(), "a Constant of 70000 overflows");
    // The input and each float node output: Cast(FLOAT16) then Cast(FLOAT), original name last.
    assert_eq!(emu.rounded_tensors, 5);
    for name in ["a", "a2", "b", "c"] {
        let back = g.node.iter().find(|n| n.output.first().map(String::as_str) == Some(name)).unwrap();
        assert_eq!(back.op_type(), "Cast");
        assert_eq!(back.attribute[0].i, Some(DataType::Float as i64));
        let half = g.node.iter().find(|n| n.output[0] == back.input[0]).unwrap();
        assert_eq!(half.op_type(), "Cast");
        assert_eq!(half.attribute[0].i, Some(DataType::Float16 as i64));
    }
    let mul = g.node.iter().find(|n| n.op_type() == "Mul").unwrap();
    assert_ne!(mul.input[0], "x", "the Mul reads the rounded input");
    assert_eq!(mul.output[0], "a__lw_fp32");
    // The rewrite is a valid graph in topological order.
    GraphIndex::build(g).unwrap();
}

#[test]
fn weight_scan_flags_overflow_and_subnormals() {
    let model = Model::from_proto(small_model(), "small").unwrap();
    let found = scan_fp16_weight_range(&model).unwrap();
    let names: Vec<&str> = found.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["w", "c"]);
    assert_eq!(found[0].overflow_count, 1);
    assert_eq!(found[0].max_abs, 1e5);
}

fn write(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn load_errors_are_specific() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(Model::load(&dir.path().join("absent.onnx")), Err(ModelError::NotFound(_))));
    let garbage = write(dir.path(), "garbage.onnx", b"this is plain text, not protobuf \xff\xff\xff");
    assert!(matches!(Model::load(&garbage), Err(ModelError::Decode { .. })));
    let full = small_model().encode_to_vec();
    let truncated = write(dir.path(), "truncated.onnx", &full[..full.len() / 2]);
    assert!(matches!(Model::load(&truncated), Err(ModelError::Decode { .. })));
    // Valid protobuf, but not a model: only an unknown field (field 100 = 1), an empty file, a
    // ModelProto without a graph.
    for (name, bytes) in [
        ("unknown.pb", vec![0xA0u8, 0x06, 0x01]),
        ("empty.onnx", vec![]),
        ("nograph.onnx", ModelProto { ir_version: Some(8), ..Default::default() }.encode_to_vec()),
    ] {
        let e = Model::load(&write(dir.path(), name, &bytes)).unwrap_err();
        assert!(matches!(e, ModelError::NotAModel { .. }), "{name}: {e}");
    }
    let ok = write(dir.path(), "ok.onnx", &full);
    let model = Model::load(&ok).unwrap();
    assert_eq!(model.opset(), 17);
    assert_eq!(fs::read(&ok).unwrap(), full, "loading never modifies the file");
}

fn external(proto: &mut ModelProto, location: &str, offset: u64, length: u64) {
    let t = &mut proto.graph.as_mut().unwrap().initializer[0];
    t.raw_data = None;
    let e = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
    t.external_data =
        vec![e("location", location.into()), e("offset", offset.to_string()), e("length", length.to_string())];
    t.data_location = Some(tensor_proto::DataLocation::External as i32);
}

#[test]
fn external_data_is_checked_read_and_linked() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = [0.5f32, 1.5, 2.5, 3.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut padded = vec![0u8; 8];
    padded.extend(&data);
    write(dir.path(), "weights.bin", &padded);

    let mut proto = small_model();
    external(&mut proto, "weights.bin", 8, 16);
    let path = write(dir.path(), "ext.onnx", &proto.encode_to_vec());
    let model = Model::load(&path).unwrap();
    let w = values(&model, &model.graph().initializer[0]);
    assert_eq!(w, [0.5, 1.5, 2.5, 3.5]);
    // A rewrite is loaded from memory with external data resolved in the original folder.
    let scratch = tempfile::tempdir().unwrap();
    let (bytes, folder) = model.runtime_bytes(&model.proto, scratch.path()).unwrap();
    assert_eq!(folder.unwrap(), fs::canonicalize(dir.path()).unwrap());
    assert_eq!(ModelProto::decode(bytes.as_slice()).unwrap().graph.unwrap().initializer[0].external_data.len(), 3);
    // A standalone save reads the external data in.
    model.save_standalone(&model.proto, &scratch.path().join("standalone.onnx")).unwrap();
    let standalone = Model::load(&scratch.path().join("standalone.onnx")).unwrap();
    assert_eq!(values(&standalone, &standalone.graph().initializer[0]), [0.5, 1.5, 2.5, 3.5]);

    let mut missing = small_model();
    external(&mut missing, "absent.bin", 0, 16);
    let e = Model::load(&write(dir.path(), "missing.onnx", &missing.encode_to_vec())).unwrap_err();
    assert!(e.to_string().contains("absent.bin"), "{e}");
    let mut short = small_model();
    external(&mut short, "weights.bin", 16, 16);
    let e = Model::load(&write(dir.path(), "short.onnx", &short.encode_to_vec())).unwrap_err();
    assert!(e.to_string().contains("needs bytes up to 32"), "{e}");
    let mut outside = small_model();
    external(&mut outside, "../etc/passwd", 0, 16);
    let e = Model::load(&write(dir.path(), "outside.onnx", &outside.encode_to_vec())).unwrap_err();
    assert!(e.to_string().contains("outside the model's folder"), "{e}");
}

#[test]
fn raw_data_is_not_copied_on_load() {
    // prost decodes `bytes` fields from a `Bytes` buffer by slicing it: the tensor's raw data must
    // point into the one buffer read from the file.
    let proto = small_model();
    let buf = Bytes::from(proto.encode_to_vec());
    let decoded = ModelProto::decode(buf.clone()).unwrap();
    let raw = decoded.graph.unwrap().initializer[0].raw_data.clone().unwrap();
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    assert!(range.contains(&(raw.as_ptr() as usize)), "raw_data was copied");
}

#[test]
fn extraction_isolates_each_group_with_typed_inputs_and_its_constants() {
    use layerwise_model::builder::{attr, f32_tensor, i64_tensor, Dim, ModelBuilder};
    use layerwise_model::extract::{extract_groups, TensorType};
    let mut b = ModelBuilder::new("chain", 13);
    b.input("x", DataType::Float, &[Dim::from(2), Dim::from(3)]);
    b.initializer(f32_tensor("W", &[3, 3], &[1.0; 9]));
    b.initializer(i64_tensor("shape", &[2], &[3, 2]));
    b.node("MatMul", "mm", &["x", "W"], &["h"], vec![]);
    b.node("Constant", "k", &[], &["k_out"], vec![attr::tensor("value", f32_tensor("kv", &[], &[2.0]))]);
    b.node("Mul", "scale", &["h", "k_out"], &["s"], vec![]);
    b.node("Reshape", "shape_it", &["s", "shape"], &["r"], vec![]);
    b.node("Add", "", &["r", "r"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let model = Model::from_proto(b.build(), "chain.onnx").unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let types = |t: &str| -> Option<TensorType> {
        match t {
            "h" | "s" => Some(TensorType { elem: DataType::Float, dims: vec![2, 3] }),
            "r" => Some(TensorType { elem: DataType::Float, dims: vec![3, 2] }),
            _ => None,
        }
    };
    let groups = vec![vec!["scale".to_string()], vec!["shape_it".to_string(), "Add#4".to_string()]];
    let e = extract_groups(&model, &index, &groups, &types).unwrap();
    let g = e.proto.graph.as_ref().unwrap();
    // Group 0: Mul reads h (a graph input now) and the Constant's output (extracted with it).
    assert_eq!(e.groups[0].nodes, vec!["scale"]);
    assert_eq!(e.groups[0].inputs, vec![("h__lw_g0".to_string(), "h".to_string())]);
    assert_eq!(e.groups[0].outputs, vec![("s__lw_g0".to_string(), "s".to_string())]);
    assert!(g.node.iter().any(|n| n.op_type() == "Constant" && n.output[0] == "k_out__lw_g0"));
    // Group 1: two connected nodes; only the tensor from outside is an input, the initializer is shared.
    assert_eq!(e.groups[1].inputs, vec![("s__lw_g1".to_string(), "s".to_string())]);
    assert_eq!(e.groups[1].outputs.iter().map(|(_, o)| o.as_str()).collect::<Vec<_>>(), vec!["r", "y"]);
    assert_eq!(g.initializer.iter().map(|t| t.name()).collect::<Vec<_>>(), vec!["shape"], "W is not read by any group");
    assert_eq!(g.input.len(), 2);
    // The extraction is a valid model by itself.
    let extracted = model.derived(e.proto.clone(), "extracted.onnx");
    let ei = GraphIndex::build(extracted.graph()).unwrap();
    assert_eq!(ei.inputs, vec!["h__lw_g0", "s__lw_g1"]);
    // Unknown nodes and missing types are errors, not panics.
    assert!(extract_groups(&model, &index, &[vec!["nope".into()]], &types).is_err());
    let err = extract_groups(&model, &index, &[vec!["mm".into()]], &types).unwrap_err().to_string();
    assert!(err.contains("no type and shape known for 'x'"), "{err}");
}

/// The noise floor perturbs weights, never exponents: `x ^ 2.0009` is NaN for every negative x
/// (Silero VAD's STFT magnitude read as a noise floor of 1.8), while FP16 leaves 2.0 as it is.
#[test]
fn perturbing_weights_leaves_exponents_alone() {
    let mut b = ModelBuilder::new("pow", 17);
    b.input("x", DataType::Float, &[Dim::from(4)]);
    b.initializer(f32_tensor("two", &[], &[2.0]));
    b.initializer(f32_tensor("scale", &[1], &[3.0]));
    b.node("Pow", "square", &["x", "two"], &["sq"], vec![]);
    b.node("Mul", "mul", &["sq", "scale"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let model = Model::from_proto(b.build(), "pow.onnx").unwrap();
    let none = std::collections::HashSet::new();
    let perturbed = Model::from_proto(
        layerwise_model::perturb::perturb_weights(&model, Perturbation::Relative(1e-3), &none, 7).unwrap().0,
        "p.onnx",
    )
    .unwrap();
    let weight =
        |name: &str| values(&perturbed, perturbed.graph().initializer.iter().find(|t| t.name() == name).unwrap());
    assert_eq!(weight("two"), vec![2.0], "the exponent stays exact");
    assert_ne!(weight("scale"), vec![3.0], "other weights are perturbed");
}

/// The noise floor perturbs only what the candidate's precision changes, each value by at most
/// its own rounding error there: a value exact in BF16 (1/512, a LayerNorm's 1/N) stays, 0.1
/// moves by at most |bf16(0.1) - 0.1|; the data a Reshape moves is perturbed, its shape is not.
#[test]
fn a_storage_perturbation_moves_each_weight_by_at_most_its_own_rounding_error() {
    let mut b = ModelBuilder::new("ln", 17);
    b.input("x", DataType::Float, &[Dim::from(4)]);
    b.initializer(f32_tensor("inv_n", &[], &[1.0 / 512.0]));
    b.initializer(f32_tensor("w", &[2, 2], &[0.1, 0.3, -0.7, 1.0]));
    b.initializer(layerwise_model::builder::i64_tensor("shape", &[1], &[4]));
    b.node("Mul", "scale", &["x", "inv_n"], &["s"], vec![]);
    b.node("Reshape", "flat", &["w", "shape"], &["wf"], vec![]);
    b.node("Add", "add", &["s", "wf"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let model = Model::from_proto(b.build(), "ln.onnx").unwrap();
    let none = std::collections::HashSet::new();
    for seed in 0..20 {
        let (proto, count) =
            layerwise_model::perturb::perturb_weights(&model, Perturbation::Storage(Rounding::Bf16), &none, seed)
                .unwrap();
        let perturbed = Model::from_proto(proto, "p.onnx").unwrap();
        let weight =
            |name: &str| values(&perturbed, perturbed.graph().initializer.iter().find(|t| t.name() == name).unwrap());
        assert_eq!(weight("inv_n"), vec![1.0 / 512.0], "exact in BF16: not perturbed");
        for (moved, original) in weight("w").iter().zip([0.1f32, 0.3, -0.7, 1.0]) {
            let bound = (Rounding::Bf16.round(original) - original).abs();
            assert!(
                (moved - original).abs() <= bound * (1.0 + 1e-6),
                "seed {seed}: {original} moved to {moved}, more than its BF16 rounding error {bound}"
            );
        }
        assert_eq!(weight("w")[3], 1.0, "1.0 is exact in BF16");
        assert_eq!(count, Perturbed { moved: 3, exact: 2 }, "0.1, 0.3, -0.7 move; 1/512 and 1.0 are exact");
    }
}

/// Under TF32 only what a tensor core reads is perturbed: a MatMul's weight (here through a
/// Transpose), not the bias added after it nor a BatchNorm's parameters.
#[test]
fn a_tf32_perturbation_moves_only_what_tensor_cores_read() {
    let mut b = ModelBuilder::new("mm", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(2), Dim::from(1), Dim::from(2)]);
    b.initializer(f32_tensor("w", &[2, 2], &[0.1, 0.3, -0.7, 0.9]));
    b.initializer(f32_tensor("bias", &[2], &[0.1, 0.2]));
    for (name, v) in [("gamma", [0.1f32, 0.3]), ("beta", [0.7, 0.9]), ("mean", [0.3, 0.1]), ("var", [1.3, 0.7])] {
        b.initializer(f32_tensor(name, &[2], &v));
    }
    b.node("BatchNormalization", "bn", &["x", "gamma", "beta", "mean", "var"], &["n"], vec![]);
    b.node("Transpose", "t", &["w"], &["wt"], vec![]);
    b.node("MatMul", "mm", &["n", "wt"], &["m"], vec![]);
    b.node("Add", "add", &["m", "bias"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let model = Model::from_proto(b.build(), "mm.onnx").unwrap();
    let (proto, count) = layerwise_model::perturb::perturb_weights(
        &model,
        Perturbation::TensorCores,
        &std::collections::HashSet::new(),
        3,
    )
    .unwrap();
    let perturbed = Model::from_proto(proto, "p.onnx").unwrap();
    let weight =
        |name: &str| values(&perturbed, perturbed.graph().initializer.iter().find(|t| t.name() == name).unwrap());
    assert_ne!(weight("w"), vec![0.1, 0.3, -0.7, 0.9], "the MatMul's weight (through a Transpose) moves");
    for (name, v) in [
        ("bias", vec![0.1f32, 0.2]),
        ("gamma", vec![0.1, 0.3]),
        ("beta", vec![0.7, 0.9]),
        ("mean", vec![0.3, 0.1]),
        ("var", vec![1.3, 0.7]),
    ] {
        assert_eq!(weight(name), v, "{name}: TF32 does not round it");
    }
    assert_eq!(count.moved + count.exact, 4, "only the four values of w are considered");
}

/// A weight beyond FP16's range (an attention mask's -3.4e38) is no rounding to perturb by: moved
/// by "one unit roundoff of itself" it left float32's range and made the noise floor inf. It
/// stays, counted with the values left as they are.
#[test]
fn a_weight_beyond_the_format_s_range_is_left_as_it_is() {
    let mut b = ModelBuilder::new("mask", 17);
    b.input("x", DataType::Float, &[Dim::from(2)]);
    b.initializer(f32_tensor("mask", &[2], &[f32::MIN, 0.3]));
    b.node("Add", "add", &["x", "mask"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let model = Model::from_proto(b.build(), "mask.onnx").unwrap();
    for seed in 0..16 {
        let (proto, count) = layerwise_model::perturb::perturb_weights(
            &model,
            Perturbation::Storage(Rounding::Fp16),
            &std::collections::HashSet::new(),
            seed,
        )
        .unwrap();
        let perturbed = Model::from_proto(proto, "p.onnx").unwrap();
        let mask = values(&perturbed, perturbed.graph().initializer.iter().find(|t| t.name() == "mask").unwrap());
        assert_eq!(mask[0], f32::MIN, "seed {seed}");
        assert!(mask[1].is_finite());
        assert_eq!(count, Perturbed { moved: 1, exact: 1 });
    }
}

/// An external embedding table that only a Gather reads is rounded in the gathered rows (the
/// run computes no rounded copy of the table); an external weight a MatMul reads is rounded
/// where it is read, from its stored values.
#[test]
fn an_external_table_only_gathered_is_rounded_in_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let table = [0.1f32, 1.0001, 2.0, 3.0, 4.0, 5.0];
    let w = [1.0001f32, 0.5];
    let data: Vec<u8> = table.iter().chain(w.iter()).flat_map(|v| v.to_le_bytes()).collect();
    write(dir.path(), "weights.bin", &data);
    let e = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
    let ext = |name: &str, dims: &[i64], offset: usize, length: usize| TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Float as i32),
        data_location: Some(tensor_proto::DataLocation::External as i32),
        external_data: vec![
            e("location", "weights.bin".into()),
            e("offset", offset.to_string()),
            e("length", length.to_string()),
        ],
        ..Default::default()
    };
    let build = |tied: bool| {
        let mut b = ModelBuilder::new("embed", 17);
        b.input("ids", DataType::Int64, &[Dim::from(2)]);
        b.initializer(ext("table", &[3, 2], 0, 24));
        b.initializer(ext("w", &[2, 1], 24, 8));
        b.node("Gather", "embed", &["table", "ids"], &["rows"], vec![attr::int("axis", 0)]);
        b.node("MatMul", "head", &["rows", "w"], &["y"], vec![]);
        if tied {
            // The table also read by a MatMul (tied embeddings): rounded where it is read.
            b.node("MatMul", "tied", &["rows", "table_t"], &["z"], vec![]);
            b.node("Transpose", "tt", &["table"], &["table_t"], vec![]);
            b.output("z", DataType::Float);
        }
        b.output("y", DataType::Float);
        let path = write(dir.path(), if tied { "tied.onnx" } else { "embed.onnx" }, &b.build().encode_to_vec());
        Model::load(&path).unwrap()
    };
    let float: HashSet<String> = ["rows", "y", "z", "table_t"].iter().map(|s| s.to_string()).collect();
    let model = build(false);
    let emu = emulate(&model, &model.proto, &float, &HashSet::new(), Rounding::Fp16).unwrap();
    let g = emu.proto.graph.as_ref().unwrap();
    let inits: Vec<&str> = g.initializer.iter().map(|t| t.name()).collect();
    assert!(inits.contains(&"table") && inits.contains(&"w__lw_stored") && !inits.contains(&"w"), "{inits:?}");
    let rows_producer = g.node.iter().find(|n| n.output.iter().any(|o| o == "rows")).unwrap();
    assert_eq!(rows_producer.op_type(), "Cast", "the gathered rows are rounded");
    let gather = g.node.iter().find(|n| n.op_type() == "Gather").unwrap();
    assert_eq!(gather.input[0], "table", "the Gather reads the stored table");
    assert_eq!(emu.rounded_weights, 2);

    let tied = build(true);
    let emu = emulate(&tied, &tied.proto, &float, &HashSet::new(), Rounding::Fp16).unwrap();
    let inits: Vec<String> = emu.proto.graph.unwrap().initializer.iter().map(|t| t.name().to_string()).collect();
    assert!(
        inits.contains(&"table__lw_stored".to_string()),
        "a table the Transpose also reads is rounded before it is read: {inits:?}"
    );
}

/// `fix` emulates one model once per keep list: the weights one emulation rounded are taken as
/// they are by the next (the same bytes, not rounded again), and the result is the emulation's
/// own, whatever was kept before; another model's weight of the same name, or another rounding,
/// is rounded afresh.
#[test]
fn emulations_reusing_rounded_weights_are_the_emulations_made_afresh() {
    let model = Model::from_proto(small_model(), "small").unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let (exposed, _) = expose(&model.proto, &index, &Selection::All).unwrap();
    let float: HashSet<String> = ["a", "a2", "b", "c"].iter().map(|s| s.to_string()).collect();
    let weight = |proto: &ModelProto| {
        proto.graph.as_ref().unwrap().initializer.iter().find(|t| t.name() == "w").unwrap().raw_data.clone().unwrap()
    };
    let mut rounded = RoundedWeights::default();
    let mut first: Option<Bytes> = None;
    // Nothing kept, the Mul kept (it reads a float32 copy of w), nothing kept again.
    for keep in [HashSet::new(), HashSet::from([1usize]), HashSet::new()] {
        let reused = emulate_reusing(&model, &exposed, &float, &keep, Rounding::Fp16, &mut rounded).unwrap();
        let fresh = emulate(&model, &exposed, &float, &keep, Rounding::Fp16).unwrap();
        assert_eq!(reused.proto, fresh.proto, "keeping {keep:?}");
        assert_eq!((reused.rounded_tensors, reused.rounded_weights), (fresh.rounded_tensors, fresh.rounded_weights));
        let w = weight(&reused.proto);
        match &first {
            None => first = Some(w),
            Some(f) => assert_eq!(f.as_ptr(), w.as_ptr(), "w is taken as the first emulation rounded it"),
        }
    }
    // The same model in BF16, and a model whose w has other values under the same name.
    let bf16 = emulate_reusing(&model, &exposed, &float, &HashSet::new(), Rounding::Bf16, &mut rounded).unwrap();
    assert_eq!(bf16.proto, emulate(&model, &exposed, &float, &HashSet::new(), Rounding::Bf16).unwrap().proto);
    let mut other = small_model();
    other.graph.as_mut().unwrap().initializer[0] = f32_tensor("w", &[4], &[3.0001, -1e6, 0.5, 7.0]);
    let other = Model::from_proto(other, "other").unwrap();
    let (other_exposed, _) = expose(&other.proto, &index, &Selection::All).unwrap();
    let reused =
        emulate_reusing(&other, &other_exposed, &float, &HashSet::new(), Rounding::Fp16, &mut rounded).unwrap();
    assert_eq!(reused.proto, emulate(&other, &other_exposed, &float, &HashSet::new(), Rounding::Fp16).unwrap().proto);
    assert_eq!(values(&other, &reused.proto.graph.as_ref().unwrap().initializer[0])[3], 7.0);
}
