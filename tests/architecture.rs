//! docs/architecture.md's rules, checked on the sources: the crates depend only on the crates
//! before them (model -> runtime -> analysis -> report), analysis and report do not depend on
//! ONNX Runtime, and no group of files anywhere in the workspace imports itself in a circle.
//!
//! A file depends on another when it names an item of the other's module by any path Rust
//! resolves: `use` trees (braces expanded), `crate::`, `super::` and `self::` paths, and a
//! module's own child modules (`compare::f()` in `mod.rs`). A name re-exported by `pub use` is
//! followed to the module that defines it, so a crate root that only re-exports ties nothing.
//! Declaring a child (`mod x;`) is containment, not a dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Open,
    Close,
    Semi,
    Comma,
    Star,
    Str(String),
    Other(char),
}

/// Rust source as tokens, comments dropped and literals kept whole (a `::` in a string or a
/// comment is no path).
fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('#') || next == Some('"'))
            && !(next == Some('#') && chars.get(i + 2).copied().is_some_and(ident_char))
        {
            // Raw string r"..." or r#"..."# (an r#ident is read below as an identifier).
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            j += 1;
            let start = j;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                    break;
                }
                j += 1;
            }
            out.push(Token::Str(chars[start..j.min(chars.len())].iter().collect()));
            i = j + 1 + hashes;
        } else if c == '"' {
            let mut j = i + 1;
            let mut value = String::new();
            while j < chars.len() && chars[j] != '"' {
                if chars[j] == '\\' {
                    j += 1;
                }
                if let Some(&v) = chars.get(j) {
                    value.push(v);
                }
                j += 1;
            }
            out.push(Token::Str(value));
            i = j + 1;
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a), which is skipped.
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
            }
        } else if c == 'r' && next == Some('#') {
            let start = i + 2;
            let mut j = start;
            while j < chars.len() && ident_char(chars[j]) {
                j += 1;
            }
            out.push(Token::Ident(chars[start..j].iter().collect()));
            i = j;
        } else if c.is_ascii_digit() {
            while i < chars.len() && (ident_char(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if ident_char(c) {
            let start = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // A byte string b"..." or byte char b'x': the literal is read on the next turn.
            if !(word == "b" || word == "br") || !matches!(chars.get(i), Some('"') | Some('\'') | Some('#')) {
                out.push(Token::Ident(word));
            }
        } else if c.is_whitespace() {
            i += 1;
        } else if c == ':' && next == Some(':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            out.push(match c {
                '{' => Token::Open,
                '}' => Token::Close,
                ';' => Token::Semi,
                ',' => Token::Comma,
                '*' => Token::Star,
                c => Token::Other(c),
            });
            i += 1;
        }
    }
    out
}

/// A `use` tree's paths, braces expanded: `a::{b, c::{d, *}}` gives a::b, a::c::d and a::c::*.
/// Each path carries the name it binds (its last segment or its `as` alias).
fn use_paths(toks: &[Token]) -> Vec<(Vec<String>, String)> {
    fn tree(toks: &[Token], i: &mut usize, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
        let mut path = prefix.to_vec();
        while *i < toks.len() {
            match &toks[*i] {
                Token::Ident(word) if word == "as" => {
                    *i += 1;
                    if let Some(Token::Ident(alias)) = toks.get(*i) {
                        out.push((path.clone(), alias.clone()));
                        *i += 1;
                    }
                    return;
                }
                Token::Ident(word) => {
                    path.push(word.clone());
                    *i += 1;
                }
                Token::PathSep => *i += 1,
                Token::Star => {
                    path.push("*".into());
                    *i += 1;
                }
                Token::Open => {
                    *i += 1;
                    loop {
                        tree(toks, i, &path, out);
                        match toks.get(*i) {
                            Some(Token::Comma) => *i += 1,
                            Some(Token::Close) => {
                                *i += 1;
                                return;
                            }
                            _ => return,
                        }
                        if toks.get(*i) == Some(&Token::Close) {
                            *i += 1;
                            return;
                        }
                    }
                }
                _ => break,
            }
        }
        if path.len() > prefix.len() {
            let name = path.last().cloned().unwrap_or_default();
            out.push((path, name));
        }
    }
    let mut out = Vec::new();
    let mut i = 0;
    tree(toks, &mut i, &[], &mut out);
    out
}

/// One module: its file (an inline module shares its file's), its children by name, and its
/// `pub use` re-exports (bound name -> path as written, resolved from this module).
#[derive(Debug, Default)]
struct Module {
    file: PathBuf,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    reexports: BTreeMap<String, Vec<String>>,
    /// Paths this module names, as written.
    paths: Vec<Vec<String>>,
}

#[derive(Debug, Default)]
struct Crate {
    modules: Vec<Module>,
}

impl Crate {
    /// Reads the module tree from a crate root, following `mod x;` to files.
    fn load(root: &Path) -> Crate {
        let mut krate = Crate::default();
        krate.modules.push(Module { file: root.to_path_buf(), ..Default::default() });
        let dir = root.parent().unwrap().to_path_buf();
        krate.read_file(0, root, &dir);
        krate
    }

    /// `children_dir` is where `mod x;` in this file looks for x.rs or x/mod.rs.
    fn read_file(&mut self, module: usize, file: &Path, children_dir: &Path) {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let toks = tokens(&text);
        let mut stack: Vec<(usize, usize)> = vec![(module, 0)]; // (module, brace depth it opened at)
        let mut depth = 0usize;
        let mut path_attr: Option<String> = None;
        let mut i = 0;
        while i < toks.len() {
            let current = stack.last().unwrap().0;
            match &toks[i] {
                Token::Open => depth += 1,
                Token::Close => {
                    depth = depth.saturating_sub(1);
                    if stack.len() > 1 && stack.last().unwrap().1 == depth {
                        stack.pop();
                    }
                }
                Token::Ident(w) if w == "path" && toks.get(i + 1) == Some(&Token::Other('=')) => {
                    if let Some(Token::Str(p)) = toks.get(i + 2) {
                        path_attr = Some(p.clone());
                    }
                }
                Token::Ident(w) if w == "mod" => {
                    if let Some(Token::Ident(name)) = toks.get(i + 1) {
                        match toks.get(i + 2) {
                            Some(Token::Semi) => {
                                let here = self.dir_of_inline(current, children_dir);
                                let (child_file, child_dir) = match path_attr.take() {
                                    Some(p) => {
                                        let f = file.parent().unwrap().join(p);
                                        let d = f.parent().unwrap().to_path_buf();
                                        (f, d)
                                    }
                                    None if here.join(format!("{name}.rs")).is_file() => {
                                        (here.join(format!("{name}.rs")), here.join(name))
                                    }
                                    None => (here.join(name).join("mod.rs"), here.join(name)),
                                };
                                let child = self.add_child(current, name, &child_file);
                                self.read_file(child, &child_file, &child_dir);
                                i += 3;
                                continue;
                            }
                            Some(Token::Open) => {
                                let child = self.add_child(current, name, file);
                                depth += 1;
                                stack.push((child, depth - 1));
                                i += 3;
                                continue;
                            }
                            _ => {}
                        }
                    }
                }
                Token::Ident(w) if w == "use" => {
                    let public = i > 0 && self.is_pub_before(&toks, i);
                    let end = toks[i..].iter().position(|t| *t == Token::Semi).map_or(toks.len(), |p| i + p);
                    for (path, name) in use_paths(&toks[i + 1..end]) {
                        if public && name != "*" && name != "self" {
                            self.modules[current].reexports.insert(name.clone(), path.clone());
                        }
                        self.modules[current].paths.push(path);
                    }
                    i = end + 1;
                    continue;
                }
                Token::Ident(first)
                    if (i == 0 || toks[i - 1] != Token::PathSep) && toks.get(i + 1) == Some(&Token::PathSep) =>
                {
                    let mut path = vec![first.clone()];
                    let mut j = i + 1;
                    while toks.get(j) == Some(&Token::PathSep) {
                        match toks.get(j + 1) {
                            Some(Token::Ident(w)) => path.push(w.clone()),
                            _ => break,
                        }
                        j += 2;
                    }
                    self.modules[current].paths.push(path);
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }

    fn is_pub_before(&self, toks: &[Token], i: usize) -> bool {
        // `pub use` or `pub(crate) use` / `pub(super) use`.
        match toks.get(i - 1) {
            Some(Token::Ident(w)) if w == "pub" => true,
            Some(Token::Other(')')) => i >= 4 && toks[i - 4] == Token::Ident("pub".into()),
            _ => false,
        }
    }

    /// Inline modules look for their `mod x;` files in a folder named after them.
    fn dir_of_inline(&self, module: usize, children_dir: &Path) -> PathBuf {
        let mut names = Vec::new();
        let mut m = module;
        let file = &self.modules[module].file;
        while let Some(parent) = self.modules[m].parent {
            if self.modules[parent].file != *file {
                break;
            }
            names.push(self.modules[m].children_name_in(&self.modules[parent], m));
            m = parent;
        }
        let mut dir = children_dir.to_path_buf();
        for n in names.iter().rev() {
            dir = dir.join(n);
        }
        dir
    }

    fn add_child(&mut self, parent: usize, name: &str, file: &Path) -> usize {
        self.modules.push(Module { file: file.to_path_buf(), parent: Some(parent), ..Default::default() });
        let id = self.modules.len() - 1;
        self.modules[parent].children.insert(name.to_string(), id);
        id
    }

    /// The module a path names from `module` (the deepest module it walks through; a re-exported
    /// item is followed to where it is defined), or `None` for a path outside this crate.
    fn resolve(&self, module: usize, path: &[String], seen: &mut BTreeSet<(usize, String)>) -> Option<usize> {
        let mut at = module;
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                at = 0;
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    at = self.modules[at].parent?;
                    rest = &rest[1..];
                }
            }
            Some(first) if self.modules[module].children.contains_key(first) => {}
            _ => return None,
        }
        for (k, segment) in rest.iter().enumerate() {
            if let Some(&child) = self.modules[at].children.get(segment) {
                at = child;
            } else if let Some(target) = self.modules[at].reexports.get(segment) {
                if !seen.insert((at, segment.clone())) {
                    return Some(at);
                }
                let mut followed = target.clone();
                followed.extend(rest[k + 1..].iter().cloned());
                // A name re-exported from another crate is outside this one.
                return self.resolve(at, &followed, seen);
            } else {
                return Some(at);
            }
        }
        Some(at)
    }

    /// File -> the files it depends on, each with the first path (as written) that names it.
    fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for (id, m) in self.modules.iter().enumerate() {
            let from = edges.entry(m.file.clone()).or_default();
            for path in &m.paths {
                if let Some(target) = self.resolve(id, path, &mut BTreeSet::new()) {
                    let to = &self.modules[target].file;
                    if *to != m.file {
                        from.entry(to.clone()).or_insert_with(|| path.join("::"));
                    }
                }
            }
        }
        edges
    }
}

type Edges = BTreeMap<PathBuf, BTreeMap<PathBuf, String>>;

impl Module {
    fn children_name_in(&self, parent: &Module, me: usize) -> String {
        parent.children.iter().find(|(_, &id)| id == me).map(|(n, _)| n.clone()).unwrap_or_default()
    }
}

/// Groups of more than one file that depend on each other in a circle (Tarjan's strongly
/// connected components).
fn circles(edges: &Edges) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        edges: &'a Edges,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(outs) = s.edges.get(v) {
            for w in outs.keys() {
                let Some((w, _)) = s.edges.get_key_value(w) else { continue };
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                group.push(w.clone());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.found.push(group);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Every crate root of the workspace: libraries, the binary, tests, benches, the Python crate and
/// the fuzz targets.
fn crate_roots() -> Vec<PathBuf> {
    let ws = workspace();
    let mut roots = vec![ws.join("src/lib.rs"), ws.join("src/main.rs"), ws.join("crates/python/src/lib.rs")];
    let mut folders = vec![ws.join("tests"), ws.join("benches"), ws.join("fuzz/fuzz_targets")];
    for name in ["model", "runtime", "analysis", "report"] {
        roots.push(ws.join("crates").join(name).join("src/lib.rs"));
        folders.push(ws.join("crates").join(name).join("tests"));
        folders.push(ws.join("crates").join(name).join("benches"));
    }
    for folder in folders {
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        let mut files: Vec<PathBuf> = entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            // The fuzz targets' shared file is a module of each target, not a target.
            .filter(|p| p.file_name().is_none_or(|n| n != "common.rs"))
            .collect();
        files.sort();
        roots.extend(files);
    }
    roots
}

/// The workspace's circles, each with the dependencies between its own files.
type Circle = (Vec<PathBuf>, Vec<(PathBuf, PathBuf, String)>);

fn workspace_circles() -> (usize, usize, Vec<Circle>) {
    let mut edges = Edges::new();
    let mut files = 0;
    let crates: Vec<Crate> = crate_roots().iter().map(|root| Crate::load(root)).collect();
    // A test file that tests/tests.rs declares as a module is that binary's module, not a root.
    let modules: BTreeSet<&PathBuf> = crates.iter().flat_map(|k| k.modules.iter().skip(1).map(|m| &m.file)).collect();
    for krate in crates.iter().filter(|k| !modules.contains(&k.modules[0].file)) {
        files += krate.modules.len();
        for (from, to) in krate.edges() {
            let entry = edges.entry(from).or_default();
            for (file, why) in to {
                entry.entry(file).or_insert(why);
            }
        }
    }
    let count = edges.values().map(BTreeMap::len).sum();
    let found = circles(&edges)
        .into_iter()
        .map(|group| {
            let within = group
                .iter()
                .flat_map(|a| {
                    edges[a]
                        .iter()
                        .filter(|(b, _)| group.contains(b))
                        .map(|(b, why)| (a.clone(), b.clone(), why.clone()))
                })
                .collect();
            (group, within)
        })
        .collect();
    (files, count, found)
}

#[test]
fn no_group_of_files_in_the_workspace_depends_on_itself_in_a_circle() {
    let (modules, dependencies, found) = workspace_circles();
    assert!(
        modules > 150 && dependencies > 200,
        "the scan found {modules} modules and {dependencies} dependencies: it is broken"
    );
    let ws = workspace();
    let name = |f: &PathBuf| f.strip_prefix(&ws).unwrap_or(f).display().to_string();
    let shown: Vec<String> = found
        .iter()
        .map(|(group, within)| {
            let arrows: Vec<String> =
                within.iter().map(|(a, b, why)| format!("  {} -> {} ({why})", name(a), name(b))).collect();
            format!("{}\n{}", group.iter().map(name).collect::<Vec<_>>().join(", "), arrows.join("\n"))
        })
        .collect();
    assert!(
        shown.is_empty(),
        "files in a circle of dependencies (each group reaches every other):\n{}",
        shown.join("\n")
    );
}

/// The scan itself, on a small crate written here: each way a file can name another is seen,
/// and a circle of three files through `super::item`, a `use` group and a child path is found.
#[test]
fn the_circle_scan_sees_super_items_use_groups_and_child_paths() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("stage")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod stage;\npub mod plain;\npub use stage::helper;\n").unwrap();
    // mod.rs calls its child by the child's own path; a.rs uses a group; b.rs names mod.rs's item.
    std::fs::write(src.join("stage/mod.rs"), "mod a;\nmod b;\npub fn helper() {}\npub fn run() { a::go(); }\n")
        .unwrap();
    std::fs::write(src.join("stage/a.rs"), "use super::{b::{step, other as o}};\npub fn go() { step(); }\n").unwrap();
    std::fs::write(src.join("stage/b.rs"), "pub fn step() { super::helper(); }\npub fn other() {}\n").unwrap();
    // plain.rs names an item through the root's re-export and a string holding a path: no circle.
    std::fs::write(src.join("plain.rs"), "pub fn f() { crate::helper(); let _ = \"crate::plain::f\"; }\n// super::x\n")
        .unwrap();
    let krate = Crate::load(&src.join("lib.rs"));
    let edges = krate.edges();
    let plain = &edges[&src.join("plain.rs")];
    assert_eq!(
        plain.keys().collect::<Vec<_>>(),
        vec![&src.join("stage/mod.rs")],
        "a re-export is followed to its definition"
    );
    assert!(edges[&src.join("lib.rs")].contains_key(&src.join("stage/mod.rs")));
    let found = circles(&edges);
    assert_eq!(found, vec![vec![src.join("stage/a.rs"), src.join("stage/b.rs"), src.join("stage/mod.rs")]]);
    // Cut the circle at b.rs: the scan finds none.
    std::fs::write(src.join("stage/b.rs"), "pub fn step() {}\npub fn other() {}\n").unwrap();
    assert!(circles(&Crate::load(&src.join("lib.rs")).edges()).is_empty());
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
