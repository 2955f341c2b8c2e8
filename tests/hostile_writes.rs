//! Every path layerwise writes follows one rule
//! (src/write_rule.rs). Each case failed on the code before it: the run deleted, replaced or
//! wrote into something it had not created.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::{assert_refused, layerwise, save, text};
use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::{tensor_proto::DataLocation, ModelProto, StringStringEntryProto};
use layerwise_model::DataType;
use layerwise_runtime::npy::write_npz;
use layerwise_runtime::Tensor;

/// x[1,4] -> Mul(w) -> a -> Relu -> y, and a Mul by 7e4 that overflows FP16 -> z.
fn model() -> ModelProto {
    let mut b = ModelBuilder::new("m", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.initializer(f32_tensor("w", &[4], &[1.0, 2.0, 3.0, 4.0]));
    b.initializer(f32_tensor("big", &[1], &[7e4]));
    b.node("Mul", "mul", &["x", "w"], &["a"], vec![]);
    b.node("Relu", "relu", &["a"], &["y"], vec![]);
    b.node("Mul", "grow", &["y", "big"], &["z"], vec![]);
    b.output("y", DataType::Float);
    b.output("z", DataType::Float);
    b.build()
}

/// The model with its weight `w` in the external file `location` (written beside it).
fn with_external_weights(dir: &Path, name: &str, location: &str) {
    let mut m = model();
    let t = &mut m.graph.as_mut().unwrap().initializer[0];
    let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.join(location), &bytes).unwrap();
    t.raw_data = None;
    t.float_data.clear();
    let entry = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
    t.external_data = vec![entry("location", location.into()), entry("length", bytes.len().to_string())];
    t.data_location = Some(DataLocation::External as i32);
    save(&m, &dir.join(name));
}

/// Every file under `dir` with its bytes (folders as entries of their own).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files.insert(p.strip_prefix(dir).unwrap().to_path_buf(), b"<folder>".to_vec());
                stack.push(p);
            } else {
                files.insert(p.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&p).unwrap());
            }
        }
    }
    files
}

/// `args` run in `dir` must exit 2 with `message` and leave the folder exactly as it was.
fn refused_and_untouched(dir: &Path, args: &[&str], message: &str) {
    let before = snapshot(dir);
    let out = layerwise(args, dir);
    assert_refused(&out, args, message);
    assert_eq!(snapshot(dir), before, "{args:?} changed, wrote or left files behind: {}", text(&out));
}

fn input_npz(path: &Path, scale: f32) {
    let x = Tensor::f32(vec![1, 4], vec![0.1 * scale, 0.2 * scale, 0.3 * scale, 0.4 * scale]);
    write_npz(path, &[("x", &x)]).unwrap();
}

#[test]
fn save_tensors_into_a_folder_with_files_is_refused_and_nothing_there_is_lost() {
    // D5: `bisect ref/model.onnx --save-tensors .` deleted ./ref (the model inside it) and ./cand.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ref")).unwrap();
    std::fs::create_dir(dir.path().join("cand")).unwrap();
    save(&model(), &dir.path().join("ref/model.onnx"));
    std::fs::write(dir.path().join("cand/notes.txt"), "mine").unwrap();
    input_npz(&dir.path().join("inputs.npz"), 1.0);
    refused_and_untouched(
        dir.path(),
        &["bisect", "ref/model.onnx", "--save-tensors", "."],
        "--save-tensors .: the folder is not empty",
    );
    // With external data: the model and its weights stay.
    with_external_weights(&dir.path().join("ref"), "ext.onnx", "ext.data");
    refused_and_untouched(dir.path(), &["bisect", "ref/ext.onnx", "--save-tensors", "."], "the folder is not empty");
}

#[test]
fn save_tensors_onto_a_file_is_refused_before_any_staging_folder_is_made() {
    // D6: `--save-tensors FILE` left `.layerwise-tensors-XXXX` staging folders behind.
    let dir = tempfile::tempdir().unwrap();
    save(&model(), &dir.path().join("m.onnx"));
    std::fs::write(dir.path().join("taken"), "a file of mine").unwrap();
    refused_and_untouched(
        dir.path(),
        &["bisect", "m.onnx", "--save-tensors", "taken"],
        "--save-tensors taken: it is a file, not a folder",
    );
}

#[test]
fn save_tensors_over_several_samples_writes_each_sample_and_each_replays() {
    // D9: `--inputs DIR --save-tensors NEW` with several samples said it wrote and wrote nothing.
    let dir = tempfile::tempdir().unwrap();
    save(&model(), &dir.path().join("m.onnx"));
    std::fs::create_dir(dir.path().join("samples")).unwrap();
    input_npz(&dir.path().join("samples/quiet.npz"), 0.001);
    input_npz(&dir.path().join("samples/loud.npz"), 1.0);
    let out = layerwise(
        &["bisect", "m.onnx", "--inputs", "samples", "--save-tensors", "saved", "--json", "r.json"],
        dir.path(),
    );
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    for sample in ["quiet", "loud"] {
        let folder = dir.path().join("saved").join(sample);
        for part in ["ref/manifest.json", "cand/manifest.json", "inputs.npz"] {
            assert!(folder.join(part).is_file(), "{} missing: {}", folder.join(part).display(), text(&out));
        }
        // Each sample's saved candidate replays against the reference on that sample's inputs.
        let replay = layerwise(
            &[
                "bisect",
                "m.onnx",
                "--cand",
                &format!("npz:saved/{sample}/cand"),
                "--inputs",
                &format!("saved/{sample}/inputs.npz"),
            ],
            dir.path(),
        );
        assert!(matches!(replay.status.code(), Some(0 | 1)), "{sample}: {}", text(&replay));
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(".layerwise"))
        .collect();
    assert!(leftovers.is_empty(), "staging left behind: {leftovers:?}");
}

#[test]
fn an_output_whose_weights_file_would_be_the_inputs_external_data_is_refused() {
    // D7: a converted model over 1 GiB writes its weights to OUT.data; the input's external data
    // was named so, and `convert -o out.onnx` overwrote the input's weights (exit 0).
    let dir = tempfile::tempdir().unwrap();
    with_external_weights(dir.path(), "m.onnx", "out.onnx.data");
    refused_and_untouched(
        dir.path(),
        &["convert", "m.onnx", "--to", "fp16", "-o", "out.onnx"],
        "would overwrite the input model's external data",
    );
    refused_and_untouched(
        dir.path(),
        &["fix", "m.onnx", "-o", "out.onnx"],
        "would overwrite the input model's external data",
    );
    // The input itself is refused as -o's weights file too, under any spelling.
    refused_and_untouched(
        dir.path(),
        &["convert", "m.onnx", "--to", "fp16", "-o", "./out.onnx"],
        "the weights file written beside -o",
    );
}

#[test]
fn reports_never_replace_a_script_a_sample_or_a_saved_run() {
    // D8: --json onto the data-loader script, onto a sample inside --inputs DIR, onto an npz: run's
    // manifest.json replaced it (exit 0), and `--cand npz:sv/cand --save-tensors sv` rewrote it.
    let dir = tempfile::tempdir().unwrap();
    save(&model(), &dir.path().join("m.onnx"));
    std::fs::write(dir.path().join("data.py"), "def load_data():\n    yield {}\n").unwrap();
    refused_and_untouched(
        dir.path(),
        &["bisect", "m.onnx", "--data-loader-script", "data.py", "--json", "data.py"],
        "would overwrite the data-loader script",
    );
    refused_and_untouched(
        dir.path(),
        &["fix", "m.onnx", "--data-loader-script", "data.py:load_data", "--json", "./data.py"],
        "would overwrite the data-loader script",
    );

    std::fs::create_dir(dir.path().join("samples")).unwrap();
    input_npz(&dir.path().join("samples/a.npz"), 1.0);
    input_npz(&dir.path().join("samples/b.npz"), 0.5);
    refused_and_untouched(
        dir.path(),
        &["bisect", "m.onnx", "--inputs", "samples", "--json", "samples/b.npz"],
        "would overwrite a sample of --inputs samples",
    );
    refused_and_untouched(
        dir.path(),
        &["bisect", "m.onnx", "--inputs", "samples", "--csv", "samples/a.npz"],
        "would overwrite a sample",
    );

    input_npz(&dir.path().join("x.npz"), 1.0);
    let out = layerwise(&["bisect", "m.onnx", "--inputs", "x.npz", "--save-tensors", "sv"], dir.path());
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    refused_and_untouched(
        dir.path(),
        &["bisect", "m.onnx", "--cand", "npz:sv/cand", "--inputs", "sv/inputs.npz", "--json", "sv/cand/manifest.json"],
        "would write into the saved candidate run sv/cand",
    );
    refused_and_untouched(
        dir.path(),
        &["bisect", "m.onnx", "--cand", "npz:sv/cand", "--inputs", "sv/inputs.npz", "--html", "sv/cand/report.html"],
        "would write into the saved candidate run",
    );
    refused_and_untouched(
        dir.path(),
        &["bisect", "m.onnx", "--cand", "npz:sv/cand", "--inputs", "sv/inputs.npz", "--save-tensors", "sv"],
        "--save-tensors sv: the folder is not empty",
    );
}

#[test]
fn demo_refuses_a_folder_with_files_and_force_replaces_only_its_own() {
    // D15: `demo` replaced an existing layerwise-demo/ without a word.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("layerwise-demo")).unwrap();
    std::fs::write(dir.path().join("layerwise-demo/report.json"), "my own report").unwrap();
    std::fs::write(dir.path().join("layerwise-demo/notes.txt"), "mine").unwrap();
    refused_and_untouched(dir.path(), &["demo"], "layerwise-demo: the folder is not empty");
    let out = layerwise(&["demo", "--force"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(dir.path().join("layerwise-demo/notes.txt")).unwrap(), "mine");
    assert!(std::fs::read_to_string(dir.path().join("layerwise-demo/report.json"))
        .unwrap()
        .contains("layerwise.report/"));
    // A new folder needs no --force.
    let out = layerwise(&["demo", "--out-dir", "fresh"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// Two folders layerwise fills
/// named alike (`--save-tensors st --repro st`: the repro's inputs.npz replaced the saved run's),
/// a report written into a samples folder (`--json smp/c.npz` broke the next run), the keep list
/// beside a fixed model that `report --fix` names, and a demo folder starting with `-` (its
/// "Try it yourself" line read the path as options).
#[test]
fn filled_folders_samples_folders_keep_lists_and_dashed_paths_are_kept_apart() {
    let dir = tempfile::tempdir().unwrap();
    save(&model(), &dir.path().join("m.onnx"));
    refused_and_untouched(
        dir.path(),
        &["bisect", "m.onnx", "--save-tensors", "st", "--repro", "st"],
        "--save-tensors st would overwrite the folder --repro fills",
    );
    std::fs::create_dir(dir.path().join("samples")).unwrap();
    input_npz(&dir.path().join("samples/a.npz"), 1.0);
    refused_and_untouched(
        dir.path(),
        &["bisect", "m.onnx", "--inputs", "samples", "--json", "samples/c.npz"],
        "would write into the samples folder --inputs",
    );

    let out = layerwise(&["bisect", "m.onnx", "--json", "r.json"], dir.path());
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    let out = layerwise(&["fix", "m.onnx", "-o", "fx.onnx", "--json", "f.json"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    refused_and_untouched(
        dir.path(),
        &["report", "r.json", "--fix", "f.json", "--markdown", "fx.onnx.keep-fp32.json"],
        "would overwrite the keep list beside the fixed model",
    );

    let out = layerwise(&["demo", "--out-dir=-rf"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    let line = said
        .lines()
        .find(|l| l.starts_with("Try it yourself: "))
        .expect("the demo's line")
        .trim_start_matches("Try it yourself: ");
    let words = shell_words::split(line).unwrap();
    assert_eq!(words[..2], ["layerwise", "bisect"]);
    assert_eq!(words[2], "./-rf/demo.onnx", "{line}");
}
