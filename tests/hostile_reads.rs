//! Issue 37, reading what it should not and memory bombs: files that lead layerwise outside the
//! model's folder (external data through a link, D4), files that are devices or FIFOs (D13),
//! `.npz`/`.npy` headers that lie or nest without end (D12), and runs that cannot fit in memory
//! (D10). Every case exits 2 with its message, in bounded time, and leaves the folder as it was.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{save, text};
use layerwise_model::builder::{attr, f32_tensor, i64_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::{tensor_proto::DataLocation, ModelProto, StringStringEntryProto};
use layerwise_model::DataType;
use layerwise_runtime::npy::write_npz;
use layerwise_runtime::Tensor;

/// x[1,4] -> Mul(w) -> a -> Relu -> y.
fn valid() -> ModelProto {
    let mut b = ModelBuilder::new("base", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.initializer(f32_tensor("w", &[4], &[1.0, 2.0, 3.0, 4.0]));
    b.node("Mul", "mul", &["x", "w"], &["a"], vec![]);
    b.node("Relu", "relu", &["a"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// [`valid`] with `w` (16 bytes) stored in the external file `location`.
fn external(location: &str) -> ModelProto {
    let mut m = valid();
    let t = &mut m.graph.as_mut().unwrap().initializer[0];
    t.raw_data = None;
    let entry = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
    t.external_data = vec![entry("location", location.into()), entry("length", "16".into())];
    t.data_location = Some(DataLocation::External as i32);
    m
}

/// Relu(x: [N]): every size of input, for the memory estimate.
fn relu() -> ModelProto {
    let mut b = ModelBuilder::new("relu", 17);
    b.input("x", DataType::Float, &[Dim::from("N")]);
    b.node("Relu", "relu", &["x"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// A run of the binary, stopped (killed, by its own id) after `limit`: a run that blocks on a
/// FIFO or reads /dev/zero without end fails the test instead of hanging it. Its output goes to
/// files, so a run that writes megabytes cannot block on a full pipe. `tmp` becomes its TMPDIR.
fn run(args: &[&str], cwd: &Path, tmp: &Path, limit: Duration) -> (Output, Duration) {
    let logs = tempfile::tempdir().unwrap();
    let (out, err) = (logs.path().join("out"), logs.path().join("err"));
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_layerwise"))
        .args(args)
        .current_dir(cwd)
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("{args:?} still ran after {limit:?}: killed (it blocked, or read or allocated without limit)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    (Output { status, stdout: std::fs::read(&out).unwrap(), stderr: std::fs::read(&err).unwrap() }, elapsed)
}

/// Every entry under `dir` without following links or reading anything but regular files (a
/// FIFO read here would block): regular files with their bytes, links with their targets.
fn snapshot(dir: &Path) -> Vec<(PathBuf, String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.file_type().is_symlink() {
            out.push((p.clone(), format!("link to {}", std::fs::read_link(&p).unwrap().display()), Vec::new()));
        } else if meta.is_dir() {
            out.push((p.clone(), "folder".into(), Vec::new()));
            out.extend(snapshot(&p));
        } else if meta.is_file() {
            out.push((p.clone(), "file".into(), std::fs::read(&p).unwrap()));
        } else {
            out.push((p.clone(), format!("{:?}", meta.file_type()), Vec::new()));
        }
    }
    out
}

/// A place for the cases: `root` (the files), `tmp` (the runs' TMPDIR, which must stay empty).
struct Cases {
    root: tempfile::TempDir,
    tmp: tempfile::TempDir,
}

impl Cases {
    fn new() -> Cases {
        Cases { root: tempfile::tempdir().unwrap(), tmp: tempfile::tempdir().unwrap() }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }
    fn p(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
    /// `args` exits 2 with `message` within `limit`, writes nothing (no report, no model, nothing
    /// left in its TMPDIR) and changes nothing. Returns the text it printed.
    fn refused(&self, args: &[&str], message: &str, limit: Duration) -> String {
        let before = snapshot(self.root.path());
        let (out, _) = run(args, self.root.path(), self.tmp.path(), limit);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(said.contains(message), "{args:?}: expected '{message}' in: {said}");
        assert!(!said.contains("panicked"), "{args:?}: {said}");
        assert_eq!(snapshot(self.root.path()), before, "{args:?} changed, wrote or left files behind");
        // ONNX Runtime keeps a session id of its own there (`.ses`); layerwise's are named so.
        let left: Vec<PathBuf> = std::fs::read_dir(self.tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains("layerwise"))
            .collect();
        assert!(left.is_empty(), "{args:?} left temporary files: {left:?}");
        said
    }
    /// `args` runs to a verdict (exit 0 or 1).
    fn runs(&self, args: &[&str]) -> String {
        let (out, _) = run(args, self.root.path(), self.tmp.path(), Duration::from_secs(120));
        let said = text(&out);
        assert!(matches!(out.status.code(), Some(0) | Some(1)), "{args:?}: {said}");
        said
    }
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

const QUICK: Duration = Duration::from_secs(20);

#[test]
fn external_data_through_a_link_out_of_the_models_folder_is_refused_by_every_command() {
    let c = Cases::new();
    std::fs::create_dir_all(c.path("outside/dir")).unwrap();
    std::fs::create_dir_all(c.path("m/real")).unwrap();
    // 16 bytes that must never reach a written model or a report.
    let secret = b"SECRET-OUTSIDE!!";
    std::fs::write(c.path("outside/secret.bin"), secret).unwrap();
    std::fs::write(c.path("outside/dir/w.bin"), secret).unwrap();
    // A linked file, and a linked folder, each resolving outside the model's folder.
    std::os::unix::fs::symlink(c.path("outside/secret.bin"), c.path("m/w.bin")).unwrap();
    std::os::unix::fs::symlink(c.path("outside/dir"), c.path("m/data")).unwrap();
    save(&external("w.bin"), &c.path("m/file.onnx"));
    save(&external("data/w.bin"), &c.path("m/folder.onnx"));
    // External data that is a FIFO inside the folder: not a regular file.
    mkfifo(&c.path("m/pipe.bin"));
    save(&external("pipe.bin"), &c.path("m/pipe.onnx"));
    save(&valid(), &c.path("m/good.onnx"));
    let y = Tensor::f32(vec![1, 4], vec![1.0; 4]);
    write_npz(&c.path("m/cand.npz"), &[("a", &y), ("y", &y)]).unwrap();

    let outside = "points outside the model's folder (through a symbolic link";
    for (model, message) in
        [("m/file.onnx", outside), ("m/folder.onnx", outside), ("m/pipe.onnx", "not a regular file")]
    {
        let m = c.p(model);
        let (out, fixed, json) = (c.p("m/out.onnx"), c.p("m/fixed.onnx"), c.p("m/r.json"));
        // The same message from every command, `convert` included (it embedded the bytes).
        c.refused(&["convert", &m, "--to", "fp16", "-o", &out], message, QUICK);
        c.refused(&["bisect", &m, "--json", &json], message, QUICK);
        c.refused(&["fix", &m, "-o", &fixed], message, QUICK);
        c.refused(&["bisect", &m, "--cand", &format!("npz:{}", c.p("m/cand.npz")), "--json", &json], message, QUICK);
        c.refused(&["bisect", &c.p("m/good.onnx"), "--cand-model", &m, "--json", &json], message, QUICK);
    }
    // The message names the file's real place, and ends in the usual refusal.
    let said = c.refused(
        &["bisect", &c.p("m/file.onnx")],
        "external data of initializer 'w': location 'w.bin' points outside",
        QUICK,
    );
    assert!(said.contains("outside/secret.bin") && said.contains("; refused"), "{said}");

    // A link that stays inside the folder is followed as before.
    std::fs::write(
        c.path("m/real/w.bin"),
        [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
    std::os::unix::fs::symlink(c.path("m/real"), c.path("m/inside")).unwrap();
    save(&external("inside/w.bin"), &c.path("m/inside.onnx"));
    c.runs(&["bisect", &c.p("m/inside.onnx")]);
    c.runs(&["convert", &c.p("m/inside.onnx"), "--to", "fp16", "-o", &c.p("m/inside16.onnx")]);
    let written = std::fs::read(c.path("m/inside16.onnx")).unwrap();
    assert!(!written.windows(secret.len()).any(|w| w == secret));
}

#[test]
fn files_that_are_devices_or_fifos_are_refused_before_reading() {
    let c = Cases::new();
    save(&valid(), &c.path("good.onnx"));
    let good = c.p("good.onnx");
    std::os::unix::fs::symlink("/dev/zero", c.path("zero.onnx")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", c.path("zero.npy")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", c.path("zero.npz")).unwrap();
    for f in ["fifo.onnx", "fifo.npz", "fifo.py"] {
        mkfifo(&c.path(f));
    }
    // A folder of samples with one FIFO among them, and a saved run whose manifest is one.
    std::fs::create_dir(c.path("samples")).unwrap();
    write_npz(&c.path("samples/a.npz"), &[("x", &Tensor::f32(vec![1, 4], vec![0.5; 4]))]).unwrap();
    mkfifo(&c.path("samples/b.npz"));
    std::fs::create_dir(c.path("run")).unwrap();
    mkfifo(&c.path("run/manifest.json"));
    let (out, json) = (c.p("out.onnx"), c.p("r.json"));

    let not_regular = "not a regular file";
    for model in ["zero.onnx", "fifo.onnx"] {
        let m = c.p(model);
        c.refused(&["bisect", &m, "--json", &json], not_regular, QUICK);
        c.refused(&["convert", &m, "--to", "fp16", "-o", &out], not_regular, QUICK);
        c.refused(&["fix", &m, "-o", &out], not_regular, QUICK);
        c.refused(&["bisect", &good, "--cand-model", &m, "--json", &json], not_regular, QUICK);
    }
    let said =
        c.refused(&["bisect", &c.p("zero.onnx")], "it is a character device, not a regular file; refused", QUICK);
    assert!(said.contains("zero.onnx"), "{said}");
    c.refused(&["bisect", &c.p("fifo.onnx")], "it is a named pipe (FIFO), not a regular file; refused", QUICK);
    c.refused(&["bisect", &good, "--inputs", &c.p("fifo.npz"), "--json", &json], not_regular, QUICK);
    c.refused(&["bisect", &good, "--inputs", &c.p("zero.npz"), "--json", &json], not_regular, QUICK);
    c.refused(&["bisect", &good, "--input", &format!("x={}", c.p("zero.npy")), "--json", &json], not_regular, QUICK);
    c.refused(
        &["bisect", &good, "--inputs", &c.p("samples"), "--json", &json],
        "sample b.npz: it is a named pipe (FIFO), not a regular file",
        QUICK,
    );
    // A folder named like a sample is refused too, not skipped without a word (the independent
    // tester, stop 49).
    std::fs::create_dir(c.path("folders")).unwrap();
    write_npz(&c.path("folders/a.npz"), &[("x", &Tensor::f32(vec![1, 4], vec![0.5; 4]))]).unwrap();
    std::fs::create_dir(c.path("folders/b.npz")).unwrap();
    c.refused(
        &["bisect", &good, "--inputs", &c.p("folders"), "--json", &json],
        "sample b.npz: it is a folder, not a regular file",
        QUICK,
    );
    c.refused(&["bisect", &good, "--cand", &format!("npz:{}", c.p("fifo.npz")), "--json", &json], not_regular, QUICK);
    c.refused(&["bisect", &good, "--cand", &format!("npz:{}", c.p("zero.npz")), "--json", &json], not_regular, QUICK);
    c.refused(&["bisect", &good, "--cand", &format!("npz:{}", c.p("run")), "--json", &json], not_regular, QUICK);
    c.refused(&["bisect", &good, "--data-loader-script", &c.p("fifo.py"), "--json", &json], not_regular, QUICK);
    // Reports given to `report` and `merge` too.
    std::os::unix::fs::symlink("/dev/zero", c.path("zero.json")).unwrap();
    mkfifo(&c.path("fifo.json"));
    for report in ["zero.json", "fifo.json"] {
        c.refused(&["report", &c.p(report), "--html", &c.p("r.html")], not_regular, QUICK);
        c.refused(&["merge", &c.p(report), "--json", &json], not_regular, QUICK);
    }

    // A link to a regular model elsewhere is the user's to name: it is followed.
    let elsewhere = tempfile::tempdir().unwrap();
    save(&valid(), &elsewhere.path().join("real.onnx"));
    std::os::unix::fs::symlink(elsewhere.path().join("real.onnx"), c.path("linked.onnx")).unwrap();
    c.runs(&["bisect", &c.p("linked.onnx")]);
}

/// Appends bits to a byte vector least significant first, as DEFLATE packs them.
struct Bits {
    bytes: Vec<u8>,
    used: u32,
}

impl Bits {
    fn put(&mut self, value: u32, count: u32) {
        for i in 0..count {
            if self.used.is_multiple_of(8) {
                self.bytes.push(0);
            }
            let bit = ((value >> i) & 1) as u8;
            *self.bytes.last_mut().unwrap() |= bit << (self.used % 8);
            self.used += 1;
        }
    }
    /// A Huffman code, which DEFLATE writes most significant bit first.
    fn code(&mut self, code: u32, len: u32) {
        let reversed = (0..len).fold(0, |r, i| r | (((code >> i) & 1) << (len - 1 - i)));
        self.put(reversed, len);
    }
    /// A literal byte in the fixed Huffman code.
    fn literal(&mut self, b: u8) {
        match b {
            0..=143 => self.code(0x30 + b as u32, 8),
            _ => self.code(0x190 + (b as u32 - 144), 9),
        }
    }
}

/// `header` followed by `zeros` zero bytes, deflated by hand: one fixed-Huffman block of a zero
/// literal and then copies of 258 bytes at distance 1 (13 bits each), so a few megabytes stand
/// for hundreds (an attacker's 3.9 MB npz stood for 3.9 GB).
fn deflated_zeros(header: &[u8], zeros: usize) -> Vec<u8> {
    let mut bits = Bits { bytes: Vec::new(), used: 0 };
    bits.put(1, 1); // the last block
    bits.put(1, 2); // fixed Huffman codes
    for &b in header {
        bits.literal(b);
    }
    bits.literal(0);
    let mut left = zeros - 1;
    while left >= 258 {
        bits.code(0xc5, 8); // length code 285: 258 bytes
        bits.code(0, 5); // distance code 0: 1 byte back
        left -= 258;
    }
    for _ in 0..left {
        bits.literal(0);
    }
    bits.code(0, 7); // end of block
    bits.bytes
}

/// A one-member zip archive (`name`, deflated `data` of `size` bytes), written by hand. Its CRC
/// is left 0: a reader that checks the header first never reaches the end where it is checked.
fn zip_one(name: &str, data: &[u8], size: u32) -> Vec<u8> {
    let mut z = Vec::new();
    let u16le = |z: &mut Vec<u8>, v: u16| z.extend(v.to_le_bytes());
    let u32le = |z: &mut Vec<u8>, v: u32| z.extend(v.to_le_bytes());
    u32le(&mut z, 0x0403_4b50);
    for v in [20u16, 0, 8, 0, 0x21] {
        u16le(&mut z, v); // version, flags, deflate, time, date
    }
    for v in [0u32, data.len() as u32, size] {
        u32le(&mut z, v); // crc, compressed and uncompressed sizes
    }
    u16le(&mut z, name.len() as u16);
    u16le(&mut z, 0);
    z.extend(name.as_bytes());
    z.extend(data);
    let central = z.len() as u32;
    u32le(&mut z, 0x0201_4b50);
    for v in [20u16, 20, 0, 8, 0, 0x21] {
        u16le(&mut z, v);
    }
    for v in [0u32, data.len() as u32, size] {
        u32le(&mut z, v);
    }
    for v in [name.len() as u16, 0, 0, 0, 0] {
        u16le(&mut z, v); // name, extra, comment, disk, internal attributes
    }
    u32le(&mut z, 0); // external attributes
    u32le(&mut z, 0); // local header offset
    z.extend(name.as_bytes());
    let central_len = z.len() as u32 - central;
    u32le(&mut z, 0x0605_4b50);
    for v in [0u16, 0, 1, 1] {
        u16le(&mut z, v);
    }
    u32le(&mut z, central_len);
    u32le(&mut z, central);
    u16le(&mut z, 0);
    z
}

/// A version-1 `.npy` header for `dict`.
fn npy_header(dict: &str) -> Vec<u8> {
    let mut padded = format!("{dict} ");
    while (10 + padded.len() + 1) % 64 != 0 {
        padded.push(' ');
    }
    padded.push('\n');
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    h.extend((padded.len() as u16).to_le_bytes());
    h.extend(padded.as_bytes());
    h
}

#[test]
fn npz_and_npy_headers_are_checked_before_their_data_is_read() {
    let c = Cases::new();
    save(&valid(), &c.path("good.onnx"));
    let good = c.p("good.onnx");
    // The model's input is float32 [1, 4]; the member's header says (100000000,), over 256 MiB
    // of zeros in 1.7 MB: decompressed whole before the shape was checked (an attacker's
    // (1000000000,) took 25 s and 3.9 GB). Under the memory of any machine, so that the shape
    // check, not the check against available memory, refuses it.
    let header = npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100000000,), }");
    let zeros = 256 << 20;
    let member = deflated_zeros(&header, zeros);
    std::fs::write(c.path("bomb.npz"), zip_one("x.npy", &member, (header.len() + zeros) as u32)).unwrap();
    assert!(std::fs::metadata(c.path("bomb.npz")).unwrap().len() < 4 << 20, "the bomb is small");
    let started = Instant::now();
    let said = c.refused(
        &["bisect", &good, "--inputs", &c.p("bomb.npz")],
        "input 'x' has shape 100000000 from npz:",
        Duration::from_secs(60),
    );
    assert!(said.contains("but the model declares [1, 4]"), "{said}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "refused from the header, not after decompressing: {:?}",
        started.elapsed()
    );

    // The same lie in a plain .npy of 16 bytes of data.
    let mut npy = header.clone();
    npy.extend([0u8; 16]);
    std::fs::write(c.path("big.npy"), &npy).unwrap();
    c.refused(
        &["bisect", &good, "--input", &format!("x={}", c.p("big.npy"))],
        "input 'x' has shape 100000000 from npy:",
        QUICK,
    );
    // A header of the right shape over too little data: refused before reading, with the sizes.
    let mut short = npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4), }");
    short.extend([0u8; 8]);
    std::fs::write(c.path("short.npy"), &short).unwrap();
    c.refused(
        &["bisect", &good, "--input", &format!("x={}", c.p("short.npy"))],
        "declares shape 1x4 (16 bytes of data), but only 8 bytes follow",
        QUICK,
    );
    // The wrong type is refused from the header too.
    let mut ints = npy_header("{'descr': '<i8', 'fortran_order': False, 'shape': (1, 4), }");
    ints.extend([0u8; 32]);
    std::fs::write(c.path("ints.npy"), &ints).unwrap();
    c.refused(
        &["bisect", &good, "--input", &format!("x={}", c.p("ints.npy"))],
        "input 'x' must be float32 but npy:",
        QUICK,
    );
}

#[test]
fn deep_or_huge_npy_headers_are_refused_with_a_short_message() {
    let c = Cases::new();
    save(&valid(), &c.path("good.onnx"));
    let good = c.p("good.onnx");
    // A version-2 header (its length a u32) nesting 1,000,000 deep: 2 MB that the parser echoed
    // into the error message whole.
    let dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': {}{}, }}\n",
        "(".repeat(1_000_000),
        ")".repeat(1_000_000)
    );
    let mut deep = b"\x93NUMPY\x02\x00".to_vec();
    deep.extend((dict.len() as u32).to_le_bytes());
    deep.extend(dict.as_bytes());
    std::fs::write(c.path("deep.npy"), &deep).unwrap();
    let said = c.refused(
        &["bisect", &good, "--input", &format!("x={}", c.p("deep.npy"))],
        "more than the 65535 layerwise reads",
        QUICK,
    );
    assert!(said.len() < 2000, "{} bytes of message", said.len());
    // Nested within the size limit: refused on its depth, with a short message (no recursion to
    // the bottom, no echo).
    let dict =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {}{}, }}", "(".repeat(20_000), ")".repeat(20_000));
    std::fs::write(c.path("nested.npy"), npy_header(&dict)).unwrap();
    let said = c.refused(
        &["bisect", &good, "--input", &format!("x={}", c.p("nested.npy"))],
        "its .npy header nests brackets 20001 deep",
        QUICK,
    );
    assert!(said.len() < 2000, "{} bytes of message", said.len());
    // A header the parser refuses is quoted in a short excerpt at most.
    let junk = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4), 'x': {} }}", "z".repeat(30_000));
    std::fs::write(c.path("junk.npy"), npy_header(&junk)).unwrap();
    let said =
        c.refused(&["bisect", &good, "--input", &format!("x={}", c.p("junk.npy"))], "not a valid .npy array", QUICK);
    assert!(said.len() < 2000, "{} bytes of message", said.len());
    // The same in an .npz member, and an array name of 60,000 characters quoted short.
    let x = Tensor::f32(vec![1, 4], vec![0.5; 4]);
    let long = "n".repeat(60_000);
    write_npz(&c.path("long.npz"), &[(long.as_str(), &x)]).unwrap();
    let said =
        c.refused(&["bisect", &good, "--inputs", &c.p("long.npz")], "but the model has no input of that name", QUICK);
    assert!(said.len() < 2000, "{} bytes of message", said.len());
}

/// MemAvailable of this machine, as layerwise reads it.
fn available() -> u64 {
    layerwise_runtime::inputs::available_memory().expect("/proc/meminfo")
}

#[test]
fn runs_that_cannot_fit_in_memory_are_refused_up_front_with_the_figures() {
    let c = Cases::new();
    save(&relu(), &c.path("relu.onnx"));
    let m = c.p("relu.onnx");
    // 1,000,000 float32 inputs are 3.8 MiB, which no split brings under 1 MiB: both sides hold
    // the input and the output (x:100000000 peaked at 5.5x the input under --max-memory 1K).
    for extra in [&[][..], &["--separate-runs"][..], &["--save-tensors", "sv"][..]] {
        let mut args = vec!["bisect", &m, "--input-shape", "x:1000000", "--max-memory", "1M"];
        args.extend_from_slice(extra);
        let said = c.refused(&args, "--max-memory 1.0 MiB: this run holds at least", QUICK);
        assert!(said.contains("3.8 MiB of inputs") && said.contains("the largest tensor 'y' 3.8 MiB"), "{said}");
        let why = if extra.contains(&"--save-tensors") {
            "every tensor is held at once (--save-tensors, or fix's reference"
        } else {
            "a single tensor cannot be split into smaller groups"
        };
        assert!(said.contains(why), "{said}");
    }
    // fix holds the reference's every tensor for its trials: --max-memory counts them whole (fix
    // had no --max-memory before; its runs were bounded only by the memory available).
    let fixed = c.p("fixed.onnx");
    let said = c.refused(
        &["fix", &m, "--input-shape", "x:1000000", "--max-memory", "1M", "-o", &fixed],
        "--max-memory 1.0 MiB: this run holds at least",
        QUICK,
    );
    assert!(said.contains("fix's reference, which its trials compare against"), "{said}");
    assert!(!c.path("fixed.onnx").exists(), "a refused fix wrote its model");
    // What fits its budget runs as before.
    c.runs(&["fix", &m, "--input-shape", "x:1000", "--max-memory", "1M", "-o", &fixed]);
    c.runs(&["bisect", &m, "--input-shape", "x:1000", "--max-memory", "1M"]);
    c.runs(&["bisect", &m, "--input-shape", "x:1000", "--max-memory", "1M", "--separate-runs"]);

    // An input of a third of the memory available passes the input's own check, but both sides
    // and the runtime's copies take several times that: refused at once, nothing allocated, no
    // scratch folder left (x:1000000000 was killed by the kernel at 20.7 GB, its folder left).
    let n = available() / 4 / 3;
    let shape = format!("x:{n}");
    let started = Instant::now();
    let said = c.refused(&["bisect", &m, "--input-shape", &shape], "this run needs about", QUICK);
    assert!(said.contains("of memory") && said.contains("available; give smaller inputs"), "{said}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    c.refused(&["fix", &m, "--input-shape", &shape, "-o", &c.p("fixed.onnx")], "this run needs about", QUICK);
}

/// A model whose length is computed from the data: `length` (a float initializer) plus 0 times
/// the input's sum, cast to an integer, makes a Range of that many rows; each row is multiplied by
/// a 1,024-wide row and goes through Sin, Mul, Cos and Add before one mean comes out. Its tensors
/// are `length` x 1,024 floats: a shape no plan made before the run can know.
fn data_dependent_length(length: f32) -> ModelProto {
    let mut b = ModelBuilder::new("length", 17);
    b.input("x", DataType::Float, &[Dim::from(4)]);
    b.initializer(f32_tensor("zero", &[], &[0.0]));
    b.initializer(f32_tensor("length", &[], &[length]));
    b.initializer(i64_tensor("start", &[], &[0]));
    b.initializer(i64_tensor("step", &[], &[1]));
    b.initializer(i64_tensor("axis1", &[1], &[1]));
    b.initializer(f32_tensor("row", &[1, 1024], &(0..1024).map(|i| i as f32 / 1024.0).collect::<Vec<_>>()));
    b.initializer(f32_tensor("half", &[], &[0.5]));
    b.node("ReduceSum", "sum", &["x"], &["s"], vec![attr::int("keepdims", 0)]);
    b.node("Mul", "nothing", &["s", "zero"], &["z"], vec![]);
    b.node("Add", "lengthf", &["z", "length"], &["lf"], vec![]);
    b.node("Cast", "length_int", &["lf"], &["n"], vec![attr::int("to", DataType::Int64 as i64)]);
    b.node("Range", "range", &["start", "n", "step"], &["r"], vec![]);
    b.node("Cast", "range_float", &["r"], &["rf"], vec![attr::int("to", DataType::Float as i64)]);
    b.node("Unsqueeze", "column", &["rf", "axis1"], &["col"], vec![]);
    b.node("Mul", "wide", &["col", "row"], &["w"], vec![]);
    b.node("Sin", "sin", &["w"], &["a1"], vec![]);
    b.node("Mul", "halve", &["a1", "half"], &["a2"], vec![]);
    b.node("Cos", "cos", &["a2"], &["a3"], vec![]);
    b.node("Add", "add", &["a3", "a1"], &["a4"], vec![]);
    b.node("ReduceMean", "mean", &["a4"], &["y"], vec![attr::int("keepdims", 0)]);
    b.output("y", DataType::Float);
    b.build()
}

/// Issue 55: a candidate whose data-dependent shapes outgrow the reference's (a text-to-speech
/// model whose FP16 duration overflowed computed 11x the frames, and the kernel killed `bisect` at
/// 24 GB with or without `--max-memory 4G`: the plan knew only the reference's shapes). Here the
/// candidate's length is 256x the reference's (256 MiB per tensor against 1 MiB): each run is
/// stopped as it grows past --max-memory plus ONNX Runtime's working memory, and the run exits 2
/// saying so, writing nothing. Without the stop the candidate ran to the end (exit 1, its
/// tensors 1 GiB in all), whatever --max-memory said.
#[test]
fn a_candidate_whose_data_dependent_shapes_outgrow_the_plan_is_stopped_within_max_memory() {
    let c = Cases::new();
    save(&data_dependent_length(256.0), &c.path("ref.onnx"));
    save(&data_dependent_length(65536.0), &c.path("cand.onnx"));
    let (reference, candidate, json) = (c.p("ref.onnx"), c.p("cand.onnx"), c.p("r.json"));
    let stopped = "the run was stopped while it ran: it grew the process by";
    for extra in [&[][..], &["--separate-runs"][..]] {
        let mut args =
            vec!["bisect", &reference, "--cand", "ort:cpu", "--cand-model", &candidate, "--max-memory", "64M"];
        args.extend_from_slice(&["--json", &json]);
        args.extend_from_slice(extra);
        let said = c.refused(&args, stopped, QUICK);
        assert!(
            said.contains("past its limit of 192.0 MiB (--max-memory 64.0 MiB plus 128.0 MiB of ONNX Runtime's own working memory)"),
            "{said}"
        );
        assert!(said.contains("tensors whose shapes depend on the data"), "{said}");
    }
    // The same pair within the reference's sizes runs to a verdict under the same limit.
    save(&data_dependent_length(512.0), &c.path("cand.onnx"));
    c.runs(&["bisect", &reference, "--cand", "ort:cpu", "--cand-model", &candidate, "--max-memory", "64M"]);
}

/// Found by the red team (issue 54 item 7): a `while True` data loader was drained into the
/// temporary folder until the disk was full, and the user saw numpy's traceback. Samples are
/// bounded by count (--max-loader-samples) and by half the free space, and the run says the
/// loader did not end, leaving nothing behind.
#[test]
fn a_data_loader_that_never_ends_is_stopped_and_said_so() {
    let c = Cases::new();
    save(&valid(), &c.path("m.onnx"));
    std::fs::write(
        c.path("endless.py"),
        "import numpy as np\ndef load_data():\n    while True:\n        yield {'x': np.zeros((1, 4), np.float32)}\n",
    )
    .unwrap();
    let (m, json, script) = (c.p("m.onnx"), c.p("r.json"), c.p("endless.py"));
    c.refused(
        &["bisect", &m, "--data-loader-script", &script, "--max-loader-samples", "5", "--json", &json],
        "load_data() did not end within 5 samples (80 bytes): the limit is 5 samples",
        QUICK,
    );
}

/// Found by the red team (issue 54): a tensor file of a saved run that is a link to a file outside
/// the run's folder was read as a saved tensor (a folder linked out was refused already). Every
/// file of a saved run must resolve inside its folder.
#[test]
fn a_saved_runs_tensor_file_linked_out_of_its_folder_is_refused() {
    let c = Cases::new();
    save(&valid(), &c.path("m.onnx"));
    let (m, json) = (c.p("m.onnx"), c.p("r.json"));
    c.runs(&["bisect", &m, "--separate-runs", "--save-tensors", &c.p("st")]);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.path("st/cand/manifest.json")).unwrap()).unwrap();
    let file = manifest["tensors"][0]["file"].as_str().unwrap().to_string();
    let secret = c.path("secret.npy");
    layerwise_runtime::npy::write_npy_file(&secret, &Tensor::f32(vec![1, 4], vec![123.0; 4])).unwrap();
    std::fs::remove_file(c.path("st/cand").join(&file)).unwrap();
    std::os::unix::fs::symlink(&secret, c.path("st/cand").join(&file)).unwrap();
    c.refused(
        &["bisect", &m, "--cand", &format!("npz:{}", c.p("st/cand")), "--json", &json],
        "outside the saved run's folder",
        QUICK,
    );
    // A hard link is another name of the outside file (the red team's re-run).
    std::fs::remove_file(c.path("st/cand").join(&file)).unwrap();
    std::fs::hard_link(&secret, c.path("st/cand").join(&file)).unwrap();
    c.refused(
        &["bisect", &m, "--cand", &format!("npz:{}", c.p("st/cand")), "--json", &json],
        "has 2 names (hard links)",
        QUICK,
    );
}
