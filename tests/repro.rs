//! `bisect --repro DIR`: the first divergent layer as a standalone model with its data, for a bug
//! report to the backend's maintainers or a unit test.

use crate::common::{assert_refused, json, layerwise, planted, save, saved_tensor, text, Ending};
use layerwise_runtime::Tensor;

fn pb(path: &std::path::Path) -> Tensor {
    use prost::Message;
    let proto = layerwise_model::onnx::TensorProto::decode(std::fs::read(path).unwrap().as_slice()).unwrap();
    Tensor::from_proto(&proto).unwrap()
}

#[test]
fn the_repro_shows_the_error_on_the_candidate_and_matches_on_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    save(&planted(Ending::ExpOverflow), &dir.path().join("m.onnx"));
    let out = layerwise(&["bisect", "m.onnx", "--repro", "repro", "--json", "r.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let r = json(&dir.path().join("r.json"));
    assert_eq!(r["repro"]["nodes"], serde_json::json!(["head/Exp"]), "{t}");
    assert_eq!(r["repro"]["reproduces"], true);
    assert!(t.contains("repro: repro (1 node(s); the candidate's error shows there too)"), "{t}");
    let repro = dir.path().join("repro");
    for file in [
        "model.onnx",
        "inputs.npz",
        "README.md",
        "test_data_set_0/input_0.pb",
        "test_data_set_0/output_0.pb",
        "candidate_outputs/output_0.pb",
    ] {
        assert!(repro.join(file).is_file(), "{file} written");
    }
    let readme = std::fs::read_to_string(repro.join("README.md")).unwrap();
    // With the tolerance that judged the tensor (FP16 defaults here), so that its verdict is the bisect's.
    assert!(readme.contains("layerwise bisect model.onnx --ref ort:cpu --cand sim:fp16 --inputs inputs.npz --atol 1e-4 --rtol 1e-2 --range-tol 1e-2"), "{readme}");

    // The candidate on the repro: the same node breaks, for the same reason.
    let out = layerwise(
        &["bisect", "model.onnx", "--cand", "sim:fp16", "--inputs", "inputs.npz", "--json", "again.json"],
        &repro,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let again = json(&repro.join("again.json"));
    assert_eq!(again["verdict"]["first_divergent"]["node"], "head/Exp");
    assert_eq!(again["verdict"]["first_divergent"]["cause"]["kind"], "value_overflow");
    // The reference on the repro gives the recorded outputs, value for value.
    let out = layerwise(
        &["bisect", "model.onnx", "--cand", "ort:cpu", "--inputs", "inputs.npz", "--save-tensors", "saved"],
        &repro,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let expected = pb(&repro.join("test_data_set_0/output_0.pb"));
    assert_eq!(saved_tensor(&repro.join("saved/ref"), "exp"), expected);
    // The candidate's recorded output holds the overflow.
    assert!(pb(&repro.join("candidate_outputs/output_0.pb")).to_f32().iter().any(|v| v.is_infinite()));
}

#[test]
fn a_repro_folder_that_is_not_empty_is_refused_before_any_run() {
    let dir = tempfile::tempdir().unwrap();
    save(&planted(Ending::ExpOverflow), &dir.path().join("m.onnx"));
    std::fs::create_dir(dir.path().join("full")).unwrap();
    std::fs::write(dir.path().join("full/old.txt"), "keep me").unwrap();
    let args = ["bisect", "m.onnx", "--repro", "full"];
    let out = layerwise(&args, dir.path());
    assert_refused(&out, &args, "the folder is not empty");
    assert_eq!(std::fs::read_to_string(dir.path().join("full/old.txt")).unwrap(), "keep me");
    assert_eq!(std::fs::read_dir(dir.path().join("full")).unwrap().count(), 1);
}
