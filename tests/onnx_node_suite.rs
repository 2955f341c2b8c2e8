//! A peer's test suite: ONNX's own backend node tests (the `model.onnx` files with
//! `test_data_set_*/{input,output}_N.pb` under `onnx/backend/test/data/node` in the `onnx` Python
//! package, fetched with pip into layerwise's cache on first use).
//!
//! For every test: load the model, round-trip it through our serializer, expose every
//! intermediate tensor, run it on ONNX Runtime and check that the model's own outputs still match
//! ONNX's expected outputs; then run `sim:fp16` on it. Every outcome lands in one category. The
//! test fails on any outcome that points at layerwise (a refused load, a round trip that changes the
//! model, a rewrite that breaks a run or changes an output, a panic); the other categories are
//! explained by evidence gathered on the untouched model (ONNX Runtime cannot run it, or its own
//! result already differs from ONNX's reference). The counts are printed and written to
//! target/test-output/onnx-node-suite.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use layerwise_model::onnx::{type_proto, TensorProto};
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_runtime::{create_backend, Backend, RunRequest, Tensor, TensorData};
use prost::Message;
use rayon::prelude::*;

const ONNX_VERSION: &str = "1.20.1";
const NODE_PREFIX: &str = "onnx/backend/test/data/node/";
// ONNX's backend test runner's defaults (onnx/backend/test/runner).
const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-7;

/// The extracted `node` folder, fetched on first use: `pip download --no-deps onnx==1.20.1`, then
/// the wheel's node tests are unpacked into the cache and renamed into place (a half-extracted
/// copy is never used).
fn node_tests() -> PathBuf {
    if let Some(dir) = std::env::var_os("LAYERWISE_ONNX_NODE_TESTS") {
        return PathBuf::from(dir);
    }
    let cache = layerwise_runtime::ortlib::cache_dir();
    let dest = cache.join(format!("onnx-{ONNX_VERSION}-node-tests"));
    if dest.is_dir() {
        return dest;
    }
    std::fs::create_dir_all(&cache).unwrap();
    let work = tempfile::tempdir_in(&cache).unwrap();
    let python = std::env::var("LAYERWISE_PYTHON").unwrap_or_else(|_| "python3".into());
    let pip = Command::new(&python)
        .args(["-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d"])
        .arg(work.path())
        .arg(format!("onnx=={ONNX_VERSION}"))
        .output()
        .unwrap_or_else(|e| panic!("cannot start {python} to fetch ONNX's node tests: {e}; install Python with pip, or set LAYERWISE_ONNX_NODE_TESTS to an extracted onnx/backend/test/data/node folder"));
    assert!(
        pip.status.success(),
        "`{python} -m pip download --no-deps onnx=={ONNX_VERSION}` failed (the suite needs pip and the package index, or LAYERWISE_ONNX_NODE_TESTS pointing at an extracted onnx/backend/test/data/node folder):\n{}",
        String::from_utf8_lossy(&pip.stderr)
    );
    let wheel = std::fs::read_dir(work.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .expect("pip wrote no wheel");
    let mut archive = zip::ZipArchive::new(std::fs::File::open(&wheel).unwrap()).unwrap();
    let staged = work.path().join("node");
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).unwrap();
        let Some(rel) = entry.name().strip_prefix(NODE_PREFIX).map(str::to_string) else { continue };
        if entry.is_dir() || rel.split('/').any(|c| c == ".." || c.is_empty()) {
            continue;
        }
        let out = staged.join(&rel);
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        std::io::copy(&mut entry, &mut std::fs::File::create(&out).unwrap()).unwrap();
    }
    // Another test process may have won the race; its copy is as good as ours.
    if std::fs::rename(&staged, &dest).is_err() {
        assert!(dest.is_dir(), "cannot move the node tests into {}", dest.display());
    }
    dest
}

/// Where one test ended. Categories starting with "BUG" fail the suite.
#[derive(Debug, Clone)]
struct Outcome {
    category: &'static str,
    detail: String,
    /// Tensors the expose-all run returned, and the reasons given for the ones it could not.
    returned: usize,
    unavailable: Vec<String>,
}

impl Outcome {
    fn new(category: &'static str, detail: impl Into<String>) -> Outcome {
        Outcome { category, detail: detail.into(), returned: 0, unavailable: Vec::new() }
    }
}

const PASS: &str = "pass: outputs match after round trip and expose-all, sim:fp16 runs";
const NOTHING_COMPARABLE: &str = "pass (ran; no output to compare: sequences, optionals, strings, FP8, INT4, ...)";
const ORT_CANNOT_RUN: &str = "explained: ONNX Runtime cannot run the untouched model";
const ORT_DIFFERS: &str =
    "explained: ONNX Runtime's result on the untouched model already differs from ONNX's expected output";
const INPUT_NOT_TENSOR: &str = "explained: an input is a sequence, optional or map (layerwise feeds tensors only)";
const INPUT_TYPE: &str = "explained: an input's element type is one layerwise does not carry (string, FP8, INT4, ...)";
const BUG_LOAD: &str = "BUG: layerwise refuses to load the model";
const BUG_ROUND_TRIP: &str = "BUG: the round trip changes the model";
const BUG_EXPOSE_RUN: &str = "BUG: exposing all intermediates breaks a run the untouched model passes";
const BUG_EXPOSE_VALUES: &str = "BUG: exposing all intermediates changes an output the untouched model gets right";
const BUG_FP16: &str = "BUG: sim:fp16 fails on a model ONNX Runtime runs";
const BUG_PANIC: &str = "BUG: panic";

/// One intra-op thread: the tests themselves run in parallel.
fn ort(spec: &str) -> Box<dyn Backend> {
    create_backend(&layerwise_runtime::BackendSpec::parse(&format!("{spec},threads=1")).unwrap()).unwrap()
}

fn is_tensor(v: &layerwise_model::onnx::ValueInfoProto) -> bool {
    matches!(v.r#type.as_ref().and_then(|t| t.value.as_ref()), Some(type_proto::Value::TensorType(_)))
}

/// numpy's `assert_allclose(actual, expected, rtol, atol)` with NaNs equal, plus equal shapes and
/// element types.
fn close(actual: &Tensor, expected: &Tensor) -> Result<(), String> {
    if actual.shape != expected.shape || actual.dtype() != expected.dtype() {
        return Err(format!(
            "got {} {:?}, expected {} {:?}",
            actual.dtype().name(),
            actual.shape,
            expected.dtype().name(),
            expected.shape
        ));
    }
    if !actual.dtype().is_float() {
        return if actual.data == expected.data { Ok(()) } else { Err("integer values differ".into()) };
    }
    let to_f64 = |t: &Tensor| -> Vec<f64> {
        match &t.data {
            TensorData::F64(v) => v.clone(),
            _ => t.to_f32().iter().map(|&x| x as f64).collect(),
        }
    };
    let (a, e) = (to_f64(actual), to_f64(expected));
    for (i, (&x, &y)) in a.iter().zip(&e).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= ATOL + RTOL * y.abs();
        if !ok {
            return Err(format!("element {i}: got {x}, expected {y}"));
        }
    }
    Ok(())
}

struct DataSet {
    inputs: Vec<(String, Tensor)>,
    /// Expected values of the graph outputs that are tensors of a carried type, by name.
    expected: Vec<(String, Tensor)>,
}

fn read_pb(path: &Path) -> TensorProto {
    TensorProto::decode(std::fs::read(path).unwrap().as_slice()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Reads the data sets; `Err` is the outcome when the inputs cannot be fed.
fn data_sets(dir: &Path, model: &Model) -> Result<Vec<DataSet>, Outcome> {
    let graph = model.graph();
    let initializers: std::collections::HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    let inputs: Vec<_> = graph.input.iter().filter(|v| !initializers.contains(v.name())).collect();
    let mut sets: Vec<PathBuf> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    sets.sort();
    let mut out = Vec::new();
    for set in sets {
        let mut ds = DataSet { inputs: Vec::new(), expected: Vec::new() };
        for (k, decl) in inputs.iter().enumerate() {
            let file = set.join(format!("input_{k}.pb"));
            if !file.exists() {
                continue; // an optional input left out
            }
            if !is_tensor(decl) {
                return Err(Outcome::new(INPUT_NOT_TENSOR, decl.name()));
            }
            let t = Tensor::from_proto(&read_pb(&file))
                .map_err(|why| Outcome::new(INPUT_TYPE, format!("{}: {why}", decl.name())))?;
            ds.inputs.push((decl.name().to_string(), t));
        }
        for (k, decl) in graph.output.iter().enumerate() {
            let file = set.join(format!("output_{k}.pb"));
            if !is_tensor(decl) || !file.exists() {
                continue;
            }
            if let Ok(t) = Tensor::from_proto(&read_pb(&file)) {
                ds.expected.push((decl.name().to_string(), t));
            }
        }
        out.push(ds);
    }
    Ok(out)
}

fn run(
    backend: &mut Box<dyn Backend>,
    model: &Model,
    index: &GraphIndex,
    inputs: &[(String, Tensor)],
    selection: &Selection,
) -> Result<layerwise_runtime::RunOutput, String> {
    backend.run(&RunRequest { model, index, inputs, selection }).map_err(|e| e.to_string())
}

fn check(expected: &[(String, Tensor)], got: &layerwise_runtime::RunOutput) -> Result<(), String> {
    for (name, want) in expected {
        let actual = got.tensors.get(name).ok_or_else(|| format!("no value for output '{name}'"))?;
        close(actual, want).map_err(|why| format!("output '{name}': {why}"))?;
    }
    Ok(())
}

fn first_line(s: &str) -> String {
    let line = s.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    line.chars().take(240).collect()
}

fn one_test(dir: &Path) -> Outcome {
    let path = dir.join("model.onnx");
    let model = match Model::load(&path) {
        Ok(m) => m,
        Err(e) => return Outcome::new(BUG_LOAD, e.to_string()),
    };
    // Our serializer must give back the file's own bytes (ONNX's serializer and ours both write
    // fields in number order, and a model we would re-encode differently has lost something); the
    // rest runs on the model loaded from our bytes.
    let bytes = model.proto.encode_to_vec();
    if bytes != std::fs::read(&path).unwrap() {
        return Outcome::new(BUG_ROUND_TRIP, "our serialization differs from the file's bytes");
    }
    let model = match Model::from_bytes(bytes, &path) {
        Ok(again) => again,
        Err(e) => return Outcome::new(BUG_ROUND_TRIP, e.to_string()),
    };
    let index = match GraphIndex::build(model.graph()) {
        Ok(i) => i,
        Err(e) => return Outcome::new(BUG_LOAD, e.to_string()),
    };
    let sets = match data_sets(dir, &model) {
        Ok(s) => s,
        Err(outcome) => return outcome,
    };
    let untouched = Selection::Names(Vec::new());
    let mut reference = ort("ort:cpu");
    let (mut compared, mut returned, mut unavailable) = (0, 0, Vec::new());
    for set in &sets {
        let exposed = run(&mut reference, &model, &index, &set.inputs, &Selection::All);
        let verdict = exposed.as_ref().map_err(|e| e.clone()).and_then(|out| check(&set.expected, out));
        if let Err(why) = verdict {
            // Decide whether our rewrite is to blame by running the untouched model.
            return match run(&mut reference, &model, &index, &set.inputs, &untouched) {
                Err(e) => Outcome::new(ORT_CANNOT_RUN, first_line(&e)),
                Ok(out) => match (check(&set.expected, &out), exposed.is_err()) {
                    (Err(e), _) => Outcome::new(ORT_DIFFERS, first_line(&e)),
                    (Ok(()), true) => Outcome::new(BUG_EXPOSE_RUN, first_line(&why)),
                    (Ok(()), false) => Outcome::new(BUG_EXPOSE_VALUES, first_line(&why)),
                },
            };
        }
        compared += set.expected.len();
        let exposed = exposed.expect("checked above");
        returned += exposed.tensors.len();
        unavailable.extend(exposed.unavailable.iter().map(|(_, why)| why.clone()));
        let mut fp16 = ort("sim:fp16");
        if let Err(e) = run(&mut fp16, &model, &index, &set.inputs, &Selection::All) {
            return Outcome::new(BUG_FP16, first_line(&e));
        }
    }
    let category = if compared == 0 { NOTHING_COMPARABLE } else { PASS };
    Outcome { category, detail: String::new(), returned, unavailable }
}

#[test]
fn onnx_backend_node_tests() {
    let root = node_tests();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() > 1000, "{} holds only {} node tests", root.display(), dirs.len());

    let outcomes: Vec<(String, Outcome)> = dirs
        .par_iter()
        .map(|dir| {
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            let outcome = std::panic::catch_unwind(|| one_test(dir)).unwrap_or_else(|p| {
                let why = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Outcome::new(BUG_PANIC, why)
            });
            (name, outcome)
        })
        .collect();

    let mut by_category: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for (name, o) in &outcomes {
        by_category.entry(o.category).or_default().push((name, &o.detail));
    }
    let mut summary = format!(
        "# ONNX {ONNX_VERSION} backend node tests on layerwise\n\n{} tests.\n\n| outcome | tests |\n| --- | --- |\n",
        outcomes.len()
    );
    for (category, tests) in &by_category {
        writeln!(summary, "| {category} | {} |", tests.len()).unwrap();
    }
    let returned: usize = outcomes.iter().map(|(_, o)| o.returned).sum();
    let mut why_unavailable: BTreeMap<&str, usize> = BTreeMap::new();
    for why in outcomes.iter().flat_map(|(_, o)| &o.unavailable) {
        *why_unavailable.entry(why.as_str()).or_default() += 1;
    }
    writeln!(summary, "\nThe expose-all runs of the tests that ran returned {returned} tensors (model outputs and intermediates); the rest were not tensors layerwise compares:\n").unwrap();
    for (why, n) in &why_unavailable {
        writeln!(summary, "- {n}: {why}").unwrap();
    }
    for (category, tests) in &by_category {
        if *category == PASS {
            continue;
        }
        writeln!(summary, "\n## {category}\n").unwrap();
        for (name, detail) in tests {
            writeln!(summary, "- `{name}`: {detail}").unwrap();
        }
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-output");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("onnx-node-suite.md"), &summary).unwrap();
    println!("{summary}");

    let bugs: Vec<String> = outcomes
        .iter()
        .filter(|(_, o)| o.category.starts_with("BUG"))
        .map(|(n, o)| format!("{n}: {}: {}", o.category, o.detail))
        .collect();
    assert!(bugs.is_empty(), "{} node tests point at layerwise:\n{}", bugs.len(), bugs.join("\n"));
    // A tensor asked for and not returned would be a lost intermediate, not a type we skip.
    let lost: Vec<&str> = why_unavailable
        .keys()
        .copied()
        .filter(|why| !why.contains("not a tensor") && !why.contains("is not compared"))
        .collect();
    assert!(lost.is_empty(), "exposed tensors missing from runs: {lost:?}");
    // A broken harness (inputs misread, say) would push everything into "ONNX Runtime differs".
    let passed = by_category.get(PASS).map_or(0, Vec::len);
    let differs = by_category.get(ORT_DIFFERS).map_or(0, Vec::len);
    assert!(
        passed > 10 * differs,
        "{passed} passed but {differs} differ from ONNX's expected outputs: check the harness"
    );
}
