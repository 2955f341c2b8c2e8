//! What this machine's CPU can do, where it changes what ONNX Runtime's CPU provider computes.

/// Whether this is an x86-64 CPU without VNNI (neither AVX-VNNI nor AVX512-VNNI), read from
/// `/proc/cpuinfo`: there ONNX Runtime's fused u8s8 integer kernels add each pair of 8-bit
/// products in 16 bits, which saturates at 32767 (a QLinearMatMul of uint8 255 by int8 127 over 8
/// values gave 131 for 259 on an AMD EPYC with AVX2 only). `false` where unknown.
pub fn x86_without_vnni() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return false };
    let Some(flags) = info.lines().find(|l| l.starts_with("flags")) else { return false };
    !flags.split_whitespace().any(|f| f == "avx512_vnni" || f == "avx_vnni")
}
