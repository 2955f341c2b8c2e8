//! The published JSON Schemas (docs/schema/): derived from the typed documents `Report` and
//! `FixReport`, committed so readers can use them, and kept equal to what the types derive
//! (`LAYERWISE_BLESS=1 cargo test --test tests schema::` rewrites them). Real reports, the golden files and
//! runs that write every optional section, must validate against them, and a broken report must
//! not. docs/report-format.md names every field they define.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common;
use crate::common::{json, layerwise, save, text};
use layerwise_model::builder::{f32_tensor, node, tensor_type, Dim, ModelBuilder};
use layerwise_model::onnx::{GraphProto, ModelProto, TensorProto, ValueInfoProto};
use layerwise_model::DataType;
use serde_json::{json, Value};

const REPORT_SCHEMA_FILE: &str = "layerwise.report-1.schema.json";
const FIX_SCHEMA_FILE: &str = "layerwise.fix-1.schema.json";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::validator_for(schema).expect("the schema compiles")
}

/// Every way `doc` breaks the schema, as "instance path: message".
fn errors(validator: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    validator.iter_errors(doc).map(|e| format!("{}: {e}", e.instance_path())).collect()
}

fn assert_valid(validator: &jsonschema::Validator, doc: &Value, what: &str) {
    let errors = errors(validator, doc);
    assert!(errors.is_empty(), "{what} does not match the schema:\n{}", errors.join("\n"));
}

#[test]
fn the_published_schemas_are_the_ones_the_types_derive() {
    for (file, schema) in [
        (REPORT_SCHEMA_FILE, layerwise_report::report_schema()),
        (FIX_SCHEMA_FILE, layerwise_report::fix_report_schema()),
    ] {
        jsonschema::meta::validate(&schema).unwrap_or_else(|e| panic!("{file} is not a valid JSON Schema: {e}"));
        let path = root().join("docs/schema").join(file);
        let derived = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        if std::env::var_os("LAYERWISE_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &derived).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{}: {e} (write it with LAYERWISE_BLESS=1 cargo test --test tests schema::)", path.display())
        });
        assert!(committed == derived, "{} is not the schema the types derive; review the change and rewrite it with LAYERWISE_BLESS=1 cargo test --test tests schema::", path.display());
    }
}

/// A `run_info` for the golden files, which leave theirs out (it is the one part that changes
/// from run to run); the fresh runs below carry their own.
fn with_run_info(mut doc: Value) -> Value {
    doc.as_object_mut().unwrap().insert(
        "run_info".into(),
        json!({ "generated_at_unix_s": 0, "durations_s": [["compare", 0.25]], "peak_memory_mib": null }),
    );
    doc
}

fn golden(name: &str) -> Vec<(PathBuf, Value)> {
    let mut docs: Vec<(PathBuf, Value)> = std::fs::read_dir(root().join("tests/golden"))
        .unwrap()
        .map(|d| d.unwrap().path().join(name))
        .filter(|p| p.is_file())
        .map(|p| {
            let doc = with_run_info(json(&p));
            (p, doc)
        })
        .collect();
    docs.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(docs.len() >= 7, "the golden files hold {name} for 7 models, found {}", docs.len());
    docs
}

#[test]
fn the_golden_reports_match_the_schemas() {
    let report = validator(&layerwise_report::report_schema());
    let fix = validator(&layerwise_report::fix_report_schema());
    for (path, doc) in golden("bisect.json") {
        assert_valid(&report, &doc, &path.display().to_string());
        assert!(!fix.is_valid(&doc), "{}: a bisect report passes as a fix report", path.display());
    }
    for (path, doc) in golden("fix.json") {
        assert_valid(&fix, &doc, &path.display().to_string());
        assert!(!report.is_valid(&doc), "{}: a fix report passes as a bisect report", path.display());
    }
}

fn value(name: &str, dims: Option<&[Dim]>) -> ValueInfoProto {
    ValueInfoProto { name: Some(name.into()), r#type: Some(tensor_type(DataType::Float, dims)), ..Default::default() }
}

/// x[1,8] -> Loop(3 iterations: v = v * 1.5) -> y: a body the bisect inlines (`control_flow`).
fn small_loop() -> ModelProto {
    let mut b = ModelBuilder::new("loop", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    b.initializer(layerwise_model::builder::i64_tensor("trips", &[], &[3]));
    b.initializer(TensorProto {
        name: Some("go".into()),
        data_type: Some(DataType::Bool as i32),
        int32_data: vec![1],
        ..Default::default()
    });
    let body = GraphProto {
        name: Some("body".into()),
        node: vec![
            node("Mul", "grow", &["v_in", "k"], &["v_out"], vec![]),
            node("Identity", "keep_going", &["cond_in"], &["cond_out"], vec![]),
        ],
        initializer: vec![f32_tensor("k", &[1], &[1.5])],
        input: vec![
            ValueInfoProto {
                name: Some("i".into()),
                r#type: Some(tensor_type(DataType::Int64, Some(&[]))),
                ..Default::default()
            },
            ValueInfoProto {
                name: Some("cond_in".into()),
                r#type: Some(tensor_type(DataType::Bool, Some(&[]))),
                ..Default::default()
            },
            value("v_in", None),
        ],
        output: vec![
            ValueInfoProto {
                name: Some("cond_out".into()),
                r#type: Some(tensor_type(DataType::Bool, Some(&[]))),
                ..Default::default()
            },
            value("v_out", None),
        ],
        ..Default::default()
    };
    b.node("Loop", "steps", &["trips", "go", "x"], &["y"], vec![layerwise_model::builder::attr::graph("body", body)]);
    b.output("y", DataType::Float);
    b.build()
}

/// Three samples of the demo's input, one loud enough to overflow FP16.
fn write_samples(dir: &Path) {
    use rand::{Rng, SeedableRng};
    std::fs::create_dir_all(dir).unwrap();
    for (i, scale) in [0.01f32, 1.0, 0.3].into_iter().enumerate() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i as u64);
        let values: Vec<f32> = (0..8 * 64).map(|_| rng.random::<f32>() * scale).collect();
        let x = layerwise_runtime::Tensor::f32(vec![1, 8, 64], values);
        layerwise_runtime::npy::write_npz(&dir.join(format!("s{i}.npz")), &[("x", &x)]).unwrap();
    }
}

fn run(args: &[&str], dir: &Path) {
    let out = layerwise(args, dir);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{args:?}: {}", text(&out));
}

#[test]
fn reports_with_every_optional_section_match_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(&layerwise::demo::demo_model(), &d.join("demo.onnx"));
    save(&small_loop(), &d.join("loop.onnx"));
    write_samples(&d.join("samples"));
    // Each run writes some of the optional sections.
    run(&["bisect", "demo.onnx", "--inputs", "samples", "--task", "features:embedding", "--json", "samples.json"], d);
    run(&["bisect", "demo.onnx", "--inputs", "samples", "--shard", "0/2", "--json", "part0.json"], d);
    run(&["bisect", "demo.onnx", "--inputs", "samples", "--shard", "1/2", "--json", "part1.json"], d);
    run(&["merge", "part0.json", "part1.json", "--json", "merged.json"], d);
    run(&["bisect", "demo.onnx", "--mark", "search", "--repro", "repro", "--json", "search.json"], d);
    run(&["convert", "demo.onnx", "-o", "demo16.onnx"], d);
    run(&["bisect", "demo.onnx", "--cand", "ort:cpu", "--cand-model", "demo16.onnx", "--json", "matching.json"], d);
    run(&["bisect", "loop.onnx", "--json", "loop.json"], d);
    let (w1, w2) = (common::quantized::weights(64, 1), common::quantized::weights(32, 2));
    save(&common::quantized::float_model(&w1, &w2), &d.join("mlp.onnx"));
    save(&common::quantized::clipped_model(&w1, &w2), &d.join("mlp_int8.onnx"));
    run(
        &[
            "bisect",
            "mlp.onnx",
            "--cand",
            "ort:cpu",
            "--cand-model",
            "mlp_int8.onnx",
            "--val-range",
            "x:-1,1",
            "--json",
            "quantized.json",
        ],
        d,
    );
    // Held to the answers, so that the fix report's `target` and `answers` are checked too.
    run(
        &[
            "fix",
            "demo.onnx",
            "-o",
            "fixed.onnx",
            "--json",
            "fix.json",
            "--task",
            "logits:classify",
            "--target",
            "answer",
        ],
        d,
    );

    let report = validator(&layerwise_report::report_schema());
    let mut seen = BTreeSet::new();
    for name in [
        "samples.json",
        "part0.json",
        "part1.json",
        "merged.json",
        "search.json",
        "matching.json",
        "loop.json",
        "quantized.json",
    ] {
        let doc = json(&d.join(name));
        assert_valid(&report, &doc, name);
        seen.extend(doc.as_object().unwrap().iter().filter(|(_, v)| !v.is_null()).map(|(k, _)| k.clone()));
    }
    for (_, doc) in golden("bisect.json") {
        seen.extend(doc.as_object().unwrap().iter().filter(|(_, v)| !v.is_null()).map(|(k, _)| k.clone()));
    }
    // Every top-level field the schema defines was in at least one report checked, with a value.
    let schema = layerwise_report::report_schema();
    let defined: BTreeSet<String> = schema["properties"].as_object().unwrap().keys().cloned().collect();
    let unseen: Vec<&String> = defined.difference(&seen).collect();
    assert!(unseen.is_empty(), "no report checked here has {unseen:?}: add a run that writes them");

    let fix = validator(&layerwise_report::fix_report_schema());
    let fixed = json(&d.join("fix.json"));
    assert_valid(&fix, &fixed, "fix.json");
    assert!(fixed["target"] == "answer" && fixed["answers"][0]["output"] == "logits", "{fixed}");
}

/// `doc` with the value at `pointer` replaced, or removed (`None`).
fn edited(doc: &Value, pointer: &str, new: Option<Value>) -> Value {
    let mut doc = doc.clone();
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = doc.pointer_mut(parent).unwrap_or_else(|| panic!("{parent} is in the report"));
    match (parent, new) {
        (Value::Object(o), None) => assert!(o.remove(key).is_some(), "{pointer} is in the report"),
        (Value::Object(o), Some(v)) => assert!(o.insert(key.into(), v).is_some(), "{pointer} is in the report"),
        (Value::Array(a), Some(v)) => a[key.parse::<usize>().unwrap()] = v,
        (other, _) => panic!("{pointer}: cannot edit {other}"),
    }
    doc
}

#[test]
fn broken_reports_are_rejected_and_non_finite_numbers_are_accepted() {
    let report = validator(&layerwise_report::report_schema());
    let demo = with_run_info(json(&root().join("tests/golden/demo/bisect.json")));
    assert_valid(&report, &demo, "the demo's report");
    // The three spellings of non-finite numbers are numbers.
    for (pointer, v) in [
        ("/tensors/0/metrics/cosine", "nan"),
        ("/tensors/0/metrics/max_abs_err", "inf"),
        ("/tensors/0/metrics/snr_db", "-inf"),
        ("/noise_floor/ratio", "inf"),
    ] {
        assert_valid(&report, &edited(&demo, pointer, Some(json!(v))), &format!("{pointer} = {v:?}"));
    }
    let broken: &[(&str, Option<Value>)] = &[
        ("/verdict/first_divergent/output_error", Some(json!("fast"))),
        ("/tensors/0/metrics/cosine", Some(json!("NaN"))),
        ("/tensors/0/metrics/rel_l2_err", Some(Value::Null)),
        ("/tensors/0/metrics/numel", Some(json!(-1))),
        ("/tensors/0/metrics/numel", Some(json!(1.5))),
        ("/verdict/status", Some(json!("maybe"))),
        ("/verdict/first_divergent/cause/kind", Some(json!("bad_luck"))),
        ("/schema", Some(json!("layerwise.report/2"))),
        ("/noise_floor/seeds", Some(json!("0"))),
        ("/verdict", None),
        ("/tolerances/atol", None),
        ("/noise_floor/rounds", None),
        ("/verdict/first_divergent/cause/explains", None),
        ("/counterfactual/checks/0/explained", Some(json!("most"))),
        ("/isolation/nodes/0/local_error", Some(json!([]))),
    ];
    for (pointer, new) in broken {
        let doc = edited(&demo, pointer, new.clone());
        let errors = errors(&report, &doc);
        assert!(!errors.is_empty(), "{pointer} = {new:?} passes the schema");
        // The error is at the edited value or at an object holding it (an optional section's
        // `anyOf`, a missing field's parent), not elsewhere.
        let at = |e: &String| e.split_once(": ").is_some_and(|(path, _)| pointer.starts_with(path));
        assert!(errors.iter().all(at), "{pointer} = {new:?}: the errors do not point there: {errors:?}");
    }

    let fix = validator(&layerwise_report::fix_report_schema());
    let demo_fix = with_run_info(json(&root().join("tests/golden/demo/fix.json")));
    assert_valid(&fix, &demo_fix, "the demo's fix report");
    for (pointer, new) in [
        ("/status", Some(json!("nearly"))),
        ("/outputs/0/after_rel_l2", Some(json!("fast"))),
        ("/keep_fp32", None),
        ("/run_info", None),
    ] {
        assert!(
            !fix.is_valid(&edited(&demo_fix, pointer, new.clone())),
            "fix report: {pointer} = {new:?} passes the schema"
        );
    }
}

#[test]
fn a_weight_holding_inf_is_written_as_inf_and_reads_back() {
    // y = x * w with w = [1e5, inf]: 1e5 is beyond FP16's range, so the weight is listed, and its
    // largest magnitude is inf, which JSON writes as "inf" (a plain number field would be null,
    // which does not read back).
    let mut b = ModelBuilder::new("inf-weight", 17);
    b.input("x", DataType::Float, &[Dim::from(2)]);
    b.initializer(f32_tensor("w", &[2], &[1e5, f32::INFINITY]));
    b.node("Mul", "mul", &["x", "w"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    save(&b.build(), &dir.path().join("m.onnx"));
    run(&["bisect", "m.onnx", "--json", "r.json"], dir.path());
    let doc = json(&dir.path().join("r.json"));
    assert_valid(&validator(&layerwise_report::report_schema()), &doc, "the report");
    assert_eq!(doc["weights_out_of_fp16_range"][0]["max_abs"], "inf", "{}", doc["weights_out_of_fp16_range"]);
    let typed = layerwise_report::read_report(&dir.path().join("r.json")).expect("the report reads back");
    assert_eq!(typed.weights_out_of_fp16_range[0].max_abs, f64::INFINITY);
}

/// Every property name in `schema`, at any depth.
fn property_names(schema: &Value, names: &mut BTreeSet<String>) {
    match schema {
        Value::Object(o) => {
            if let Some(Value::Object(props)) = o.get("properties") {
                names.extend(props.keys().cloned());
            }
            o.values().for_each(|v| property_names(v, names));
        }
        Value::Array(a) => a.iter().for_each(|v| property_names(v, names)),
        _ => {}
    }
}

#[test]
fn every_field_of_the_schemas_is_in_report_format_md() {
    let doc = std::fs::read_to_string(root().join("docs/report-format.md")).unwrap();
    let mut names = BTreeSet::new();
    property_names(&layerwise_report::report_schema(), &mut names);
    property_names(&layerwise_report::fix_report_schema(), &mut names);
    assert!(names.len() > 100, "{} field names", names.len());
    let missing: Vec<&String> =
        names.iter().filter(|n| !doc.contains(&format!("`{n}`")) && !doc.contains(&format!(".{n}`"))).collect();
    assert!(missing.is_empty(), "docs/report-format.md does not define {missing:?}");
}
