//! docs/architecture.md's rules, checked on the sources: the crates depend only on the crates
//! before them (model -> runtime -> analysis -> report), analysis and report do not depend on
//! ONNX Runtime, and within a crate no two files import each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module files a source file names through `crate::a::b` or `super::a` (comments aside).
fn references(root: &Path, file: &Path) -> BTreeSet<PathBuf> {
    let text = std::fs::read_to_string(file).unwrap();
    let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let module_file = |parts: &[&str]| -> Option<PathBuf> {
        let mut dir = root.to_path_buf();
        let mut found = None;
        for p in parts {
            if dir.join(format!("{p}.rs")).is_file() {
                found = Some(dir.join(format!("{p}.rs")));
            } else if dir.join(p).join("mod.rs").is_file() {
                found = Some(dir.join(p).join("mod.rs"));
            } else {
                break;
            }
            dir = dir.join(p);
        }
        found
    };
    let mut refs = BTreeSet::new();
    let words: Vec<&str> = code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).collect();
    let here = file.parent().unwrap().to_path_buf();
    for w in words {
        let parts: Vec<&str> = w.split("::").filter(|p| !p.is_empty()).collect();
        match parts.first() {
            Some(&"crate") => refs.extend(module_file(&parts[1..])),
            Some(&"super") => {
                // A file's parent module is its folder's mod.rs (or lib.rs at the root).
                let parent_dir = if file.file_name().is_some_and(|n| n == "mod.rs") {
                    here.parent().unwrap().to_path_buf()
                } else {
                    here.clone()
                };
                let mut dir = parent_dir.clone();
                let mut found = None;
                for p in &parts[1..] {
                    if dir.join(format!("{p}.rs")).is_file() {
                        found = Some(dir.join(format!("{p}.rs")));
                        dir = dir.join(p);
                    } else {
                        break;
                    }
                }
                refs.extend(found);
            }
            _ => {}
        }
    }
    refs.remove(file);
    refs
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let mut cycles = Vec::new();
    let mut imports = 0;
    for root in ["src", "crates/model/src", "crates/runtime/src", "crates/analysis/src", "crates/report/src"] {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(root);
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        let edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> =
            files.iter().map(|f| (f.clone(), references(&root, f))).collect();
        imports += edges.values().map(BTreeSet::len).sum::<usize>();
        for (a, refs) in &edges {
            for b in refs {
                if a < b && edges.get(b).is_some_and(|r| r.contains(a)) {
                    cycles.push(format!("{} <-> {}", a.display(), b.display()));
                }
            }
        }
    }
    assert!(imports > 50, "the scan found only {imports} imports between files; it is broken");
    assert!(cycles.is_empty(), "files that import each other:\n{}", cycles.join("\n"));
}

#[test]
fn crates_depend_only_on_the_crates_before_them() {
    let order = ["model", "runtime", "analysis", "report"];
    for (i, name) in order.iter().enumerate() {
        let manifest =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("crates").join(name).join("Cargo.toml"))
                .unwrap();
        let dependencies = manifest.split("[dependencies]").nth(1).unwrap_or("").split("\n[").next().unwrap_or("");
        for (j, other) in order.iter().enumerate() {
            let depends = dependencies.contains(&format!("layerwise-{other}"));
            assert!(
                !(depends && j >= i),
                "layerwise-{name} depends on layerwise-{other}, which comes after it or is itself"
            );
        }
        if *name == "analysis" || *name == "report" {
            assert!(
                !dependencies.contains("layerwise-runtime") && !dependencies.contains("\nort"),
                "layerwise-{name} must not depend on the runtime crate or ONNX Runtime"
            );
        }
    }
}
