//! A `--cand-model` whose tensors do not share the reference's names (another exporter, another
//! tool's FP16 conversion): its tensors are paired by structure, so the walk still reaches the
//! layer that breaks.

use std::collections::{HashMap, HashSet};

use crate::common::{json, layerwise, planted, save, text, Ending};
use layerwise_model::onnx::{ModelProto, NodeProto};
use serde_json::Value;

/// Every intermediate tensor and every node renamed, as another exporter would name them; graph
/// inputs, outputs and weights keep their names.
fn renamed(model: &ModelProto) -> ModelProto {
    let mut m = model.clone();
    let g = m.graph.as_mut().unwrap();
    let keep: HashSet<String> = g
        .input
        .iter()
        .chain(&g.output)
        .map(|v| v.name().to_string())
        .chain(g.initializer.iter().map(|t| t.name().to_string()))
        .collect();
    let mut names: HashMap<String, String> = HashMap::new();
    for (i, n) in g.node.iter_mut().enumerate() {
        n.name = Some(format!("exported_{i}"));
        for o in n.output.iter().filter(|o| !keep.contains(*o)) {
            let fresh = format!("t{}", names.len());
            names.insert(o.clone(), fresh);
        }
    }
    for n in g.node.iter_mut() {
        for t in n.input.iter_mut().chain(n.output.iter_mut()) {
            if let Some(new) = names.get(t.as_str()) {
                *t = new.clone();
            }
        }
    }
    m
}

/// `model` with its Identity nodes removed (their readers read the Identity's input), as another
/// exporter leaves them out.
fn without_identity(model: &ModelProto) -> ModelProto {
    let mut m = model.clone();
    let g = m.graph.as_mut().unwrap();
    let outputs: HashSet<String> = g.output.iter().map(|v| v.name().to_string()).collect();
    let mut bypass: HashMap<String, String> = HashMap::new();
    let mut nodes = Vec::new();
    for mut n in std::mem::take(&mut g.node) {
        for t in n.input.iter_mut() {
            while let Some(src) = bypass.get(t.as_str()) {
                *t = src.clone();
            }
        }
        if n.op_type() == "Identity" && !outputs.contains(&n.output[0]) {
            bypass.insert(n.output[0].clone(), n.input[0].clone());
            continue;
        }
        nodes.push(n);
    }
    g.node = nodes;
    m
}

/// The planted model with an Identity in the middle of its first branch.
fn planted_with_identity() -> ModelProto {
    let mut m = planted(Ending::ExpOverflow);
    let g = m.graph.as_mut().unwrap();
    let at = g.node.iter().position(|n| n.name() == "branch_a/Add_10").unwrap();
    let out = g.node[at].output[0].clone();
    g.node[at].output[0] = format!("{out}_pre");
    g.node.insert(
        at + 1,
        NodeProto {
            op_type: Some("Identity".into()),
            name: Some("branch_a/keep".into()),
            input: vec![format!("{out}_pre")],
            output: vec![out],
            ..Default::default()
        },
    );
    m
}

fn compared(report: &Value) -> usize {
    report["tensors"].as_array().unwrap().len()
}

#[test]
fn a_renamed_export_is_matched_by_structure_and_gives_the_same_first_divergent_layer() {
    let dir = tempfile::tempdir().unwrap();
    let reference = planted(Ending::ExpOverflow);
    save(&reference, &dir.path().join("ref.onnx"));
    save(&renamed(&reference), &dir.path().join("renamed.onnx"));
    let run = |cand: &str, mode: &str, json_name: &str| {
        let out = layerwise(
            &["bisect", "ref.onnx", "--cand", "sim:fp16", "--cand-model", cand, "--match", mode, "--json", json_name],
            dir.path(),
        );
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        json(&dir.path().join(json_name))
    };
    let same = run("ref.onnx", "auto", "same.json");
    let by_structure = run("renamed.onnx", "auto", "renamed.json");
    let by_name = run("renamed.onnx", "name", "name.json");
    let expected = &same["verdict"]["first_divergent"]["node"];
    assert_eq!(expected, "head/Exp");
    assert_eq!(&by_structure["verdict"]["first_divergent"]["node"], expected);
    assert!(
        compared(&by_structure) * 10 >= compared(&same) * 9,
        "{} of {} tensors matched",
        compared(&by_structure),
        compared(&same)
    );
    let matching = &by_structure["matching"];
    assert_eq!(matching["mode"], "auto");
    assert!(matching["by_structure"].as_u64().unwrap() > 100, "{matching}");
    // Names alone find only the output: the walk cannot reach the break.
    assert!(compared(&by_name) <= 2, "{}", compared(&by_name));
    assert!(by_name["verdict"]["first_divergent"].is_null());
}

#[test]
fn inserted_casts_and_a_removed_identity_do_not_break_the_matching() {
    let dir = tempfile::tempdir().unwrap();
    let reference = planted_with_identity();
    save(&reference, &dir.path().join("ref.onnx"));
    // Another tool's FP16 export: converted (Casts at the float32 edges), the Identity left out,
    // every tensor and node renamed.
    let out = layerwise(&["convert", "ref.onnx", "-o", "converted.onnx"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let converted = layerwise_model::Model::load(&dir.path().join("converted.onnx")).unwrap();
    assert!(converted.graph().node.iter().any(|n| n.op_type() == "Cast"), "the converter inserted Casts");
    save(&renamed(&without_identity(&converted.proto)), &dir.path().join("cand.onnx"));

    let out = layerwise(
        &["bisect", "ref.onnx", "--cand", "ort:cpu", "--cand-model", "cand.onnx", "--json", "r.json"],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let r = json(&dir.path().join("r.json"));
    assert_eq!(r["verdict"]["first_divergent"]["node"], "head/Exp", "{t}");
    // The reference's Identity output is the value of its input in the candidate.
    let pairs = r["matching"]["structure_pairs"].as_array().unwrap();
    let identity_out =
        reference.graph.as_ref().unwrap().node.iter().find(|n| n.name() == "branch_a/keep").unwrap().output[0].clone();
    assert!(pairs.iter().any(|p| p[0] == identity_out.as_str()), "the Identity's output is paired: {pairs:?}");
    let total = reference.graph.as_ref().unwrap().node.len();
    assert!(compared(&r) * 10 >= total * 9, "{} of {total} tensors compared", compared(&r));
}

/// A twin that declares fewer inputs (a voice-activity
/// model's half-precision export takes `input, state`, its opset-15 sibling also `sr`). Each model
/// gets the inputs it declares, the report notes the input fed to one side only, and an array
/// neither declares is an error that names both models' inputs.
#[test]
fn a_twin_with_other_inputs_gets_the_inputs_it_declares() {
    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    use layerwise_model::DataType;
    let dir = tempfile::tempdir().unwrap();
    let twin = |with_rate: bool| {
        let mut b = ModelBuilder::new("vad", 17);
        b.input("input", DataType::Float, &[Dim::from(1), Dim::from(8)]);
        if with_rate {
            b.input("sr", DataType::Int64, &[]);
        }
        b.initializer(f32_tensor("w", &[8], &[0.5, -0.25, 0.125, 1.0, 2.0, -1.0, 0.75, 0.3]));
        b.node("Mul", "scale", &["input", "w"], &["y"], vec![]);
        b.node("Sigmoid", "prob", &["y"], &["p"], vec![]);
        b.output("p", DataType::Float);
        b.build()
    };
    save(&twin(true), &dir.path().join("ref.onnx"));
    save(&twin(false), &dir.path().join("twin.onnx"));
    let write = |file: &str, extra: bool| {
        let mut arrays = vec![
            (
                "input".to_string(),
                layerwise_runtime::Tensor::f32(vec![1, 8], vec![0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.7, 0.8]),
            ),
            ("sr".to_string(), layerwise_runtime::Tensor::new(vec![], layerwise_runtime::TensorData::I64(vec![16000]))),
        ];
        if extra {
            arrays.push(("bogus".to_string(), layerwise_runtime::Tensor::f32(vec![1], vec![0.0])));
        }
        let refs: Vec<(&str, &layerwise_runtime::Tensor)> = arrays.iter().map(|(n, t)| (n.as_str(), t)).collect();
        layerwise_runtime::npy::write_npz(&dir.path().join(file), &refs).unwrap();
    };
    write("in.npz", false);
    let out = layerwise(
        &[
            "bisect",
            "ref.onnx",
            "--cand",
            "ort:cpu",
            "--cand-model",
            "twin.onnx",
            "--inputs",
            "in.npz",
            "--json",
            "r.json",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let notes = json(&dir.path().join("r.json"))["cand"]["notes"].clone();
    assert!(
        notes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("input 'sr' is fed to the reference only")),
        "{notes}"
    );
    write("bad.npz", true);
    let out = layerwise(
        &["bisect", "ref.onnx", "--cand", "ort:cpu", "--cand-model", "twin.onnx", "--inputs", "bad.npz"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("holds array 'bogus', which neither model declares (reference inputs: input, sr; candidate model inputs: input)"), "{}", text(&out));
    assert!(!text(&out).contains("error: :"), "no empty context: {}", text(&out));
}

/// A converted candidate file whose weights are named differently: which weights it keeps in
/// float32 cannot be told by name, so the noise floor perturbs every weight (an upper bound) and
/// the verdict says so instead of claiming a floor of only what the file rounds.
#[test]
fn a_floor_against_a_file_with_other_weight_names_says_what_it_could_not_tell() {
    let dir = tempfile::tempdir().unwrap();
    // A finite error: where the candidate's is inf no floor is measured.
    save(&planted(Ending::SoftmaxAmplification), &dir.path().join("ref.onnx"));
    let c = layerwise(&["convert", "ref.onnx", "--to", "fp16", "-o", "c.onnx"], dir.path());
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    let mut converted = layerwise_model::Model::load(&dir.path().join("c.onnx")).unwrap().proto;
    let g = converted.graph.as_mut().unwrap();
    let names: HashMap<String, String> =
        g.initializer.iter().enumerate().map(|(i, t)| (t.name().to_string(), format!("w{i}"))).collect();
    for t in g.initializer.iter_mut() {
        t.name = Some(names[t.name()].clone());
    }
    for n in g.node.iter_mut() {
        for i in n.input.iter_mut() {
            if let Some(new) = names.get(i.as_str()) {
                *i = new.clone();
            }
        }
    }
    save(&converted, &dir.path().join("renamed.onnx"));
    let out = layerwise(
        &["bisect", "ref.onnx", "--cand", "ort:cpu", "--cand-model", "renamed.onnx", "--json", "r.json"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let r = json(&dir.path().join("r.json"));
    let said = r["verdict"]["conclusions"].to_string();
    assert!(said.contains("names its weights differently"), "{said}");
    // With the names kept, nothing of the kind is said.
    let out = layerwise(
        &["bisect", "ref.onnx", "--cand", "ort:cpu", "--cand-model", "c.onnx", "--json", "k.json"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(!json(&dir.path().join("k.json"))["verdict"]["conclusions"]
        .to_string()
        .contains("names its weights differently"));
}
