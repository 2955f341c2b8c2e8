//! The GPU reduction kernels (`device_stats`) compile with NVRTC: a check that needs no GPU, only
//! CUDA's run-time compiler. Opt-in (CI fetches NVRTC with pip and turns it on); the kernels' results
//! are checked against the host's metrics on a GPU by tests/device_reduction.rs.

use layerwise_runtime::device_stats::{compile_kernels, load_nvrtc};

#[test]
#[ignore = "needs NVRTC, CUDA's run-time compiler: `pip download nvidia-cuda-nvrtc`, then LAYERWISE_NVRTC=<its lib folder>/libnvrtc.so.13 (CI does this)"]
fn the_reduction_kernels_compile_with_nvrtc_for_every_gpu_generation_in_use() {
    let nvrtc = load_nvrtc().unwrap_or_else(|e| panic!("{e}"));
    // Ampere, Ada, Hopper: the generations ONNX Runtime's CUDA 13 build runs on.
    for arch in ["compute_80", "compute_89", "compute_90"] {
        let ptx = compile_kernels(&nvrtc, arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let ptx = String::from_utf8_lossy(&ptx);
        assert!(
            ptx.contains(".entry pair_totals") && ptx.contains(".entry pair_violations"),
            "{arch}: both kernels in the PTX"
        );
        assert!(ptx.contains(&format!(".target sm_{}", &arch["compute_".len()..])), "{arch}: built for it");
    }
}
