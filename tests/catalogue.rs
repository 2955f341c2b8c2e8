//! The malformed-input catalogue: every case exits 2 with its specific message, writes
//! no report and leaves the input untouched. tests/cli.rs holds the first cases (missing, text,
//! truncated, non-model files, missing external data, unresolved and mismatched input shapes,
//! npz problems, bad backend specs, unknown tensors, a missing report folder); these are the rest.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{assert_refused, dynamic_model, layerwise, save, text};
use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::{tensor_proto::DataLocation, ModelProto, StringStringEntryProto};
use layerwise_model::DataType;
use layerwise_runtime::npy::write_npz;
use layerwise_runtime::Tensor;

/// x[1,4] -> Mul(w) -> a -> Relu -> y.
fn base() -> ModelBuilder {
    let mut b = ModelBuilder::new("base", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.initializer(f32_tensor("w", &[4], &[1.0, 2.0, 3.0, 4.0]));
    b
}

fn valid() -> ModelProto {
    let mut b = base();
    b.node("Mul", "mul", &["x", "w"], &["a"], vec![]);
    b.node("Relu", "relu", &["a"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

fn external(location: &str, length: Option<usize>) -> ModelProto {
    let mut m = valid();
    let t = &mut m.graph.as_mut().unwrap().initializer[0];
    t.raw_data = None;
    let entry = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
    t.external_data = vec![entry("location", location.into())];
    if let Some(l) = length {
        t.external_data.push(entry("length", l.to_string()));
    }
    t.data_location = Some(DataLocation::External as i32);
    m
}

struct Catalogue {
    dir: tempfile::TempDir,
    cases: usize,
}

impl Catalogue {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn p(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
    fn model(&self, name: &str, proto: &ModelProto) -> String {
        save(proto, &self.path(name));
        self.p(name)
    }
    /// `args` must exit 2 with `message`, write no report and leave every file as it was.
    fn case(&mut self, args: &[&str], message: &str) {
        self.cases += 1;
        let before = snapshot(self.dir.path());
        let json = self.p("report.json");
        let mut all: Vec<&str> = args.to_vec();
        if args[0] == "bisect" {
            all.extend(["--json", &json]);
        }
        let out = layerwise(&all, self.dir.path());
        assert_refused(&out, args, message);
        // Each cause is said once, and no context is empty ("error: : ...").
        let said = text(&out);
        let parts: Vec<&str> = said.trim().split(": ").collect();
        assert!(
            parts.windows(2).all(|w| w[0] != w[1]) && !said.contains("error: :"),
            "{args:?}: a cause repeated or an empty context: {said}"
        );
        assert_eq!(snapshot(self.dir.path()), before, "{args:?} changed, wrote or left files behind");
    }
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<(PathBuf, Vec<u8>)> =
        walk(dir).into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap_or_default())).collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn malformed_inputs_each_get_their_own_error() {
    let mut c = Catalogue { dir: tempfile::tempdir().unwrap(), cases: 0 };
    let good = c.model("good.onnx", &valid());

    // Graph structure.
    let mut b = base();
    b.node("Relu", "first", &["b"], &["a"], vec![]);
    b.node("Relu", "second", &["a"], &["b"], vec![]);
    b.output("a", DataType::Float);
    let m = c.model("cycle.onnx", &b.build());
    // A folder where a model file belongs: the cause once, not "Is a directory: Is a directory".
    c.case(&["bisect", &c.p("")], "cannot read");
    c.case(&["bisect", &m], "invalid graph: the graph has a cycle");

    let mut b = base();
    b.node("Relu", "relu", &["ghost"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let m = c.model("dangling.onnx", &b.build());
    c.case(
        &["bisect", &m],
        "node 'relu' (Relu) reads tensor 'ghost', which no node, graph input or initializer provides",
    );

    let mut b = base();
    b.node("Relu", "one", &["x"], &["y"], vec![]);
    b.node("Neg", "two", &["x"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let m = c.model("twice.onnx", &b.build());
    c.case(&["bisect", &m], "tensor 'y' is produced by two nodes, 'one' and 'two'");

    let mut b = base();
    b.node("Relu", "relu", &["x"], &["y"], vec![]);
    b.output("nothing", DataType::Float);
    let m = c.model("noproducer.onnx", &b.build());
    c.case(&["bisect", &m], "graph output 'nothing' is not produced by any node");

    let mut b = base();
    b.node("Relu", "relu", &["x"], &["w"], vec![]);
    b.output("w", DataType::Float);
    let m = c.model("shadow.onnx", &b.build());
    c.case(&["bisect", &m], "tensor 'w' is both a graph input or initializer and an output of node 'relu'");

    let mut m = valid();
    m.ir_version = None;
    let m = c.model("noir.onnx", &m);
    c.case(&["bisect", &m], "ir_version is missing");

    let mut m = valid();
    m.graph.as_mut().unwrap().output.clear();
    let m = c.model("nooutputs.onnx", &m);
    c.case(&["bisect", &m], "its graph has no outputs");

    let mut m = valid();
    m.opset_import[0].version = Some(99);
    let m = c.model("opset99.onnx", &m);
    c.case(&["bisect", &m], "opset");

    // External data.
    let m = c.model("outside.onnx", &external("../w.bin", None));
    c.case(&["bisect", &m], "location '../w.bin' points outside the model's folder; refused");
    let m = c.model("absolute.onnx", &external("/etc/hostname", None));
    c.case(&["bisect", &m], "location '/etc/hostname' points outside the model's folder; refused");
    std::fs::write(c.path("short.bin"), [0u8; 4]).unwrap();
    let m = c.model("short.onnx", &external("short.bin", None));
    c.case(&["bisect", &m], "short.bin' is 4 bytes but the tensor needs bytes up to 16");
    std::fs::write(c.path("w.bin"), [0u8; 16]).unwrap();
    let m = c.model("length.onnx", &external("w.bin", Some(8)));
    c.case(&["bisect", &m], "length 8 does not match 16 bytes implied by its shape and type");

    // Inputs.
    let dynm = c.model("dyn.onnx", &dynamic_model());
    c.case(
        &["bisect", &dynm, "--input-shape", "x:99999999999x4", "--input-shape", "ids:99999999999"],
        "input 'x': shape 99999999999x4 needs",
    );
    c.case(
        &["bisect", &dynm, "--input-shape", "x:4611686018427387904x4", "--input-shape", "ids:4611686018427387904"],
        "is too large to hold",
    );
    // A repeated option lost silently to the first; a zero
    // dimension gave a PASS with nothing compared.
    c.case(
        &["bisect", &dynm, "--input-shape", "x:2x4", "--input-shape", "x:3x4", "--input-shape", "ids:2"],
        "--input-shape is given twice for input 'x'",
    );
    c.case(
        &["bisect", &dynm, "--val-range", "x:0,1", "--val-range", "x:-5,5"],
        "--val-range is given twice for input 'x'",
    );
    c.case(
        &["bisect", &dynm, "--input-shape", "x:0x4", "--input-shape", "ids:0"],
        "every model output is empty, so nothing can be compared: inputs with no element: 'x' 0x4, 'ids' 0",
    );
    c.case(
        &["bisect", &dynm, "--input-shape", "x:0x4", "--input-shape", "ids:0", "--mark", "search"],
        "every model output is empty, so nothing can be compared",
    );
    c.case(
        &["fix", &dynm, "--input-shape", "x:0x4", "--input-shape", "ids:0", "-o", &c.p("empty_fixed.onnx")],
        "every model output is empty, so nothing can be compared",
    );
    // An .npy header declaring an absurd shape over a few bytes of data.
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000, 4), }";
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    let padded = format!("{header:<117}\n");
    npy.extend((padded.len() as u16).to_le_bytes());
    npy.extend(padded.as_bytes());
    npy.extend([0u8; 16]);
    std::fs::write(c.path("absurd.npy"), &npy).unwrap();
    let arg = format!("x={}", c.p("absurd.npy"));
    c.case(&["bisect", &good, "--input", &arg], "shape 100000000000x4 needs");
    std::fs::write(c.path("corrupt.npz"), b"PK\x03\x04 this is no zip").unwrap();
    c.case(&["bisect", &good, "--inputs", &c.p("corrupt.npz")], "not a valid .npz archive");
    std::fs::create_dir(c.path("empty")).unwrap();
    c.case(&["bisect", &good, "--inputs", &c.p("empty")], "the folder holds no .npz files");
    std::fs::create_dir(c.path("samples")).unwrap();
    let x = Tensor::f32(vec![1, 4], vec![0.5; 4]);
    write_npz(&c.path("samples/a.npz"), &[("x", &x)]).unwrap();
    write_npz(&c.path("samples/b.npz"), &[("x", &x)]).unwrap();
    c.case(&["bisect", &good, "--inputs", &c.p("samples"), "--mark", "search"], "--mark search runs one sample");
    // --devices: GPUs for the samples of a folder.
    c.case(
        &["bisect", &good, "--inputs", &c.p("samples"), "--devices", "0,1"],
        "neither --ref ort:cpu nor --cand sim:fp16 runs on one",
    );
    c.case(&["bisect", &good, "--cand", "ort:cuda", "--devices", "0,1"], "give a folder of .npz files");
    c.case(
        &["bisect", &good, "--inputs", &c.p("samples"), "--cand", "ort:cuda", "--devices", "0", "--shard", "0/2"],
        "--devices and --shard do not combine",
    );
    c.case(
        &["bisect", &good, "--inputs", &c.p("samples"), "--cand", "ort:cuda,device=1", "--devices", "0,1"],
        "names its own device",
    );
    c.case(&["bisect", &good, "--inputs", &c.p("samples"), "--devices", "0,x"], "invalid value 'x'");

    // Outputs never replace inputs, however the path is spelled (the snapshot proves the model,
    // the inputs and the report are untouched).
    let dotted = format!("{}/./good.onnx", c.dir.path().display());
    c.case(&["bisect", &good, "--html", &good], "the HTML report");
    c.case(&["bisect", &good, "--csv", &dotted], "would overwrite the input model");
    c.case(
        &["bisect", &good, "--inputs", &c.p("samples/a.npz"), "--markdown", &c.p("samples/a.npz")],
        "would overwrite the inputs",
    );
    c.case(&["fix", &good, "-o", &dotted], "would overwrite the input model");
    c.case(&["fix", &good, "--json", &good], "would overwrite the input model");
    c.case(&["convert", &good, "-o", &dotted], "would overwrite the input model");

    // An emulation of an already converted file (it rounds a float32 model).
    let converted = layerwise(&["convert", &good, "--to", "fp16", "-o", &c.p("good16.onnx")], c.dir.path());
    assert_eq!(converted.status.code(), Some(0), "{}", text(&converted));
    c.case(&["bisect", &good, "--cand", "sim:fp16", "--cand-model", &c.p("good16.onnx")], "is already converted");

    // Options.
    c.case(&["bisect", &good, "--tensors", "x"], "tensor 'x' is a graph input or initializer");
    c.case(&["bisect", &good, "--tensors", "w"], "tensor 'w' is a graph input or initializer");
    c.case(&["bisect", &good, "--cand-model", &c.p("absent.onnx")], "model file not found");
    c.case(&["bisect", &good, "--atol=-1"], "must be non-negative");
    c.case(&["bisect", &good, "--max-memory", "lots"], "is not a size");
    c.case(&["bisect", &good, "--max-memory", "0"], "must be at least one byte");
    c.case(&["bisect", &good, "--mark", "some"], "invalid value 'some'");
    c.case(&["bisect", &good, "--html", &c.p("empty")], "it is a folder");
    c.case(&["convert", &good, "--keep-fp32", "nope", "-o", &c.p("out.onnx")], "node 'nope' does not exist");
    c.case(&["convert", &good, "-o", &good], "would overwrite the input model");
    c.case(&["fix", &good, "-o", &good], "would overwrite the input model");
    c.case(&["report", &c.p("absent.json")], "cannot read");
    std::fs::write(c.path("notjson.json"), "{ nope").unwrap();
    c.case(&["report", &c.p("notjson.json")], "is not JSON");

    assert!(c.cases >= 30 - 17, "the catalogue here and in tests/cli.rs holds at least 30 cases");
    println!("catalogue: {} cases here", c.cases);
}

#[test]
fn non_finite_user_inputs_are_allowed_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    save(&valid(), &dir.path().join("m.onnx"));
    let x = Tensor::f32(vec![1, 4], vec![f32::NAN, f32::INFINITY, 1.0, 2.0]);
    write_npz(&dir.path().join("x.npz"), &[("x", &x)]).unwrap();
    let out = layerwise(&["bisect", "m.onnx", "--inputs", "x.npz", "--json", "r.json"], dir.path());
    let t = text(&out);
    assert!(matches!(out.status.code(), Some(0) | Some(1)), "{t}");
    assert!(t.contains("WARNING: 1 NaN, 1 inf in this input"), "{t}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
    assert_eq!((report["inputs"][0]["nan"].as_u64(), report["inputs"][0]["inf"].as_u64()), (Some(1), Some(1)));
}

#[test]
fn reports_are_byte_identical_across_runs_and_thread_counts() {
    let dir = tempfile::tempdir().unwrap();
    save(&layerwise::demo::demo_model(), &dir.path().join("demo.onnx"));
    let run = |threads: &str, name: &str| -> serde_json::Value {
        let spec_ref = format!("ort:cpu,threads={threads}");
        let spec_cand = format!("sim:fp16,threads={threads}");
        let out = Command::new(env!("CARGO_BIN_EXE_layerwise"))
            .args(["bisect", "demo.onnx", "--ref", &spec_ref, "--cand", &spec_cand, "--json", name])
            .env("RAYON_NUM_THREADS", threads)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join(name)).unwrap()).unwrap();
        let o = v.as_object_mut().unwrap();
        // The one field that may differ (timestamps, durations), and the specs that name the threads.
        o.remove("run_info");
        o["ref"]["spec"] = serde_json::Value::Null;
        o["cand"]["spec"] = serde_json::Value::Null;
        v
    };
    let one = run("1", "one.json");
    let again = run("1", "again.json");
    let two = run("2", "two.json");
    let four = run("4", "four.json");
    assert_eq!(one, again, "same inputs, same seed, same report");
    assert_eq!(one, two, "1 and 2 threads");
    assert_eq!(one, four, "1 and 4 threads");
}
