//! The command line: exit codes, the demo, and a specific error (exit 2, nothing written) for each
//! kind of bad input.

use std::path::PathBuf;

use crate::common;
use crate::common::{assert_refused, dynamic_model, layerwise, planted, save, text, Ending};
use layerwise_runtime::npy::{write_npy_file, write_npz};
use layerwise_runtime::{Tensor, TensorData};

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Case {
        Case { dir: tempfile::tempdir().unwrap() }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn p(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
    /// Runs bisect with a JSON report requested, and checks the failure: exit 2, the message,
    /// no report written.
    fn fails(&self, args: &[&str], message: &str) {
        let json = self.p("report.json");
        let _ = std::fs::remove_file(&json);
        let mut all: Vec<&str> = vec!["bisect"];
        all.extend(args);
        all.extend(["--json", &json]);
        assert_refused(&layerwise(&all, self.dir.path()), args, message);
        assert!(!self.path("report.json").exists(), "a failed run must not write a report");
    }
}

#[test]
fn demo_finds_the_planted_layer_and_writes_its_report() {
    let case = Case::new();
    let out = layerwise(&["demo", "--out-dir", "demo"], case.dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("First divergent layer: encoder/ln/Pow (Pow)"), "{t}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(case.path("demo/report.json")).unwrap()).unwrap();
    assert_eq!(report["schema"], "layerwise.report/1");
    assert_eq!(report["verdict"]["status"], "diverged");
    assert_eq!(report["verdict"]["first_divergent"]["node"], "encoder/ln/Pow");
    assert_eq!(report["verdict"]["first_divergent"]["cause"]["kind"], "value_overflow");
    assert_eq!(report["worst_output"], "logits");
    let tensors = report["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 15);
    let topo: Vec<u64> = tensors.iter().map(|t| t["topo_index"].as_u64().unwrap()).collect();
    assert!(topo.windows(2).all(|w| w[0] <= w[1]), "tensors in topological order");
    assert!(tensors.iter().any(|t| t["node"] == "Tanh#14"), "unnamed nodes get synthetic names");
    let features = report["outputs"].as_array().unwrap().iter().find(|o| o["name"] == "features").unwrap();
    assert_eq!(features["pass"], true, "the healthy branch passes");
    let pow = tensors.iter().find(|t| t["name"] == "ln_squared").unwrap();
    assert_eq!(pow["metrics"]["max_abs_err"], "inf", "non-finite numbers are strings in JSON");
    // The demo's fix step: the LayerNorm pattern, verified, written out.
    assert!(t.contains("FIX: FIXED - keeping 9 of 15 nodes in FP32 (decomposed_layernorm"), "{t}");
    let fix: serde_json::Value = serde_json::from_slice(&std::fs::read(case.path("demo/fix.json")).unwrap()).unwrap();
    assert_eq!(fix["fixed_model_check"]["pass"], true);
    assert!(case.path("demo/demo_fp16_fixed.onnx").exists());
    // `-q` shows no progress on stderr, in the demo too (it printed its bisect's steps; an
    // independent tester).
    let out = layerwise(&["-q", "demo", "--out-dir", "quiet"], case.dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn exit_codes_follow_the_verdict_and_the_model_is_untouched() {
    let case = Case::new();
    save(&planted(Ending::Healthy), &case.path("healthy.onnx"));
    save(&planted(Ending::ExpOverflow), &case.path("broken.onnx"));
    let before = std::fs::read(case.path("broken.onnx")).unwrap();
    let healthy = layerwise(&["bisect", &case.p("healthy.onnx")], case.dir.path());
    assert_eq!(healthy.status.code(), Some(0), "{}", text(&healthy));
    assert!(text(&healthy).contains("VERDICT: PASS"));
    let broken = layerwise(&["bisect", &case.p("broken.onnx"), "--json", &case.p("r.json")], case.dir.path());
    assert_eq!(broken.status.code(), Some(1), "{}", text(&broken));
    assert!(text(&broken).contains("First divergent layer: head/Exp (Exp)"), "{}", text(&broken));
    assert!(case.path("r.json").exists());
    assert_eq!(std::fs::read(case.path("broken.onnx")).unwrap(), before, "the input model is never modified");
    let leftovers: Vec<_> = std::fs::read_dir(case.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary files left: {leftovers:?}");
}

#[test]
fn bad_inputs_give_specific_errors() {
    let case = Case::new();
    save(&dynamic_model(), &case.path("dyn.onnx"));
    let dynm = case.p("dyn.onnx");

    case.fails(&[&case.p("absent.onnx")], "model file not found");
    std::fs::write(case.path("text.onnx"), "definitely not protobuf \u{ff}\u{fe}").unwrap();
    case.fails(&[&case.p("text.onnx")], "is not an ONNX model: protobuf decoding failed");
    let full = std::fs::read(case.path("dyn.onnx")).unwrap();
    std::fs::write(case.path("truncated.onnx"), &full[..full.len() - 7]).unwrap();
    case.fails(&[&case.p("truncated.onnx")], "is not an ONNX model: protobuf decoding failed");
    std::fs::write(case.path("notmodel.pb"), [0xA0u8, 0x06, 0x01]).unwrap();
    case.fails(&[&case.p("notmodel.pb")], "decodes as protobuf but is not an ONNX model");

    // External data that is missing.
    let mut ext = planted(Ending::Healthy);
    {
        use layerwise_model::onnx::{tensor_proto::DataLocation, StringStringEntryProto};
        let t = &mut ext.graph.as_mut().unwrap().initializer[0];
        t.raw_data = None;
        t.external_data =
            vec![StringStringEntryProto { key: Some("location".into()), value: Some("weights.bin".into()) }];
        t.data_location = Some(DataLocation::External as i32);
    }
    save(&ext, &case.path("ext.onnx"));
    case.fails(&[&case.p("ext.onnx")], "external data of initializer 'branch_a_w0'");

    // Dynamic dimension without a value.
    case.fails(&[&dynm], "dynamic dimensions without a value in 'x' (dim 0 'batch'); 'ids' (dim 0 'batch')");
    // Inputs from an npz: a missing input, a wrong dtype, a wrong shape, an unknown array.
    let x = Tensor::f32(vec![2, 4], vec![0.5; 8]);
    let ids = Tensor::new(vec![2], TensorData::I64(vec![1, 2]));
    let ids_f32 = Tensor::f32(vec![2], vec![1.0, 2.0]);
    let x_bad = Tensor::f32(vec![2, 5], vec![0.5; 10]);
    write_npz(&case.path("only_x.npz"), &[("x", &x)]).unwrap();
    case.fails(&[&dynm, "--inputs", &case.p("only_x.npz")], "input 'ids' is not in");
    write_npz(&case.path("dtype.npz"), &[("x", &x), ("ids", &ids_f32)]).unwrap();
    case.fails(&[&dynm, "--inputs", &case.p("dtype.npz")], "input 'ids' must be int64 but");
    write_npz(&case.path("shape.npz"), &[("x", &x_bad), ("ids", &ids)]).unwrap();
    case.fails(&[&dynm, "--inputs", &case.p("shape.npz")], "input 'x' has shape 2x5 from");
    write_npz(&case.path("extra.npz"), &[("x", &x), ("ids", &ids), ("y", &x)]).unwrap();
    case.fails(&[&dynm, "--inputs", &case.p("extra.npz")], "holds array 'y', but the model has no input of that name");
    write_npz(&case.path("good.npz"), &[("x", &x), ("ids", &ids)]).unwrap();
    // A symbol must take one value across inputs.
    case.fails(
        &[&dynm, "--input-shape", "x:3x4", "--input-shape", "ids:2"],
        "dimension 'batch' is 2 in input 'ids' but 3 in input 'x'",
    );
    case.fails(&[&dynm, "--input-shape", "nope:1x4"], "the model has no input 'nope'");
    // Backend specs.
    case.fails(
        &[&dynm, "--inputs", &case.p("good.npz"), "--cand", "tensorflow:gpu"],
        "unknown backend spec 'tensorflow:gpu'",
    );
    case.fails(
        &[&dynm, "--inputs", &case.p("good.npz"), "--cand", "ort:cpu,opt=fast"],
        "opt must be disable, basic, extended or all",
    );
    case.fails(
        &[&dynm, "--inputs", &case.p("good.npz"), "--cand", &format!("npz:{}", case.p("nothing"))],
        "does not exist",
    );
    // Unwritable report folder: refused before any work.
    let out = layerwise(
        &["bisect", &dynm, "--inputs", &case.p("good.npz"), "--json", &case.p("no/such/dir/r.json")],
        case.dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("folder") && text(&out).contains("does not exist"), "{}", text(&out));

    // And the good inputs work, with the dynamic dimension taken from the file.
    let ok = layerwise(
        &["bisect", &dynm, "--inputs", &case.p("good.npz"), "--json", &case.p("report.json")],
        case.dir.path(),
    );
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok));
    assert!(text(&ok).contains("input      x float32 2x4 from npz:"), "{}", text(&ok));

    // Inputs one by one from .npy files, and a chosen subset of tensors.
    write_npy_file(&case.path("x.npy"), &x).unwrap();
    write_npy_file(&case.path("ids.npy"), &ids).unwrap();
    let x_arg = format!("x={}", case.p("x.npy"));
    let ids_arg = format!("ids={}", case.p("ids.npy"));
    let npy = layerwise(&["bisect", &dynm, "--input", &x_arg, "--input", &ids_arg], case.dir.path());
    assert_eq!(npy.status.code(), Some(0), "{}", text(&npy));
    assert!(text(&npy).contains("input      x float32 2x4 from npy:"), "{}", text(&npy));

    save(&planted(Ending::Healthy), &case.path("chain.onnx"));
    let json = case.p("subset.json");
    let subset = layerwise(
        &["bisect", &case.p("chain.onnx"), "--tensors", "branch_b_mul7,branch_a_add3", "--json", &json],
        case.dir.path(),
    );
    assert_eq!(subset.status.code(), Some(0), "{}", text(&subset));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(case.path("subset.json")).unwrap()).unwrap();
    let names: Vec<&str> = report["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["branch_a_add3", "branch_b_mul7", "out"],
        "the chosen tensors plus the output, in topological order"
    );
    case.fails(&[&case.p("chain.onnx"), "--tensors", "no_such_tensor"], "tensor 'no_such_tensor' does not exist");
}

#[test]
fn usage_errors_exit_2() {
    let case = Case::new();
    for args in [&["bisect"][..], &["bisect", "m.onnx", "--input-shape", "x:1xa"], &["frobnicate"]] {
        let out = layerwise(args, case.dir.path());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
    }
}

#[test]
fn convert_writes_a_runnable_fp16_model_and_refuses_bad_requests() {
    use layerwise_model::onnx::{tensor_proto::DataLocation, StringStringEntryProto};
    let case = Case::new();
    // An external-data model: weight `w` lives in weights.bin beside the model.
    let mut proto = common::convertible();
    {
        let w = &mut proto.graph.as_mut().unwrap().initializer[0];
        std::fs::write(case.path("weights.bin"), w.raw_data.take().unwrap()).unwrap();
        let e = |k: &str, v: &str| StringStringEntryProto { key: Some(k.into()), value: Some(v.into()) };
        w.external_data = vec![e("location", "weights.bin"), e("offset", "0"), e("length", "32")];
        w.data_location = Some(DataLocation::External as i32);
    }
    save(&proto, &case.path("ext.onnx"));
    // Both backends load external data from the model's own folder (sim rounds it too).
    let sim = layerwise(&["bisect", &case.p("ext.onnx")], case.dir.path());
    assert_eq!(sim.status.code(), Some(0), "{}", text(&sim));
    assert!(text(&sim).contains("compared 4 tensors"), "{}", text(&sim));
    let out = layerwise(
        &["convert", &case.p("ext.onnx"), "--to", "fp16", "--keep-fp32", "softmax", "-o", &case.p("out/fp16.onnx")],
        case.dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "a missing output folder is an error: {}", text(&out));
    std::fs::create_dir(case.path("out")).unwrap();
    let out = layerwise(
        &["convert", &case.p("ext.onnx"), "--to", "fp16", "--keep-fp32", "softmax", "-o", &case.p("out/fp16.onnx")],
        case.dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("3 nodes FP16, 1 FP32, 4 Casts inserted"), "{}", text(&out));
    assert!(text(&out).contains("FP32 softmax: --keep-fp32"), "{}", text(&out));
    // The converted model stands alone (weights inlined) and compares against the original.
    let cmp = layerwise(
        &["bisect", &case.p("ext.onnx"), "--cand", "ort:cpu", "--cand-model", &case.p("out/fp16.onnx")],
        case.dir.path(),
    );
    assert_eq!(cmp.status.code(), Some(0), "{}", text(&cmp));

    let refuse = |args: &[&str], message: &str| {
        let out = layerwise(args, case.dir.path());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(message), "{args:?}: {}", text(&out));
    };
    refuse(&["convert", &case.p("ext.onnx"), "-o", &case.p("ext.onnx")], "would overwrite the input model");
    refuse(
        &["convert", &case.p("ext.onnx"), "--keep-fp32", "nope", "-o", &case.p("x.onnx")],
        "node 'nope' does not exist",
    );
    refuse(&["convert", &case.p("ext.onnx"), "--to", "int8", "-o", &case.p("x.onnx")], "invalid value 'int8'");
    // An op type the model has no node of was ignored (exit 0).
    refuse(
        &["convert", &case.p("ext.onnx"), "--keep-fp32-op", "Softmax,Bogus", "-o", &case.p("x.onnx")],
        "no node of op type 'Bogus'",
    );
    // A converted model converted again: said so, not only the converter's own tensor names.
    let demo = case.path("demo.onnx");
    save(&layerwise::demo::demo_model(), &demo);
    let out = layerwise(&["convert", &case.p("demo.onnx"), "-o", &case.p("demo16.onnx")], case.dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    refuse(&["convert", &case.p("demo16.onnx"), "-o", &case.p("x.onnx")], "already holds FP16 or BF16 tensors");
    assert!(!case.path("x.onnx").exists());
}

#[test]
fn fix_exit_codes_and_outputs() {
    let case = Case::new();
    save(&common::planted_layernorm(), &case.path("ln.onnx"));
    let out = layerwise(
        &["fix", &case.p("ln.onnx"), "-o", &case.p("fixed.onnx"), "--json", &case.p("fix.json")],
        case.dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("FIX: FIXED - keeping 9 of"), "{}", text(&out));
    assert!(
        text(&out).contains("trtexec --onnx=MODEL --fp16 --precisionConstraints=obey --layerPrecisions='ln/mean:fp32"),
        "{}",
        text(&out)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(case.path("fix.json")).unwrap()).unwrap();
    assert_eq!(report["schema"], "layerwise.fix/1");
    assert_eq!(report["status"], "fixed");
    assert_eq!(report["patterns"][0]["kind"], "decomposed_layernorm");
    assert!(case.path("fixed.onnx").exists() && case.path("fixed.onnx.keep-fp32.json").exists());
    // Nothing to fix on a healthy model: exit 0 and an empty keep list.
    save(&common::planted(common::Ending::Healthy), &case.path("healthy.onnx"));
    let healthy = layerwise(&["fix", &case.p("healthy.onnx")], case.dir.path());
    assert_eq!(healthy.status.code(), Some(0), "{}", text(&healthy));
    assert!(text(&healthy).contains("nothing to keep in FP32"), "{}", text(&healthy));
    let same = layerwise(&["fix", &case.p("ln.onnx"), "-o", &case.p("ln.onnx")], case.dir.path());
    assert_eq!(same.status.code(), Some(2), "{}", text(&same));
}

/// A model saved by a newer onnx package (IR version 14) whose
/// opsets ONNX Runtime supports runs, given to ONNX Runtime as IR version 13, and the report says
/// so; an opset ONNX Runtime does not support is refused with what the model imports and what ONNX
/// Runtime supports, not ONNX Runtime's raw message.
#[test]
fn a_newer_ir_version_is_lowered_where_every_opset_is_supported() {
    let dir = tempfile::tempdir().unwrap();
    let mut newer = dynamic_model();
    newer.ir_version = Some(14);
    save(&newer, &dir.path().join("ir14.onnx"));
    let out = layerwise(
        &["bisect", "ir14.onnx", "--input-shape", "x:1x4", "--input-shape", "ids:1", "--json", "r.json"],
        dir.path(),
    );
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
    assert!(
        r["cand"]["notes"].to_string().contains("declares IR version 14; ONNX Runtime 1.31.1 reads up to 13"),
        "{}",
        r["cand"]["notes"]
    );
    assert_eq!(r["model"]["ir_version"], 14, "the report describes the file as it is");
    let mut future = newer.clone();
    future.opset_import[0].version = Some(28);
    save(&future, &dir.path().join("opset28.onnx"));
    let out = layerwise(&["bisect", "opset28.onnx", "--input-shape", "x:1x4", "--input-shape", "ids:1"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("imports ai.onnx opset 28 (IR version 14); ONNX Runtime 1.31.1, which layerwise runs, supports ai.onnx opsets up to 26"), "{}", text(&out));
}

/// Inputs full of NaN are said in the verdict, not passed over;
/// an --input-shape that contradicts the file giving that input is refused, not ignored.
#[test]
fn nan_inputs_are_said_and_a_conflicting_input_shape_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    save(&layerwise::demo::demo_model(), &dir.path().join("demo.onnx"));
    let mut values = vec![0.01f32; 8 * 64];
    for v in values.iter_mut().take(100) {
        *v = f32::NAN;
    }
    let x = layerwise_runtime::Tensor::f32(vec![1, 8, 64], values);
    layerwise_runtime::npy::write_npz(&dir.path().join("nan.npz"), &[("x", &x)]).unwrap();
    let out = layerwise(&["bisect", "demo.onnx", "--inputs", "nan.npz", "--json", "r.json"], dir.path());
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    assert!(text(&out).contains("input 'x' (npz:nan.npz) holds 100 NaN and 0 inf values of 512"), "{}", text(&out));
    let conflict = layerwise(&["bisect", "demo.onnx", "--inputs", "nan.npz", "--input-shape", "x:1x8x32"], dir.path());
    assert_eq!(conflict.status.code(), Some(2), "{}", text(&conflict));
    assert!(
        text(&conflict)
            .contains("--input-shape x:1x8x32 conflicts with the shape 1x8x64 that npz:nan.npz holds for 'x'"),
        "{}",
        text(&conflict)
    );
}

/// Issue "a newcomer's day", beyond the anchor: per-output tolerances, as Polygraphy's
/// `--atol NAME:VALUE`. The demo's `logits` diverge under FP16; a tolerance given for `logits`
/// alone passes them while `features` keeps the defaults, and the report says which tensor got
/// what. A tensor the model does not compute is refused.
#[test]
fn a_tolerance_can_be_given_for_one_output() {
    let dir = tempfile::tempdir().unwrap();
    save(&layerwise::demo::demo_model(), &dir.path().join("demo.onnx"));
    let strict = layerwise(&["bisect", "demo.onnx", "--no-noise-floor"], dir.path());
    assert_eq!(strict.status.code(), Some(1), "{}", text(&strict));
    let loose = layerwise(
        &["bisect", "demo.onnx", "--atol", "logits:1e9", "--rtol", "logits:0", "--json", "r.json"],
        dir.path(),
    );
    assert_eq!(loose.status.code(), Some(0), "{}", text(&loose));
    assert!(text(&loose).contains("'logits': |cand - ref| <= 1000000000 + 0 * |ref|"), "{}", text(&loose));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
    assert_eq!(r["tolerances"]["by_tensor"][0]["tensor"], "logits");
    assert_eq!(r["tolerances"]["atol"], 1e-4, "every other tensor keeps the defaults");
    let unknown = layerwise(&["bisect", "demo.onnx", "--atol", "nope:1e-3"], dir.path());
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown));
    assert!(
        text(&unknown).contains("a tolerance is given for 'nope', which is not a tensor the model computes"),
        "{}",
        text(&unknown)
    );
    let bad = layerwise(&["bisect", "demo.onnx", "--atol", "logits:much"], dir.path());
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
}

/// Inputs a model cannot take (a 5x5 convolution fed 2x2): ONNX Runtime infers a negative
/// dimension and the `ort` crate panicked reading it (found by the independent tester on
/// mtcnn's P-Net). Now a refusal, with no report written.
#[test]
fn inputs_too_small_for_a_convolution_are_refused_without_a_panic() {
    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    use layerwise_model::DataType;
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("conv5", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(1), Dim::from("h"), Dim::from("w")]);
    b.initializer(f32_tensor("k", &[1, 1, 5, 5], &[0.04; 25]));
    b.node("Conv", "conv", &["x", "k"], &["y"], vec![]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("conv5.onnx"));
    for extra in [&[][..], &["--separate-runs"][..]] {
        let mut args = vec!["bisect", "conv5.onnx", "--input-shape", "x:1x1x2x2", "--json", "r.json"];
        args.extend_from_slice(extra);
        let out = layerwise(&args, dir.path());
        assert_refused(&out, &args, "impossible shape for these inputs");
        assert!(!dir.path().join("r.json").exists());
    }
}

/// No output replaces the input model's external data file (`convert m.onnx -o m.weights` destroyed
/// the model it read).
#[test]
fn no_output_replaces_the_models_external_weights() {
    let dir = tempfile::tempdir().unwrap();
    let mut proto = planted(Ending::ExpOverflow);
    {
        use layerwise_model::onnx::{tensor_proto::DataLocation, StringStringEntryProto};
        let t = &mut proto.graph.as_mut().unwrap().initializer[0];
        let raw = t.raw_data.take().unwrap();
        std::fs::write(dir.path().join("m.weights"), &raw).unwrap();
        let entry = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
        t.external_data = vec![entry("location", "m.weights".into()), entry("length", raw.len().to_string())];
        t.data_location = Some(DataLocation::External as i32);
    }
    save(&proto, &dir.path().join("m.onnx"));
    let before = std::fs::read(dir.path().join("m.weights")).unwrap();
    for args in [
        &["convert", "m.onnx", "--to", "fp16", "-o", "m.weights"][..],
        &["convert", "m.onnx", "--to", "fp16-emulated", "-o", "./m.weights"][..],
        &["bisect", "m.onnx", "--json", "m.weights"][..],
        &["bisect", "m.onnx", "--html", "m.weights"][..],
        &["bisect", "m.onnx", "--cand", "ort:cpu", "--cand-model", "m.onnx", "--csv", "m.weights"][..],
        &["fix", "m.onnx", "-o", "m.weights"][..],
    ] {
        let out = layerwise(args, dir.path());
        assert_refused(&out, args, "would overwrite the input model's external data");
        assert_eq!(std::fs::read(dir.path().join("m.weights")).unwrap(), before, "{args:?}");
    }
    // Rendering the report later knows the model from the report (`report r.json --html w.data` destroyed the model).
    let made = layerwise(&["bisect", "m.onnx", "--json", "r.json"], dir.path());
    assert!(made.status.code().is_some_and(|c| c <= 1), "{}", text(&made));
    let model_before = std::fs::read(dir.path().join("m.onnx")).unwrap();
    std::fs::copy(dir.path().join("m.onnx"), dir.path().join("fx.onnx.keep-fp32.json")).unwrap();
    for (args, says) in [
        (&["report", "r.json", "--html", "m.weights"][..], "would overwrite the external data of the report's model"),
        (&["report", "r.json", "--csv", "./m.onnx"][..], "would overwrite the report's model"),
        (&["merge", "r.json", "--json", "m.weights"][..], "would overwrite the external data of the report's model"),
        (&["merge", "r.json", "--json", "merged.json", "--html", "m.onnx"][..], "would overwrite the report's model"),
        // `fix -o OUT` also writes OUT.keep-fp32.json.
        (
            &["fix", "fx.onnx.keep-fp32.json", "-o", "fx.onnx"][..],
            "the keep list written beside -o fx.onnx.keep-fp32.json would overwrite the input model",
        ),
    ] {
        let out = layerwise(args, dir.path());
        assert_refused(&out, args, says);
    }
    assert_eq!(std::fs::read(dir.path().join("m.weights")).unwrap(), before);
    assert_eq!(std::fs::read(dir.path().join("m.onnx")).unwrap(), model_before);
}

/// A report or model written to a device is written into it: the temporary-file-and-rename that
/// makes reports atomic replaced /dev/null itself with a regular file (found when the Slurm step
/// of CI could no longer open /dev/null after the independent tester ran `--json /dev/null`).
/// Checked on a FIFO, which is what a device is to the code and needs no privilege.
#[test]
fn reports_written_to_a_device_leave_the_device_in_place() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    save(&planted(Ending::ExpOverflow), &dir.path().join("m.onnx"));
    let fifo = dir.path().join("sink");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // A reader drains the FIFO so that the writer is not blocked.
    let drain = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::read(&fifo).unwrap().len()
    });
    let out = layerwise(&["bisect", "m.onnx", "--json", "sink"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(drain.join().unwrap() > 100, "the report went into the FIFO");
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is still a FIFO");
}

/// A Constant whose tensor is external data (what `onnx.save_model(..., save_as_external_data=True,
/// size_threshold=0)` writes for Constants in functions, or with `convert_attribute=True`) is read
/// from the model's folder, not the working folder (run from a
/// folder holding another `w.data`, the reference computed with that file's values).
#[test]
fn an_external_constant_is_read_from_the_models_folder() {
    use layerwise_model::builder::{attr, node, ModelBuilder};
    use layerwise_model::onnx::{tensor_proto::DataLocation, StringStringEntryProto, TensorProto};
    use layerwise_model::DataType;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("model")).unwrap();
    std::fs::create_dir(dir.path().join("decoy")).unwrap();
    let values: Vec<u8> = [0.0f32, 1.0, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.path().join("model/w.data"), &values).unwrap();
    let decoy: Vec<u8> = [100.0f32, 200.0, 300.0, 400.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.path().join("decoy/w.data"), &decoy).unwrap();
    let entry = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
    let value = TensorProto {
        name: Some("cv".into()),
        dims: vec![1, 4],
        data_type: Some(DataType::Float as i32),
        external_data: vec![entry("location", "w.data".into()), entry("length", "16".into())],
        data_location: Some(DataLocation::External as i32),
        ..Default::default()
    };
    let mut b = ModelBuilder::new("ext_constant", 13);
    b.input("x", DataType::Float, &[1.into(), 4.into()]);
    b.node("Constant", "c", &[], &["c"], vec![attr::tensor("value", value)]);
    let mut proto = b.build();
    let g = proto.graph.as_mut().unwrap();
    g.node.push(node("Add", "add", &["x", "c"], &["y"], vec![]));
    g.output.push(g.input[0].clone());
    g.output[0].name = Some("y".into());
    save(&proto, &dir.path().join("model/model.onnx"));
    write_npy_file(&dir.path().join("decoy/x.npy"), &Tensor::f32(vec![1, 4], vec![0.0; 4])).unwrap();

    let out = layerwise(
        &["bisect", "../model/model.onnx", "--separate-runs", "--input", "x=x.npy", "--save-tensors", "st"],
        &dir.path().join("decoy"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let c = common::saved_tensor(&dir.path().join("decoy/st/ref"), "c");
    assert_eq!(c.data, TensorData::F32(vec![0.0, 1.0, 2.0, 3.0]), "the model's own w.data");
    for args in [
        &["bisect", "../model/model.onnx", "--input", "x=x.npy"][..],
        &["fix", "../model/model.onnx", "--input", "x=x.npy"][..],
    ] {
        let out = layerwise(args, &dir.path().join("decoy"));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        assert!(!text(&out).contains("not measured"), "{args:?}: {}", text(&out));
    }
    // The file only the Constant reads is still the model's, which no output replaces.
    let out = layerwise(&["bisect", "model/model.onnx", "--html", "model/w.data"], dir.path());
    assert_refused(&out, &["--html", "model/w.data"], "would overwrite the input model's external data");
    assert_eq!(std::fs::read(dir.path().join("model/w.data")).unwrap(), values);
}

/// `layerwise convert ... | head`: a reader that goes away before the summary is printed made
/// `println!` panic (exit 101 and a backtrace). The run finishes,
/// writes its file and exits with its own status.
#[test]
fn a_closed_stdout_is_no_panic_and_the_work_is_still_done() {
    let dir = tempfile::tempdir().unwrap();
    save(&planted(Ending::Healthy), &dir.path().join("m.onnx"));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_layerwise"))
        .args(["convert", "m.onnx", "-o", "c.onnx"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The read end closes before the child prints anything.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    assert!(dir.path().join("c.onnx").exists(), "the converted file is written");
}

/// `--batch N` runs samples together only where both sides run on one GPU: elsewhere it is
/// refused, saying what it needs, rather than ignored.
#[test]
fn batch_is_refused_where_the_sides_do_not_run_on_one_gpu() {
    let dir = tempfile::tempdir().unwrap();
    save(&planted(Ending::Healthy), &dir.path().join("m.onnx"));
    std::fs::create_dir(dir.path().join("samples")).unwrap();
    for k in 0..3 {
        let x = Tensor::f32(vec![1, 256], (0..256).map(|i| ((i + k) % 7) as f32 * 0.1).collect());
        write_npz(&dir.path().join(format!("samples/s{k}.npz")), &[("x", &x)]).unwrap();
    }
    let out = layerwise(&["bisect", "m.onnx", "--inputs", "samples", "--batch", "2"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("--batch 2 runs samples together on the GPU where both sides run there")
            && t.contains("here --ref ort:cpu and --cand sim:fp16"),
        "{t}"
    );
    // One sample, or random inputs: refused alike (it
    // was ignored there).
    for one in [&["--inputs", "samples/s0.npz"][..], &[][..]] {
        let out = layerwise(&[&["bisect", "m.onnx", "--batch", "2"][..], one].concat(), dir.path());
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{one:?}: {t}");
        assert!(t.contains("--batch 2 runs samples together on the GPU"), "{one:?}: {t}");
    }
    let out = layerwise(&["bisect", "m.onnx", "--inputs", "samples", "--batch", "0"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Found by the red team (issue 54 item 8): a tensor named `block..1` was saved as
/// `00000_block..1.npy`, and `--cand npz:` refused its own manifest ("outside the folder"): a
/// file name holding `..` is still one plain name in the folder.
#[test]
fn a_saved_run_whose_tensor_name_holds_two_dots_is_replayed() {
    use layerwise_model::builder::ModelBuilder;
    use layerwise_model::DataType;
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("dots", 13);
    b.input("x", DataType::Float, &[1.into(), 4.into()]);
    b.node("Relu", "relu", &["x"], &["block..1"], vec![]);
    b.node("Neg", "neg", &["block..1"], &["y"], vec![]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("m.onnx"));
    let out = layerwise(&["bisect", "m.onnx", "--separate-runs", "--save-tensors", "st"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let manifest = std::fs::read_to_string(dir.path().join("st/cand/manifest.json")).unwrap();
    assert!(manifest.contains("block..1.npy"), "{manifest}");
    let out = layerwise(&["bisect", "m.onnx", "--cand", "npz:st/cand", "--json", "r.json"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let r = common::json(&dir.path().join("r.json"));
    assert!(r["tensors"].as_array().unwrap().iter().any(|t| t["name"] == "block..1"), "{}", text(&out));
}

/// Found by the red team (issue 54 item 4): Ctrl-C during the Python probe for ONNX Runtime (the
/// signal reaches the whole process group) made the probe fail, which read as "not installed",
/// and `pip download` started. A probe ended by a signal fetches nothing.
#[test]
fn an_interrupted_probe_for_onnx_runtime_starts_no_download() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    save(&planted(Ending::Healthy), &dir.path().join("m.onnx"));
    // A Python that logs each call, then is interrupted as Ctrl-C would.
    let python = dir.path().join("python");
    std::fs::write(&python, "#!/bin/sh\necho \"$*\" >> \"$(dirname \"$0\")/calls.log\"\nkill -INT $$\n").unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(dir.path().join("cache")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_layerwise"))
        .args(["bisect", "m.onnx"])
        .current_dir(dir.path())
        .env("LAYERWISE_PYTHON", &python)
        .env("LAYERWISE_CACHE_DIR", dir.path().join("cache"))
        .env_remove("LAYERWISE_ORT_LIB")
        .env_remove("ORT_DYLIB_PATH")
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("ended by signal 2"), "{t}");
    let calls = std::fs::read_to_string(dir.path().join("calls.log")).unwrap();
    assert_eq!(calls.lines().count(), 1, "only the probe ran: {calls}");
    assert!(!calls.contains("pip"), "{calls}");
}

/// Found by the red team (issue 54 item 1): with the model's folder mounted at a second path, an
/// output naming the model through it replaced the model (the rule compared path strings). Outputs
/// are compared with inputs by file identity (device and inode); a hard link is such a second
/// name here (a bind mount needs privileges a test does not have).
#[test]
fn an_output_naming_the_input_model_through_a_second_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for d in ["a", "b"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    save(&planted(Ending::Healthy), &dir.path().join("a/m.onnx"));
    std::fs::hard_link(dir.path().join("a/m.onnx"), dir.path().join("b/m.onnx")).unwrap();
    let before = std::fs::read(dir.path().join("a/m.onnx")).unwrap();
    for args in [&["convert", "a/m.onnx", "-o", "b/m.onnx"][..], &["bisect", "a/m.onnx", "--json", "b/m.onnx"][..]] {
        let out = layerwise(args, dir.path());
        assert_refused(&out, args, "would overwrite the input model");
    }
    assert_eq!(std::fs::read(dir.path().join("a/m.onnx")).unwrap(), before);
}

/// Found by the red team (issue 54 item 5): a Constant whose `sparse_value` keeps its values in
/// external data was neither checked nor inlined, and ONNX Runtime read the file from the working
/// folder (a `location` of `.ssh/id_rsa` put the user's key in the reports). Sparse values and
/// indices follow the rule of every tensor: read from the model's folder, inside it.
#[test]
fn a_sparse_constant_with_external_values_is_read_from_the_models_folder() {
    use layerwise_model::builder::{node, ModelBuilder};
    use layerwise_model::onnx::attribute_proto::AttributeType;
    use layerwise_model::onnx::{
        tensor_proto::DataLocation, AttributeProto, SparseTensorProto, StringStringEntryProto, TensorProto,
    };
    use layerwise_model::DataType;
    let dir = tempfile::tempdir().unwrap();
    for d in ["model", "decoy"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    std::fs::write(dir.path().join("model/s.data"), bytes(&[5.0, 7.0])).unwrap();
    std::fs::write(dir.path().join("decoy/s.data"), bytes(&[500.0, 700.0])).unwrap();
    let entry = |k: &str, v: &str| StringStringEntryProto { key: Some(k.into()), value: Some(v.into()) };
    let sparse = |location: &str| SparseTensorProto {
        values: Some(TensorProto {
            name: Some("cv".into()),
            dims: vec![2],
            data_type: Some(DataType::Float as i32),
            external_data: vec![entry("location", location), entry("length", "8")],
            data_location: Some(DataLocation::External as i32),
            ..Default::default()
        }),
        indices: Some(TensorProto {
            dims: vec![2],
            data_type: Some(DataType::Int64 as i32),
            int64_data: vec![1, 3],
            ..Default::default()
        }),
        // ONNX Runtime densifies two-dimensional sparse constants (indices linearized).
        dims: vec![2, 2],
    };
    let model = |location: &str| {
        let mut b = ModelBuilder::new("sparse_constant", 13);
        b.input("x", DataType::Float, &[2.into(), 2.into()]);
        let value = AttributeProto {
            name: Some("sparse_value".into()),
            r#type: Some(AttributeType::SparseTensor as i32),
            sparse_tensor: Some(sparse(location)),
            ..Default::default()
        };
        b.node("Constant", "c", &[], &["c"], vec![value]);
        let mut proto = b.build();
        let g = proto.graph.as_mut().unwrap();
        g.node.push(node("Add", "add", &["x", "c"], &["y"], vec![]));
        g.output.push(g.input[0].clone());
        g.output[0].name = Some("y".into());
        proto
    };
    save(&model("s.data"), &dir.path().join("model/model.onnx"));
    // Loaded, the values are the model folder's file, held inline (ONNX Runtime runs no sparse
    // Constant: it reports the output missing, so no run can show them).
    let loaded = layerwise_model::Model::load(&dir.path().join("model/model.onnx")).unwrap();
    let values = loaded.graph().node[0].attribute[0].sparse_tensor.as_ref().unwrap().values.clone().unwrap();
    assert!(values.external_data.is_empty(), "held inline: {values:?}");
    let raw = values.raw_data.clone().unwrap_or_default();
    let read: Vec<f32> = raw.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(read, [5.0, 7.0], "the model's own s.data");
    // A location only the working folder holds is refused before anything runs or is written.
    std::fs::create_dir(dir.path().join("decoy/.ssh")).unwrap();
    std::fs::write(dir.path().join("decoy/.ssh/id_rsa"), bytes(&[1.0, 2.0])).unwrap();
    save(&model(".ssh/id_rsa"), &dir.path().join("model/leak.onnx"));
    for args in [
        &["bisect", "../model/leak.onnx", "--json", "r.json", "--save-tensors", "st"][..],
        &["convert", "../model/leak.onnx", "-o", "leak.onnx"][..],
    ] {
        let out = layerwise(args, &dir.path().join("decoy"));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains("external data"), "{args:?}: {}", text(&out));
    }
    for written in ["r.json", "st", "leak.onnx"] {
        assert!(!dir.path().join("decoy").join(written).exists(), "{written}");
    }
}
