//! Control flow as users bring it: a network inside an If chosen by an input (a voice-activity
//! model picks its branch by sample rate), and a Loop. An FP16 overflow planted inside the branch
//! taken, or inside the loop body, must be named as the first divergent layer: neither is visible
//! from the main graph, and the FP16 emulation used to leave bodies in float32 (a false all-clear).

use crate::common::{json, layerwise, save, saved_tensor, text};
use layerwise_model::builder::node;
use layerwise_model::builder::{attr, f32_tensor, i64_tensor, tensor_type, Dim, ModelBuilder};
use layerwise_model::onnx::{GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto};
use layerwise_model::DataType;
use layerwise_runtime::{Tensor, TensorData};

fn value(name: &str, elem: DataType, dims: Option<&[Dim]>) -> ValueInfoProto {
    ValueInfoProto { name: Some(name.into()), r#type: Some(tensor_type(elem, dims)), ..Default::default() }
}

/// `steps` Mul nodes by 1.01 from `from` inside a body (prefix names them), then, with `planted`,
/// x*300 -> square -> /300 -> /300: the square reaches 9e4 for inputs near 1 and overflows FP16,
/// while every weight is exact in FP16 (so rounding weights alone changes nothing).
fn body_chain(prefix: &str, from: &str, steps: usize, planted: bool, out: &str) -> (Vec<NodeProto>, Vec<TensorProto>) {
    let (mut nodes, mut weights) = (Vec::new(), Vec::new());
    let mut current = from.to_string();
    for i in 0..steps {
        let (w, t) = (format!("{prefix}w{i}"), format!("{prefix}t{i}"));
        weights.push(f32_tensor(&w, &[1], &[1.01]));
        nodes.push(node("Mul", &format!("{prefix}mul{i}"), &[&current, &w], &[&t], vec![]));
        current = t;
        if planted && i == steps / 2 {
            weights.push(f32_tensor(&format!("{prefix}k"), &[1], &[300.0]));
            let k = format!("{prefix}k");
            let names: Vec<String> = ["scaled", "sq", "down", "back"].iter().map(|s| format!("{prefix}{s}")).collect();
            nodes.push(node("Mul", &format!("{prefix}scale"), &[&current, &k], &[&names[0]], vec![]));
            nodes.push(node("Mul", &format!("{prefix}square"), &[&names[0], &names[0]], &[&names[1]], vec![]));
            nodes.push(node("Div", &format!("{prefix}down"), &[&names[1], &k], &[&names[2]], vec![]));
            nodes.push(node("Div", &format!("{prefix}back"), &[&names[2], &k], &[&names[3]], vec![]));
            current = names[3].clone();
        }
    }
    nodes.push(node("Identity", &format!("{prefix}out"), &[&current], &[out], vec![]));
    (nodes, weights)
}

/// x[1,64], sr (int64 scalar) -> If(sr == 16000): then = the whole network (40 nodes, optionally
/// with the planted overflow), else = 3 nodes -> y.
fn network_in_an_if(planted: bool) -> ModelProto {
    let mut b = ModelBuilder::new("vad", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(64)]);
    b.input("sr", DataType::Int64, &[]);
    b.initializer(i64_tensor("sr16k", &[], &[16000]));
    let (then_nodes, then_weights) = body_chain("net/", "x", 40, planted, "then_y");
    let (else_nodes, else_weights) = body_chain("small/", "x", 3, false, "else_y");
    let dims = [Dim::from(1), Dim::from(64)];
    let then_branch = GraphProto {
        name: Some("then".into()),
        node: then_nodes,
        initializer: then_weights,
        output: vec![value("then_y", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    let else_branch = GraphProto {
        name: Some("else".into()),
        node: else_nodes,
        initializer: else_weights,
        output: vec![value("else_y", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    b.node("Equal", "is_16k", &["sr", "sr16k"], &["cond"], vec![]);
    b.node(
        "If",
        "by_rate",
        &["cond"],
        &["y"],
        vec![attr::graph("then_branch", then_branch), attr::graph("else_branch", else_branch)],
    );
    b.output("y", DataType::Float);
    b.build()
}

/// x[1,64] -> Loop(6 iterations, v = x): v1 = v*1.5; s = v1*40; v_out = sqrt(s*s/1600); the
/// square passes 65504 from the 4th iteration on (inputs in [0,1)). Outputs the final v and every
/// iteration's v stacked.
fn planted_loop() -> ModelProto {
    loop_of(6)
}

fn loop_of(trips: i64) -> ModelProto {
    let mut b = ModelBuilder::new("loop", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(64)]);
    b.initializer(i64_tensor("trips", &[], &[trips]));
    b.initializer(TensorProto {
        name: Some("go".into()),
        data_type: Some(DataType::Bool as i32),
        int32_data: vec![1],
        ..Default::default()
    });
    let nodes = vec![
        node("Mul", "grow", &["v_in", "k_grow"], &["v1"], vec![]),
        node("Mul", "scale", &["v1", "k_scale"], &["s"], vec![]),
        node("Mul", "square", &["s", "s"], &["sq"], vec![]),
        node("Div", "unscale", &["sq", "k_unscale"], &["v2"], vec![]),
        node("Sqrt", "root", &["v2"], &["v_out"], vec![]),
        node("Identity", "keep_going", &["cond_in"], &["cond_out"], vec![]),
        node("Identity", "record", &["v_out"], &["trace_v"], vec![]),
    ];
    let body = GraphProto {
        name: Some("body".into()),
        node: nodes,
        initializer: vec![
            f32_tensor("k_grow", &[1], &[1.5]),
            f32_tensor("k_scale", &[1], &[40.0]),
            f32_tensor("k_unscale", &[1], &[1600.0]),
        ],
        input: vec![
            value("i", DataType::Int64, Some(&[])),
            value("cond_in", DataType::Bool, Some(&[])),
            value("v_in", DataType::Float, None),
        ],
        output: vec![
            value("cond_out", DataType::Bool, Some(&[])),
            value("v_out", DataType::Float, None),
            value("trace_v", DataType::Float, None),
        ],
        ..Default::default()
    };
    b.node("Loop", "steps", &["trips", "go", "x"], &["v_final", "trace"], vec![attr::graph("body", body)]);
    b.output("v_final", DataType::Float);
    b.output("trace", DataType::Float);
    b.build()
}

fn write_sr(dir: &std::path::Path, rate: i64) {
    layerwise_runtime::npy::write_npy_file(&dir.join("sr.npy"), &Tensor::new(vec![], TensorData::I64(vec![rate])))
        .unwrap();
}

#[test]
fn an_overflow_inside_the_branch_taken_is_named_and_the_branch_is_compared() {
    let dir = tempfile::tempdir().unwrap();
    save(&network_in_an_if(true), &dir.path().join("vad.onnx"));
    write_sr(dir.path(), 16000);
    let out =
        layerwise(&["bisect", "vad.onnx", "--input", "sr=sr.npy", "--json", "r.json", "--html", "r.html"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "the overflow is found: {t}");
    let r = json(&dir.path().join("r.json"));
    let fd = &r["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "by_rate/then/net/square", "{t}");
    assert_eq!(fd["cause"]["kind"], "value_overflow", "{t}");
    assert_eq!(r["control_flow"]["inlined"][0]["taken"], "then_branch");
    assert!(t.contains("control    If 'by_rate': then_branch taken"), "{t}");
    // The whole network is compared, not just the If's output.
    let compared = r["tensors"].as_array().unwrap().len();
    let in_branch = r["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"].as_str().unwrap().starts_with("by_rate/then/"))
        .count();
    assert!(in_branch >= 40, "{in_branch} of {compared} compared tensors are the branch's");
    assert!(r["not_compared"].as_array().unwrap().is_empty(), "{}", r["not_compared"]);

    // Left as it is, the If hides the overflow: the emulation does not round inside bodies, so
    // this is the false all-clear the inlining exists to prevent.
    let kept = layerwise(&["bisect", "vad.onnx", "--input", "sr=sr.npy", "--keep-control-flow"], dir.path());
    assert_eq!(kept.status.code(), Some(0), "{}", text(&kept));

    // The other rate takes the other branch: nothing overflows there.
    write_sr(dir.path(), 8000);
    let other = layerwise(&["bisect", "vad.onnx", "--input", "sr=sr.npy", "--json", "o.json"], dir.path());
    assert_eq!(other.status.code(), Some(0), "{}", text(&other));
    assert_eq!(json(&dir.path().join("o.json"))["control_flow"]["inlined"][0]["taken"], "else_branch");
}

#[test]
fn a_network_inside_an_if_is_compared_for_more_than_nine_tenths_of_its_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let model = network_in_an_if(false);
    save(&model, &dir.path().join("vad.onnx"));
    write_sr(dir.path(), 16000);
    let out = layerwise(&["bisect", "vad.onnx", "--input", "sr=sr.npy", "--json", "r.json"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let r = json(&dir.path().join("r.json"));
    // Every tensor the model computes on this path: main graph (cond, y) plus the then branch.
    let graph = model.graph.as_ref().unwrap();
    let then_branch = graph.node[1].attribute.iter().find(|a| a.name() == "then_branch").unwrap().g.as_ref().unwrap();
    let on_path = 2 + then_branch.node.iter().map(|n| n.output.len()).sum::<usize>();
    let compared = r["tensors"].as_array().unwrap().len();
    assert!(compared * 10 > on_path * 9, "{compared} compared of {on_path} computed on the path taken");
}

#[test]
fn a_loop_that_runs_no_iteration_is_left_as_it_is_and_the_rest_compared() {
    let dir = tempfile::tempdir().unwrap();
    save(&loop_of(0), &dir.path().join("loop.onnx"));
    let out = layerwise(&["bisect", "loop.onnx", "--json", "r.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "the run goes on: {t}");
    let r = json(&dir.path().join("r.json"));
    let kept = r["control_flow"]["kept"].to_string();
    assert!(kept.contains("steps") && kept.contains("ran no iteration"), "{kept}");
    assert!(r["verdict"]["conclusions"].to_string().contains("left as it is"), "{}", r["verdict"]);
    // Issue "paired everywhere": the loop kept in the graph still pairs, and pairing changes nothing.
    assert_eq!(r["memory"]["comparison"], "paired", "{}", r["memory"]);
    let out = layerwise(&["bisect", "loop.onnx", "--separate-runs", "--json", "s.json"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let s = json(&dir.path().join("s.json"));
    for key in ["tensors", "not_compared", "verdict", "control_flow"] {
        assert_eq!(r[key], s[key], "{key} differs");
    }
}

#[test]
fn an_overflow_inside_a_loop_body_is_named_with_its_iteration() {
    let dir = tempfile::tempdir().unwrap();
    save(&planted_loop(), &dir.path().join("loop.onnx"));
    let out = layerwise(&["bisect", "loop.onnx", "--json", "r.json", "--markdown", "r.md"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let r = json(&dir.path().join("r.json"));
    let fd = &r["verdict"]["first_divergent"];
    // (1.5^k * 40 * x)^2 > 65504 first for k = 5 with x near 1 (iteration 4, counting from 0):
    // 1.5^4 * 40 = 202 (squared 4.1e4) fits, 1.5^5 * 40 = 304 (squared 9.2e4) does not.
    assert_eq!(fd["node"], "steps/iter4/square", "{t}");
    assert_eq!(fd["cause"]["kind"], "value_overflow", "{t}");
    assert_eq!(r["control_flow"]["inlined"][0]["taken"], "6 iterations");
    // The stacked output is rebuilt from the iterations and matches ONNX Runtime's Loop: the
    // reference of the unrolled model is the original model's output.
    let keep = layerwise(
        &["bisect", "loop.onnx", "--keep-control-flow", "--cand", "ort:cpu", "--save-tensors", "kept"],
        dir.path(),
    );
    assert_eq!(keep.status.code(), Some(0), "{}", text(&keep));
    let unrolled = layerwise(&["bisect", "loop.onnx", "--cand", "ort:cpu", "--save-tensors", "unrolled"], dir.path());
    assert_eq!(unrolled.status.code(), Some(0), "{}", text(&unrolled));
    let saved = |run: &str, tensor: &str| saved_tensor(&dir.path().join(run).join("ref"), tensor);
    for output in ["v_final", "trace"] {
        let (a, b) = (saved("kept", output), saved("unrolled", output));
        assert_eq!(a.shape, if output == "trace" { vec![6, 1, 64] } else { vec![1, 64] });
        assert_eq!(a, b, "{output}: the unrolled loop computes what the Loop computes");
    }
}

#[test]
fn convert_and_fix_reach_into_if_branches_and_loop_bodies() {
    let dir = tempfile::tempdir().unwrap();
    save(&network_in_an_if(true), &dir.path().join("vad.onnx"));
    save(&planted_loop(), &dir.path().join("loop.onnx"));
    write_sr(dir.path(), 16000);

    // The branches are FP16 inside (weights included) and the converted model runs in ONNX
    // Runtime, whose FP16 tensor overflows where the emulation said. (ONNX Runtime's CPU provider
    // computes FP16 Mul/Div in float32 between Casts it inserts and then merges, so the inf stays
    // in the stored tensor and the output passes there; CUDA's FP16 kernels would carry it on.)
    let out = layerwise(&["convert", "vad.onnx", "-o", "vad16.onnx"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let converted = layerwise_model::Model::load(&dir.path().join("vad16.onnx")).unwrap();
    let if_node = converted.graph().node.iter().find(|n| n.op_type() == "If").unwrap();
    for branch in ["then_branch", "else_branch"] {
        let body = if_node.attribute.iter().find(|a| a.name() == branch).unwrap().g.as_ref().unwrap();
        assert!(
            body.initializer.iter().all(|t| t.data_type() == DataType::Float16 as i32),
            "{branch} weights are FP16"
        );
        assert!(body.node.iter().any(|n| n.op_type() == "Cast"), "{branch} casts at its float32 interface");
    }
    let out = layerwise(
        &[
            "bisect",
            "vad.onnx",
            "--input",
            "sr=sr.npy",
            "--cand",
            "ort:cpu",
            "--cand-model",
            "vad16.onnx",
            "--json",
            "r.json",
        ],
        dir.path(),
    );
    let t = text(&out);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{t}");
    let r = json(&dir.path().join("r.json"));
    let sq = r["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "by_rate/then/net/sq")
        .expect("the branch's tensors are compared");
    assert!(sq["metrics"]["cand_inf"].as_u64().unwrap() > 0, "FP16 storage inside the branch overflows: {sq}");
    let before = r["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "by_rate/then/net/t19").unwrap();
    assert_eq!(before["metrics"]["cand_inf"], 0, "{before}");

    // fix keeps the node inside the branch and the reader of its out-of-range output (the
    // written model would cast that value to FP16 at the island's edge), writes the original
    // structure (the If stays), and the written file passes in its own types.
    let out = layerwise(
        &["fix", "vad.onnx", "--input", "sr=sr.npy", "-o", "vad_fixed.onnx", "--json", "fix.json"],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let fix = json(&dir.path().join("fix.json"));
    assert_eq!(fix["keep_fp32"], serde_json::json!(["by_rate/then/net/square", "by_rate/then/net/down"]), "{t}");
    assert_eq!(fix["fixed_model_check"]["pass"], true, "{t}");
    assert!(
        fix["trtexec_flags"].as_str().unwrap().contains("'net/square:fp32,net/down:fp32'"),
        "TensorRT names the layer by the node's own name: {t}"
    );
    let fixed = layerwise_model::Model::load(&dir.path().join("vad_fixed.onnx")).unwrap();
    assert!(fixed.graph().node.iter().any(|n| n.op_type() == "If"), "the fixed model keeps its If");

    // In a Loop, keeping a node of one iteration keeps it in the body, so in every iteration.
    let out = layerwise(&["fix", "loop.onnx", "-o", "loop_fixed.onnx", "--json", "loop_fix.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let fix = json(&dir.path().join("loop_fix.json"));
    assert_eq!(fix["fixed_model_check"]["pass"], true, "{t}");
    let kept: Vec<&str> =
        fix["fixed_model_fp32_nodes"].as_array().unwrap().iter().map(|p| p[0].as_str().unwrap()).collect();
    assert!(kept.contains(&"steps/body/square"), "{kept:?}");
}

/// x[1,64] read both by the main graph (Abs -> ReduceMax -> Greater than -1, always true) and by
/// the If's then-branch (the network with the planted overflow), as openwakeword's hey_jarvis reads
/// its input on both sides of an If.
fn outer_tensor_read_on_both_sides_of_an_if() -> ModelProto {
    let mut b = ModelBuilder::new("both_sides", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(64)]);
    b.initializer(f32_tensor("minus_one", &[], &[-1.0]));
    let (then_nodes, then_weights) = body_chain("net/", "x", 6, true, "then_y");
    let dims = [Dim::from(1), Dim::from(64)];
    let then_branch = GraphProto {
        name: Some("then".into()),
        node: then_nodes,
        initializer: then_weights,
        output: vec![value("then_y", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    let else_branch = GraphProto {
        name: Some("else".into()),
        node: vec![node("Neg", "negate", &["x"], &["else_y"], vec![])],
        output: vec![value("else_y", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    b.node("Abs", "magnitude", &["x"], &["a"], vec![]);
    b.node("ReduceMax", "largest", &["a"], &["m"], vec![attr::int("keepdims", 0)]);
    b.node("Greater", "above", &["m", "minus_one"], &["cond"], vec![]);
    b.node(
        "If",
        "gate",
        &["cond"],
        &["y"],
        vec![attr::graph("then_branch", then_branch), attr::graph("else_branch", else_branch)],
    );
    b.output("y", DataType::Float);
    b.build()
}

/// The Cast of an outer tensor to FP16 was added under one name
/// in the main graph and again inside the branch, a model ONNX Runtime refuses ("used as output
/// names multiple times"); `convert` wrote it and `fix` said FIXED.
#[test]
fn an_outer_tensor_read_inside_and_outside_a_branch_converts_to_a_model_that_loads() {
    let dir = tempfile::tempdir().unwrap();
    save(&outer_tensor_read_on_both_sides_of_an_if(), &dir.path().join("m.onnx"));
    let out = layerwise(&["convert", "m.onnx", "-o", "m16.onnx"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = layerwise(&["bisect", "m.onnx", "--cand", "ort:cpu", "--cand-model", "m16.onnx"], dir.path());
    assert!(matches!(out.status.code(), Some(0 | 1)), "ONNX Runtime runs the converted model: {}", text(&out));

    let out = layerwise(&["fix", "m.onnx", "-o", "fixed.onnx", "--json", "fix.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let fix = json(&dir.path().join("fix.json"));
    assert_eq!(fix["fixed_model_load"]["status"], "loads", "{t}");
    let out = layerwise(&["bisect", "m.onnx", "--cand", "ort:cpu", "--cand-model", "fixed.onnx"], dir.path());
    assert!(matches!(out.status.code(), Some(0 | 1)), "ONNX Runtime runs the fixed model: {}", text(&out));

    // The tensor a branch reads is also a graph output: its Cast back to float32 for the output
    // and the one for the branch were two nodes of one name.
    let dims = [Dim::from(1), Dim::from(4)];
    let mut b = ModelBuilder::new("output_read_by_a_branch", 17);
    b.input("x", DataType::Float, &dims);
    b.input("c", DataType::Bool, &[]);
    b.initializer(f32_tensor("B", &[4], &[-1.0, -0.5, 0.5, 1.0]));
    let then_branch = GraphProto {
        name: Some("then".into()),
        node: vec![node("Mul", "tmul2", &["t", "B"], &["a"], vec![])],
        output: vec![value("a", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    let else_branch = GraphProto {
        name: Some("else".into()),
        node: vec![node("Add", "eadd", &["t", "B"], &["e"], vec![])],
        output: vec![value("e", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    b.node("Mul", "tmul", &["x", "B"], &["t"], vec![]);
    b.node(
        "If",
        "if",
        &["c"],
        &["iy"],
        vec![attr::graph("then_branch", then_branch), attr::graph("else_branch", else_branch)],
    );
    b.node("Add", "final", &["iy", "t"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.output("t", DataType::Float);
    save(&b.build(), &dir.path().join("out_read.onnx"));
    let out = layerwise(&["convert", "out_read.onnx", "-o", "out_read16.onnx"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("ONNX Runtime loads and runs it"), "{}", text(&out));
}

#[test]
fn samples_that_take_different_branches_leave_the_if_and_the_verdict_says_what_it_does_not_cover() {
    let dir = tempfile::tempdir().unwrap();
    save(&network_in_an_if(true), &dir.path().join("vad.onnx"));
    std::fs::create_dir(dir.path().join("samples")).unwrap();
    for (i, rate) in [16000i64, 8000].into_iter().enumerate() {
        let x = Tensor::new(vec![1, 64], TensorData::F32((0..64).map(|k| 0.5 + k as f32 / 128.0).collect()));
        let sr = Tensor::new(vec![], TensorData::I64(vec![rate]));
        layerwise_runtime::npy::write_npz(&dir.path().join(format!("samples/s{i}.npz")), &[("x", &x), ("sr", &sr)])
            .unwrap();
    }
    let out = layerwise(&["bisect", "vad.onnx", "--inputs", "samples", "--json", "r.json"], dir.path());
    let t = text(&out);
    let r = json(&dir.path().join("r.json"));
    assert_eq!(r["control_flow"]["kept"][0][0], "by_rate", "{t}");
    let conclusions = r["verdict"]["conclusions"].to_string();
    assert!(conclusions.contains("this verdict does not cover what happens inside it"), "{conclusions}");
    assert!(t.contains("does not cover what happens inside"), "{t}");
    assert_eq!(r["memory"]["comparison"], "paired", "the kept If pairs: {}", r["memory"]);

    // fix cannot vouch for an FP16 branch it does not see into (the independent tester got FIXED
    // for an If whose taken branch overflows FP16): the If stays FP32 whole, and that holds.
    let out =
        layerwise(&["fix", "vad.onnx", "--inputs", "samples", "-o", "fixed.onnx", "--json", "fix.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let fix = json(&dir.path().join("fix.json"));
    assert_eq!(fix["keep_fp32"], serde_json::json!(["by_rate"]), "{t}");
    assert_eq!(fix["patterns"][0]["kind"], "control_flow_left_as_is", "{t}");
    let fixed = layerwise_model::Model::load(&dir.path().join("fixed.onnx")).unwrap();
    let if_node = fixed.graph().node.iter().find(|n| n.op_type() == "If").unwrap();
    for branch in &if_node.attribute {
        let body = branch.g.as_ref().unwrap();
        assert!(
            body.node.iter().all(|n| n.op_type() != "Cast")
                && body.initializer.iter().all(|w| w.data_type() == DataType::Float as i32),
            "{} stays float32",
            branch.name()
        );
    }
}

/// A Loop left as it is, whose body reads an outer weight and
/// overflows FP16, got NOT FIXED "ill-conditioned" although keeping the Loop fixes it: the
/// emulation still rounded the outer weight the kept body reads, and no run kept the Loop.
#[test]
fn a_loop_left_as_it_is_is_kept_whole_with_the_outer_weights_it_reads() {
    let f = |name: &str, dims: &[i64], v: &[f32]| f32_tensor(name, dims, v);
    let w: Vec<f32> = (0..64).map(|k| ((k * 37 % 17) as f32 - 8.0) / 16.0).collect();
    let rows = [Dim::from(4), Dim::from(8)];
    let body = GraphProto {
        name: Some("body".into()),
        node: vec![
            node("MatMul", "x", &["h", "W"], &["h1"], vec![]),
            node("Mul", "b_a", &["h1", "C1"], &["b_a"], vec![]),
            node("Mul", "b_sq", &["b_a", "b_a"], &["b_sq"], vec![]),
            node("Mul", "b_down", &["b_sq", "C2"], &["h2"], vec![]),
            node("Add", "y", &["h2", "h"], &["h3"], vec![]),
            node("Identity", "bid", &["cond"], &["cond_out"], vec![]),
        ],
        input: vec![
            value("i", DataType::Int64, Some(&[])),
            value("cond", DataType::Bool, Some(&[])),
            value("h", DataType::Float, Some(&rows)),
        ],
        output: vec![value("cond_out", DataType::Bool, Some(&[])), value("h3", DataType::Float, Some(&rows))],
        ..Default::default()
    };
    let mut b = ModelBuilder::new("loop_outer_weight", 17);
    b.input("x", DataType::Float, &rows);
    b.initializer(f("W", &[8, 8], &w));
    b.initializer(f("C1", &[], &[3000.0]));
    b.initializer(f("C2", &[], &[1.0 / 9e6]));
    b.initializer(i64_tensor("n", &[], &[3]));
    b.initializer(TensorProto {
        name: Some("tr".into()),
        data_type: Some(DataType::Bool as i32),
        int32_data: vec![1],
        ..Default::default()
    });
    b.node("Loop", "loop", &["n", "tr", "x"], &["hl"], vec![attr::graph("body", body)]);
    b.node("Tanh", "fin", &["hl"], &["out"], vec![]);
    b.output("out", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    save(&b.build(), &dir.path().join("loop.onnx"));
    std::fs::create_dir(dir.path().join("samples")).unwrap();
    for i in 0..3 {
        let x = Tensor::f32(vec![4, 8], (0..32).map(|k| ((k * 7 + i * 5) % 32) as f32 / 32.0).collect());
        layerwise_runtime::npy::write_npz(&dir.path().join(format!("samples/s{i}.npz")), &[("x", &x)]).unwrap();
    }
    let out = layerwise(&["bisect", "loop.onnx", "--inputs", "samples", "--json", "r.json"], dir.path());
    let r = json(&dir.path().join("r.json"));
    assert_eq!(r["control_flow"]["kept"][0][0], "loop", "the Loop is left as it is: {}", text(&out));
    let out =
        layerwise(&["fix", "loop.onnx", "--inputs", "samples", "-o", "fixed.onnx", "--json", "fix.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let fix = json(&dir.path().join("fix.json"));
    assert_eq!(fix["keep_fp32"], serde_json::json!(["loop"]), "{t}");
    assert_eq!(fix["fixed_model_check"]["pass"], true, "{t}");
    let fixed = layerwise_model::Model::load(&dir.path().join("fixed.onnx")).unwrap();
    assert!(
        fixed
            .graph()
            .initializer
            .iter()
            .find(|t| t.name() == "W")
            .is_some_and(|t| t.data_type() == DataType::Float as i32),
        "the weight the kept body reads stays float32"
    );
}

/// An If kept for
/// samples that take different branches was "kept in FP32" with its branch weights still rounded,
/// so `fix` said that even keeping everything fails. Kept, an If is FP32 whole, in the emulation
/// and in the written model. Here the then-branch scales by 70000 (beyond FP16) and back.
#[test]
fn an_if_kept_in_fp32_keeps_its_branches_whole_and_fix_says_fixed() {
    let mut b = ModelBuilder::new("scaled_if", 17);
    let dims = [Dim::from(1), Dim::from(4)];
    b.input("x", DataType::Float, &dims);
    b.input("sr", DataType::Int64, &[]);
    b.initializer(i64_tensor("sr16k", &[], &[16000]));
    b.initializer(f32_tensor("half", &[], &[0.5]));
    let then_branch = GraphProto {
        name: Some("then".into()),
        node: vec![
            node("Mul", "up", &["x", "big"], &["u"], vec![]),
            node("Div", "down", &["u", "big"], &["then_y"], vec![]),
        ],
        initializer: vec![f32_tensor("big", &[], &[70000.0])],
        output: vec![value("then_y", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    let else_branch = GraphProto {
        name: Some("else".into()),
        node: vec![node("Neg", "negate", &["x"], &["else_y"], vec![])],
        output: vec![value("else_y", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    b.node("Equal", "is_16k", &["sr", "sr16k"], &["cond"], vec![]);
    b.node(
        "If",
        "by_rate",
        &["cond"],
        &["b"],
        vec![attr::graph("then_branch", then_branch), attr::graph("else_branch", else_branch)],
    );
    b.node("Mul", "scale", &["b", "half"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    save(&b.build(), &dir.path().join("m.onnx"));
    std::fs::create_dir(dir.path().join("samples")).unwrap();
    for (i, rate) in [16000i64, 8000].into_iter().enumerate() {
        let x = Tensor::f32(vec![1, 4], vec![0.5, 1.0, 1.5, 2.0]);
        let sr = Tensor::new(vec![], TensorData::I64(vec![rate]));
        layerwise_runtime::npy::write_npz(&dir.path().join(format!("samples/s{i}.npz")), &[("x", &x), ("sr", &sr)])
            .unwrap();
    }
    let out =
        layerwise(&["fix", "m.onnx", "--inputs", "samples", "-o", "fixed.onnx", "--json", "fix.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let fix = json(&dir.path().join("fix.json"));
    assert_eq!(fix["keep_fp32"], serde_json::json!(["by_rate"]), "{t}");
    // One node kept, but it holds both branches (3 nodes): the summary says so (a tester read "1 of
    // 5 nodes" where the one was the whole model).
    assert!(
        fix["summary"]
            .as_str()
            .unwrap()
            .contains("the control flow kept whole holds 3 more nodes in its bodies, all FP32 too"),
        "{}",
        fix["summary"]
    );
    assert_eq!(fix["fixed_model_check"]["pass"], true, "{t}");
    let fixed = layerwise_model::Model::load(&dir.path().join("fixed.onnx")).unwrap();
    let if_node = fixed.graph().node.iter().find(|n| n.op_type() == "If").unwrap();
    let then_branch = if_node.attribute.iter().find(|a| a.name() == "then_branch").unwrap().g.as_ref().unwrap();
    assert!(
        then_branch.initializer.iter().all(|w| w.data_type() == DataType::Float as i32),
        "the kept If's branch stays float32"
    );
    assert!(then_branch.node.iter().all(|n| n.op_type() != "Cast"), "nothing of the kept branch is cast");
}

/// A Loop and a Scan whose bodies square a value past the FP16 range (x*x/1000 with x up to
/// 600): the Loop also emits the square as a scan output. Minimal versions of the independent
/// tester's models.
fn squares_in_a_loop_and_a_scan() -> (ModelProto, ModelProto) {
    let four = [Dim::from(4)];
    let body = GraphProto {
        name: Some("body".into()),
        node: vec![
            node("Mul", "sq", &["x_in", "x_in"], &["sq"], vec![]),
            node("Div", "div", &["sq", "k"], &["x_out"], vec![]),
            node("Identity", "id", &["c_in"], &["c_out"], vec![]),
        ],
        input: vec![
            value("i", DataType::Int64, Some(&[])),
            value("c_in", DataType::Bool, Some(&[])),
            value("x_in", DataType::Float, Some(&four)),
        ],
        output: vec![
            value("c_out", DataType::Bool, Some(&[])),
            value("x_out", DataType::Float, Some(&four)),
            value("sq", DataType::Float, Some(&four)),
        ],
        ..Default::default()
    };
    let mut b = ModelBuilder::new("loop_min", 13);
    b.input("trips", DataType::Int64, &[]);
    b.input("x0", DataType::Float, &four);
    b.initializer(f32_tensor("k", &[], &[1000.0]));
    b.initializer(TensorProto {
        name: Some("go".into()),
        data_type: Some(DataType::Bool as i32),
        int32_data: vec![1],
        ..Default::default()
    });
    b.node("Loop", "loop", &["trips", "go", "x0"], &["x_final", "sqs"], vec![attr::graph("body", body)]);
    b.output("x_final", DataType::Float);
    b.output("sqs", DataType::Float);
    let looped = b.build();

    let body = GraphProto {
        name: Some("sbody".into()),
        node: vec![node("Mul", "sq", &["s", "s"], &["sq"], vec![]), node("Div", "div", &["sq", "k"], &["y"], vec![])],
        input: vec![value("s", DataType::Float, Some(&four))],
        output: vec![value("y", DataType::Float, Some(&four))],
        ..Default::default()
    };
    let mut b = ModelBuilder::new("scan_min", 13);
    b.input("X", DataType::Float, &[Dim::from(2), Dim::from(4)]);
    b.initializer(f32_tensor("k", &[], &[1000.0]));
    b.node("Scan", "scan", &["X"], &["Y"], vec![attr::graph("body", body), attr::int("num_scan_inputs", 1)]);
    b.output("Y", DataType::Float);
    (looped, b.build())
}

/// `fix` searched the unrolled model and then could not write
/// its keep list (`scan/iter0/sq`, `loop/scan0/unsqueeze0` are no nodes of the model written).
#[test]
fn fix_writes_loop_and_scan_models_whose_keep_list_names_unrolled_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let (looped, scanned) = squares_in_a_loop_and_a_scan();
    save(&looped, &dir.path().join("loop.onnx"));
    save(&scanned, &dir.path().join("scan.onnx"));
    let x = Tensor::f32(vec![4], vec![300.0, 400.0, 500.0, 600.0]);
    let trips = Tensor::new(vec![], TensorData::I64(vec![2]));
    layerwise_runtime::npy::write_npz(&dir.path().join("loop.npz"), &[("trips", &trips), ("x0", &x)]).unwrap();
    let rows = Tensor::f32(vec![2, 4], vec![300.0, 400.0, 500.0, 600.0, 1.0, 2.0, 3.0, 4.0]);
    layerwise_runtime::npy::write_npz(&dir.path().join("scan.npz"), &[("X", &rows)]).unwrap();
    for (model, unrolled) in [("loop", "loop/iter0/sq"), ("scan", "scan/iter0/sq")] {
        let (m, inputs, fixed, report) = (
            format!("{model}.onnx"),
            format!("{model}.npz"),
            format!("{model}_fixed.onnx"),
            format!("{model}_fix.json"),
        );
        let out = layerwise(&["bisect", &m, "--inputs", &inputs], dir.path());
        assert_eq!(out.status.code(), Some(1), "{model} diverges: {}", text(&out));
        let out = layerwise(&["fix", &m, "--inputs", &inputs, "-o", &fixed, "--json", &report], dir.path());
        let t = text(&out);
        assert_eq!(out.status.code(), Some(0), "{model}: {t}");
        let fix = json(&dir.path().join(&report));
        assert!(fix["keep_fp32"].as_array().unwrap().iter().any(|n| n == unrolled), "{model}: {t}");
        assert_eq!(fix["fixed_model_load"]["status"], "loads", "{model}: {t}");
        assert_eq!(fix["fixed_model_check"]["pass"], true, "{model}: {t}");
        let written = layerwise_model::Model::load(&dir.path().join(&fixed)).unwrap();
        assert!(
            written.graph().node.iter().any(|n| n.op_type() == if model == "loop" { "Loop" } else { "Scan" }),
            "{model}: the written model keeps its structure"
        );
        if model == "loop" {
            // Both iterations keep `sq`: one layer of the body, named once, and the gathering of
            // scan outputs the unrolling made is no layer at all.
            let flags = fix["trtexec_flags"].as_str().unwrap();
            assert_eq!(flags.matches("sq:fp32").count(), 1, "{flags}");
            assert!(!flags.contains("unsqueeze") && !flags.contains("scan0"), "{flags}");
        }
    }
}

/// x[12,4] scanned row by row with a state s[4] (zeros): s' = (s + row) * 3, also emitted per step.
/// The state passes 65504 after about ten steps.
fn planted_scan() -> ModelProto {
    let mut b = ModelBuilder::new("scan", 17);
    b.input("x", DataType::Float, &[Dim::from(12), Dim::from(4)]);
    b.initializer(f32_tensor("s0", &[4], &[0.0; 4]));
    let body = GraphProto {
        name: Some("body".into()),
        node: vec![
            node("Add", "accumulate", &["s_in", "row"], &["t"], vec![]),
            node("Mul", "grow", &["t", "three"], &["s_out"], vec![]),
            node("Identity", "emit", &["s_out"], &["y_row"], vec![]),
        ],
        initializer: vec![f32_tensor("three", &[1], &[3.0])],
        input: vec![
            value("s_in", DataType::Float, Some(&[Dim::from(4)])),
            value("row", DataType::Float, Some(&[Dim::from(4)])),
        ],
        output: vec![
            value("s_out", DataType::Float, Some(&[Dim::from(4)])),
            value("y_row", DataType::Float, Some(&[Dim::from(4)])),
        ],
        ..Default::default()
    };
    b.node(
        "Scan",
        "scan",
        &["s0", "x"],
        &["s_final", "ys"],
        vec![attr::graph("body", body), attr::int("num_scan_inputs", 1)],
    );
    b.output("s_final", DataType::Float);
    b.output("ys", DataType::Float);
    b.build()
}

#[test]
fn a_scan_is_unrolled_into_its_steps_and_computes_what_the_scan_does() {
    let dir = tempfile::tempdir().unwrap();
    save(&planted_scan(), &dir.path().join("scan.onnx"));
    let out = layerwise(&["bisect", "scan.onnx", "--json", "r.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let r = json(&dir.path().join("r.json"));
    assert_eq!(r["control_flow"]["inlined"][0]["taken"], "12 iterations", "{t}");
    let fd = &r["verdict"]["first_divergent"];
    let node = fd["node"].as_str().unwrap();
    assert!(node.starts_with("scan/iter") && node.ends_with("/grow"), "{t}");
    assert_eq!(fd["cause"]["kind"], "value_overflow", "{t}");
    let run = |extra: &[&str], folder: &str| {
        let mut args = vec!["bisect", "scan.onnx", "--cand", "ort:cpu", "--save-tensors", folder];
        args.extend_from_slice(extra);
        let out = layerwise(&args, dir.path());
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    };
    run(&["--keep-control-flow"], "kept");
    run(&[], "unrolled");
    let saved = |folder: &str, tensor: &str| saved_tensor(&dir.path().join(folder).join("ref"), tensor);
    for output in ["s_final", "ys"] {
        assert_eq!(
            saved("kept", output),
            saved("unrolled", output),
            "{output}: the unrolled scan computes what the Scan computes"
        );
    }
    assert_eq!(saved("unrolled", "ys").shape, vec![12, 4]);
}

/// A `--cand-model` that takes the other branch. Its output was paired with the
/// tensor the reference's branch passes on (an Identity of a main-graph tensor), which the
/// candidate also computes: the two outputs were never compared, and a model that computes
/// something else passed. The output is compared as it is, and the verdict says the branches
/// differ and checks no keep list on the reference's branch.
#[test]
fn a_candidate_model_that_takes_the_other_branch_is_compared_at_its_outputs_and_said_to() {
    let twin = |threshold: f32| {
        let mut b = ModelBuilder::new("gate", 17);
        let dims = [Dim::from(1), Dim::from(4)];
        b.input("x", DataType::Float, &dims);
        b.initializer(f32_tensor("threshold", &[], &[threshold]));
        b.node("Sigmoid", "squash", &["x"], &["p"], vec![]);
        b.node("ReduceSum", "total", &["x"], &["s"], vec![attr::int("keepdims", 0)]);
        b.node("Greater", "is_loud", &["s", "threshold"], &["cond"], vec![]);
        let then_branch = GraphProto {
            name: Some("then".into()),
            node: vec![node("Neg", "flip", &["x"], &["flipped"], vec![])],
            output: vec![value("flipped", DataType::Float, Some(&dims))],
            ..Default::default()
        };
        let else_branch = GraphProto {
            name: Some("else".into()),
            node: vec![node("Identity", "pass", &["p"], &["passed"], vec![])],
            output: vec![value("passed", DataType::Float, Some(&dims))],
            ..Default::default()
        };
        b.node(
            "If",
            "gate",
            &["cond"],
            &["y"],
            vec![attr::graph("then_branch", then_branch), attr::graph("else_branch", else_branch)],
        );
        b.node("Relu", "post", &["y"], &["out"], vec![]);
        b.output("out", DataType::Float);
        b.build()
    };
    let dir = tempfile::tempdir().unwrap();
    // The reference's condition is false (else: Sigmoid passed on), the candidate's true (Neg).
    save(&twin(100.0), &dir.path().join("ref.onnx"));
    save(&twin(-100.0), &dir.path().join("cand.onnx"));
    let out = layerwise(
        &["bisect", "ref.onnx", "--cand", "ort:cpu", "--cand-model", "cand.onnx", "--json", "r.json"],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "the outputs differ (-x against sigmoid(x)): {t}");
    let r = json(&dir.path().join("r.json"));
    // The If's output inside the model too (found by the second tester): it was paired with the
    // tensor the reference's branch passes on.
    let tensor = |name: &str| r["tensors"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap().clone();
    assert!(tensor("y")["metrics"]["rel_l2_err"].as_f64().unwrap() > 1.0, "{}", tensor("y"));
    assert!(tensor("out")["metrics"]["rel_l2_err"].as_f64().unwrap() > 0.9, "{}", tensor("out"));
    let gate = &r["control_flow"]["inlined"][0];
    assert_eq!(
        (gate["taken"].as_str(), gate["candidate_taken"].as_str()),
        (Some("else_branch"), Some("then_branch")),
        "{t}"
    );
    assert!(t.contains("else_branch taken by the reference, then_branch by the candidate model"), "{t}");
    assert!(
        r["verdict"]["conclusions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().contains("takes then_branch at 'gate' where the reference takes else_branch")),
        "{t}"
    );
    assert!(
        r["counterfactual"].is_null(),
        "no keep list is checked on the reference's branch: {}",
        r["counterfactual"]
    );
}

/// x[1,4] (up to 2), sr -> If 'by_rate' (sr == 16000) -> y = b * 0.5. Nested: the then-branch
/// holds If 'stage' (same condition) whose then-branch outputs x * 70000, beyond FP16, and the
/// outer branch divides it back; flat: the then-branch outputs x * 70000 and the main graph
/// divides. Either way the out-of-range value passes through an If's output, whose hand-over node
/// the inlining makes (`by_rate/then/stage/output0`, `by_rate/output0`), as silero-vad 5.1.2's
/// decoder does.
fn overflow_through_an_if_output(nested: bool) -> ModelProto {
    let mut b = ModelBuilder::new("through_if", 17);
    let dims = [Dim::from(1), Dim::from(4)];
    b.input("x", DataType::Float, &dims);
    b.input("sr", DataType::Int64, &[]);
    b.initializer(i64_tensor("sr16k", &[], &[16000]));
    b.initializer(f32_tensor("half", &[], &[0.5]));
    b.initializer(f32_tensor("big", &[], &[70000.0]));
    let branch = |name: &str, nodes: Vec<NodeProto>, out: &str| GraphProto {
        name: Some(name.into()),
        node: nodes,
        output: vec![value(out, DataType::Float, Some(&dims))],
        ..Default::default()
    };
    let negate = |out: &str| branch("else", vec![node("Neg", "negate", &["x"], &[out], vec![])], out);
    let scale_up = |out: &str| branch("then", vec![node("Mul", "up", &["x", "big"], &[out], vec![])], out);
    b.node("Equal", "is_16k", &["sr", "sr16k"], &["cond"], vec![]);
    if nested {
        let stage = node(
            "If",
            "stage",
            &["cond"],
            &["u"],
            vec![attr::graph("then_branch", scale_up("inner_u")), attr::graph("else_branch", negate("inner_n"))],
        );
        let then_branch =
            branch("then", vec![stage, node("Div", "down", &["u", "big"], &["then_y"], vec![])], "then_y");
        b.node(
            "If",
            "by_rate",
            &["cond"],
            &["b"],
            vec![attr::graph("then_branch", then_branch), attr::graph("else_branch", negate("else_y"))],
        );
    } else {
        b.node(
            "If",
            "by_rate",
            &["cond"],
            &["u"],
            vec![attr::graph("then_branch", scale_up("then_y")), attr::graph("else_branch", negate("else_y"))],
        );
        b.node("Div", "down", &["u", "big"], &["b"], vec![]);
    }
    b.node("Mul", "scale", &["b", "half"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// `fix` found a
/// keep list on the inlined model that names an If's hand-over node (`If/output0`), and then could
/// not write it ("does not exist in the main graph"). The written file keeps the branch's node in
/// FP32 inside the branch, loads, and passes in its own types; the If's float32 interface is the
/// hand-over kept.
#[test]
fn fix_writes_a_keep_list_that_names_an_if_output_nested_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let x = Tensor::f32(vec![1, 4], vec![0.5, 1.0, 1.5, 2.0]);
    let sr = Tensor::new(vec![], TensorData::I64(vec![16000]));
    layerwise_runtime::npy::write_npz(&dir.path().join("in.npz"), &[("x", &x), ("sr", &sr)]).unwrap();
    for (nested, up, handover) in [
        (true, "by_rate/then/stage/then/up", "by_rate/then/stage/output0"),
        (false, "by_rate/then/up", "by_rate/output0"),
    ] {
        let model = if nested { "nested.onnx" } else { "flat.onnx" };
        save(&overflow_through_an_if_output(nested), &dir.path().join(model));
        let out =
            layerwise(&["fix", model, "--inputs", "in.npz", "-o", "fixed.onnx", "--json", "fix.json"], dir.path());
        let t = text(&out);
        assert_eq!(out.status.code(), Some(0), "{model}: {t}");
        let fix = json(&dir.path().join("fix.json"));
        let keep: Vec<&str> = fix["keep_fp32"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
        assert!(keep.contains(&up) && keep.contains(&handover), "{model}: {keep:?}");
        assert_eq!(fix["status"], "fixed", "{model}: {t}");
        assert_eq!(fix["fixed_model_load"]["status"], "loads", "{model}: {t}");
        assert_eq!(fix["fixed_model_check"]["pass"], true, "{model}: {t}");
        // The else branches no run computed are said to be unchecked (an independent tester's ask).
        let summary = fix["summary"].as_str().unwrap();
        assert!(
            summary.contains("'by_rate' took its then_branch")
                && summary.contains("the branches not taken are written converted with nothing kept"),
            "{model}: {summary}"
        );
        // The keep list names the hand-over, which is no node of the file: the summary says why
        // the file lists fewer FP32 nodes (two testers asked).
        assert!(
            summary.contains("1 of the kept names hand a body's value to its If's or Loop's output"),
            "{model}: {summary}"
        );
        // The written model's FP32 nodes are named where they are; the hand-over is no node of it.
        let fp32: Vec<&str> =
            fix["fixed_model_fp32_nodes"].as_array().unwrap().iter().map(|p| p[0].as_str().unwrap()).collect();
        assert!(fp32.contains(&up) && !fp32.contains(&handover), "{model}: {fp32:?}");
        let flags = fix["trtexec_flags"].as_str().unwrap();
        assert!(
            flags.contains("up:fp32") && !flags.contains("output0"),
            "{model}: TensorRT has no layer the inlining made: {flags}"
        );
        // Inside the written branch, `up` reads the float32 input and weight: nothing cast.
        let fixed = layerwise_model::Model::load(&dir.path().join("fixed.onnx")).unwrap();
        let then_of =
            |n: &NodeProto| n.attribute.iter().find(|a| a.name() == "then_branch").unwrap().g.clone().unwrap();
        let mut branch = then_of(fixed.graph().node.iter().find(|n| n.name() == "by_rate").unwrap());
        if nested {
            branch = then_of(branch.node.iter().find(|n| n.name() == "stage").unwrap());
        }
        let up_node = branch.node.iter().find(|n| n.name() == "up").expect("up in the written branch");
        assert_eq!(up_node.input, vec!["x".to_string(), "big".to_string()], "{model}: kept in FP32 in the branch");
    }

    // A keep-list name inside a body that the body lacks is refused as the user gave it.
    save(&overflow_through_an_if_output(true), &dir.path().join("nested.onnx"));
    for wrong in ["by_rate/then/stage/then/nope", "by_rate/then/stage/output1"] {
        let out = layerwise(&["convert", "nested.onnx", "-o", "c.onnx", "--keep-fp32", wrong], dir.path());
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        assert!(t.contains(&format!("node '{wrong}' does not exist in the model")), "{t}");
        assert!(!dir.path().join("c.onnx").exists(), "{t}");
    }
    // ONNX's branch names and a body node's own name (as the trtexec flags print it) are refused
    // with the name layerwise would take (an independent tester's two likely guesses).
    // A path that skips a level is hinted from the top too.
    for (guess, meant) in [
        ("by_rate/then_branch/stage/then/up", "by_rate/then/stage/then/up"),
        ("up", "by_rate/then/stage/then/up"),
        ("by_rate/then/up", "by_rate/then/stage/then/up"),
    ] {
        let out = layerwise(&["convert", "nested.onnx", "-o", "c.onnx", "--keep-fp32", guess], dir.path());
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        assert!(
            t.contains(&format!("node '{guess}' does not exist in the model as named;"))
                && t.contains(&format!("try '{meant}'")),
            "{t}"
        );
        assert!(!dir.path().join("c.onnx").exists(), "{t}");
    }
    let out = layerwise(
        &[
            "convert",
            "nested.onnx",
            "-o",
            "c.onnx",
            "--keep-fp32",
            "by_rate/then/stage/then/up,by_rate/then/stage/output0",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A Constant in a branch (unnamed: `If/then/Constant#0`) and one in the main graph, each read by
/// a Mul. A Constant's value follows the nodes that read it, so naming one in a keep list changed
/// nothing and was accepted silently (left over by the independent tester on silero-vad; a second
/// tester found the same through an If's outer values and a Loop's carried inputs, and with the
/// readers named beside it). It is refused, every one at once, with the nodes that read it.
fn constants_read_by_muls() -> ModelProto {
    let mut b = ModelBuilder::new("constants", 17);
    let dims = [Dim::from(4)];
    b.input("x", DataType::Float, &dims);
    b.initializer(f32_tensor("zero", &[], &[0.0]));
    let thirds = || f32_tensor("v", &[4], &[1.0 / 3.0, std::f32::consts::PI, 1e-5, 7.0]);
    let then_branch = GraphProto {
        name: Some("then".into()),
        node: vec![
            node("Constant", "", &[], &["c"], vec![attr::tensor("value", thirds())]),
            node("Mul", "mul", &["x", "c"], &["t"], vec![]),
        ],
        output: vec![value("t", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    // The else branch reads a main-graph Constant from the outer scope: the If reads it.
    let else_branch = GraphProto {
        name: Some("else".into()),
        node: vec![node("Sub", "shift", &["x", "o_value"], &["e"], vec![])],
        output: vec![value("e", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    b.node("Constant", "o", &[], &["o_value"], vec![attr::tensor("value", thirds())]);
    b.node("ReduceSum", "sum", &["x"], &["s"], vec![attr::int("keepdims", 0)]);
    b.node("Greater", "positive", &["s", "zero"], &["cond"], vec![]);
    b.node(
        "If",
        "If_0",
        &["cond"],
        &["y0"],
        vec![attr::graph("then_branch", then_branch), attr::graph("else_branch", else_branch)],
    );
    b.node("Constant", "k", &[], &["k_value"], vec![attr::tensor("value", thirds())]);
    b.node("Mul", "scale", &["y0", "k_value"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

#[test]
fn a_constant_in_a_keep_list_is_refused_with_the_nodes_that_read_it() {
    let dir = tempfile::tempdir().unwrap();
    save(&constants_read_by_muls(), &dir.path().join("m.onnx"));
    for (keep, listed, readers) in [
        ("If_0/then/Constant#0", vec!["'If_0/then/Constant#0' (read by If_0/then/mul)"], "If_0/then/mul"),
        ("k", vec!["'k' (read by scale)"], "scale"),
        // Beside its readers it changes nothing either: the file is the readers' alone.
        ("k,scale", vec!["'k' (read by scale)"], "scale"),
        ("If_0/then/Constant#0,If_0/then/mul", vec!["'If_0/then/Constant#0' (read by If_0/then/mul)"], "If_0/then/mul"),
        // Read only from a branch, through the outer scope (silero-vad's weights, a second tester).
        ("o", vec!["'o' (read by If_0)"], "If_0"),
    ] {
        let out = layerwise(&["convert", "m.onnx", "-o", "c.onnx", "--keep-fp32", keep], dir.path());
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{keep}: {t}");
        for l in listed {
            assert!(t.contains(l), "{keep}: {t}");
        }
        assert!(
            t.contains("naming it changes nothing") && t.contains(&format!("(--keep-fp32 {readers})")),
            "{keep}: {t}"
        );
        assert!(!dir.path().join("c.onnx").exists(), "{keep}: nothing written");
    }
    // Every Constant of every graph named at once (the testers had to rerun once per Constant,
    // then once per graph).
    let out = layerwise(&["convert", "m.onnx", "-o", "c.onnx", "--keep-fp32", "k,If_0/then/Constant#0"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("names 2 Constant nodes: 'If_0/then/Constant#0' (read by If_0/then/mul); 'k' (read by scale)")
            && t.contains("leave them out"),
        "{t}"
    );
    let mut b = ModelBuilder::new("two", 17);
    b.input("x", DataType::Float, &[Dim::from(2)]);
    b.node("Constant", "a", &[], &["av"], vec![attr::tensor("value", f32_tensor("a", &[2], &[1.0 / 3.0, 2.0]))]);
    b.node("Constant", "b", &[], &["bv"], vec![attr::tensor("value", f32_tensor("b", &[2], &[0.1, 0.2]))]);
    b.node("Mul", "m", &["x", "av"], &["y0"], vec![]);
    b.node("Add", "p", &["y0", "bv"], &["y"], vec![]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("two.onnx"));
    let out = layerwise(&["convert", "two.onnx", "-o", "c.onnx", "--keep-fp32", "b,a"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("names 2 Constant nodes: 'a' (read by m); 'b' (read by p)") && t.contains("(--keep-fp32 m,p)"),
        "{t}"
    );
    // The readers alone convert.
    let out = layerwise(&["convert", "m.onnx", "-o", "c.onnx", "--keep-fp32", "If_0/then/mul,scale"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A weight beyond FP16 that no node reads (here a graph output) was reported as "read by " with
/// nothing after it (an independent tester); it stays float32, and the line says so.
#[test]
fn an_overflowing_weight_no_node_reads_is_said_to_stay_float32() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("lone", 17);
    b.input("x", DataType::Float, &[Dim::from(2)]);
    b.initializer(f32_tensor("lone_out", &[2], &[70_000.0, 1.0]));
    b.initializer(f32_tensor("half", &[2], &[0.5, 0.5]));
    b.node("Mul", "m", &["x", "half"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.output("lone_out", DataType::Float);
    save(&b.build(), &dir.path().join("lone.onnx"));
    let out = layerwise(&["convert", "lone.onnx", "-o", "c.onnx"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(
        t.contains("weight 'lone_out' is beyond the FP16 range; no node reads it, and it stays float32")
            && !t.contains("read by \n"),
        "{t}"
    );
    let written = layerwise_model::Model::load(&dir.path().join("c.onnx")).unwrap();
    let lone = written.graph().initializer.iter().find(|t| t.name() == "lone_out").unwrap();
    assert_eq!(lone.data_type(), DataType::Float as i32, "kept float32");
}

/// A weight beyond FP16 read only inside an If branch, from the outer scope: the branch's reader
/// was converted and cast the weight to FP16, inf (found by an independent tester; the summary
/// said no node read it). Its reader is kept FP32 in the branch, as a main-graph reader is.
#[test]
fn an_overflowing_weight_read_inside_a_branch_keeps_its_reader_fp32_there() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("outer_big", 17);
    let dims = [Dim::from(2)];
    b.input("x", DataType::Float, &dims);
    b.input("c", DataType::Bool, &[]);
    b.initializer(f32_tensor("big", &[2], &[100_000.0, 1.0]));
    let then_branch = GraphProto {
        name: Some("then".into()),
        node: vec![node("Add", "addbig", &["x", "big"], &["t"], vec![])],
        output: vec![value("t", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    let else_branch = GraphProto {
        name: Some("else".into()),
        node: vec![node("Neg", "negate", &["x"], &["e"], vec![])],
        output: vec![value("e", DataType::Float, Some(&dims))],
        ..Default::default()
    };
    b.node(
        "If",
        "myif",
        &["c"],
        &["y"],
        vec![attr::graph("then_branch", then_branch), attr::graph("else_branch", else_branch)],
    );
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("m.onnx"));
    let out = layerwise(&["convert", "m.onnx", "-o", "c.onnx"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(
        t.contains("FP32 myif/then/addbig: reads weight 'big', which is beyond the FP16 range")
            && t.contains("weight 'big' is beyond the FP16 range; read by myif/then/addbig"),
        "{t}"
    );
    let written = layerwise_model::Model::load(&dir.path().join("c.onnx")).unwrap();
    let myif = written.graph().node.iter().find(|n| n.name() == "myif").unwrap();
    let then = myif.attribute.iter().find(|a| a.name() == "then_branch").unwrap().g.clone().unwrap();
    let add = then.node.iter().find(|n| n.name() == "addbig").unwrap();
    assert_eq!(
        add.input,
        vec!["x".to_string(), "big".to_string()],
        "the float32 weight read as it is, no Cast to FP16"
    );
}
