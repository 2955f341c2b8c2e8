//! Every pair of tensors reduced on the GPU where both runs left them: one fused kernel
//! reads each pair once and writes per-chunk totals, a second counts the tolerance violations
//! once the reference's range is known; only those totals come back to the host. The kernels are
//! CUDA C compiled at run time with NVRTC for the device found, and launched through the CUDA
//! driver API on the device's primary context, the one ONNX Runtime's CUDA provider runs in. Both
//! libraries are loaded at run time: layerwise builds and runs without CUDA.
//!
//! The arithmetic is `layerwise_analysis::metrics::compute`'s exact path: every element widened to
//! float64, the same rules for non-finite values and mask sentinels. Sums are folded in a fixed
//! order (per thread, per block, chunk after chunk), so a pair's totals are the same every run;
//! they differ from the host's (float32 lanes summed per block) in the last bits only.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use layerwise_model::pair::PairTotals;
use layerwise_model::tensor::shape_string;
use libloading::Library;

/// Elements per chunk: one block of the kernels each.
pub const CHUNK: usize = 1 << 16;
/// Threads per block (the kernels' shared arrays are sized for it).
const THREADS: u32 = 256;
/// Totals per chunk written by the first kernel.
const SLOTS: usize = 20;

/// The kernels. `Chunk` matches [`ChunkRow`]. Slot order matches [`fold`].
pub const KERNEL_SOURCE: &str = r#"
struct Chunk { const void* r; const void* c; long long n; long long first; int r_kind; int c_kind; double allow; double rtol; };
#define FP16_MAX 65504.0
#define FP16_MIN_NORMAL 6.103515625e-05
#define SENTINEL 1e30
__device__ __forceinline__ double value_at(const void* p, int kind, long long i) {
    if (kind == 1) {
        unsigned short h = ((const unsigned short*)p)[i];
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return (double)f;
    }
    if (kind == 2) {
        unsigned int bits = ((unsigned int)((const unsigned short*)p)[i]) << 16;
        return (double)__int_as_float((int)bits);
    }
    // Integers through float32, rounded to nearest as the host's `to_f32` rounds them.
    if (kind == 3) return (double)__ll2float_rn(((const long long*)p)[i]);
    if (kind == 4) return (double)__int2float_rn(((const int*)p)[i]);
    return (double)((const float*)p)[i];
}
extern "C" __global__ void pair_totals(const Chunk* chunks, double* out) {
    const Chunk ch = chunks[blockIdx.x];
    double v[20];
    for (int k = 0; k < 20; k++) v[k] = 0.0;
    v[5] = -1.0;
    for (long long i = threadIdx.x; i < ch.n; i += blockDim.x) {
        double r = value_at(ch.r, ch.r_kind, i), c = value_at(ch.c, ch.c_kind, i);
        v[10] += isnan(r); v[11] += isinf(r); v[12] += isnan(c); v[13] += isinf(c);
        bool rf = isfinite(r), cf = isfinite(c);
        if (rf) {
            double ra = fabs(r);
            v[8] = fmax(v[8], ra);
            if (ra > FP16_MAX) v[15] += 1.0;
            if (ra != 0.0) { v[16] += 1.0; if (ra < FP16_MIN_NORMAL) v[17] += 1.0; }
        }
        if (r == c && fabs(r) >= SENTINEL) { v[18] += 1.0; continue; }
        if (rf) v[7] = fmax(v[7], fabs(r));
        double d;
        if (rf && cf) {
            d = fabs(c - r);
            v[0] += d; v[1] += d * d; v[2] += r * r; v[3] += c * c; v[4] += r * c;
            if (r != 0.0) v[9] = fmax(v[9], d / fabs(r));
        } else if ((isnan(r) && isnan(c)) || (isinf(r) && r == c)) {
            d = 0.0;
        } else {
            v[14] += 1.0;
            d = __longlong_as_double(0x7ff0000000000000LL);
        }
        if (d > v[5]) { v[5] = d; v[6] = (double)(ch.first + i); }
    }
    __shared__ double sh[20][256];
    for (int k = 0; k < 20; k++) sh[k][threadIdx.x] = v[k];
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            int o = threadIdx.x + s;
            for (int k = 0; k < 20; k++) {
                if (k == 5 || k == 6) continue;
                double a = sh[k][threadIdx.x], b = sh[k][o];
                sh[k][threadIdx.x] = (k == 7 || k == 8 || k == 9) ? fmax(a, b) : a + b;
            }
            // The largest error, the first element on ties.
            double da = sh[5][threadIdx.x], db = sh[5][o];
            if (db > da || (db == da && db >= 0.0 && sh[6][o] < sh[6][threadIdx.x])) {
                sh[5][threadIdx.x] = db;
                sh[6][threadIdx.x] = sh[6][o];
            }
        }
        __syncthreads();
    }
    if (threadIdx.x < 20) out[blockIdx.x * 20 + threadIdx.x] = sh[threadIdx.x][0];
}
extern "C" __global__ void pair_violations(const Chunk* chunks, double* out) {
    const Chunk ch = chunks[blockIdx.x];
    double n = 0.0;
    for (long long i = threadIdx.x; i < ch.n; i += blockDim.x) {
        double r = value_at(ch.r, ch.r_kind, i), c = value_at(ch.c, ch.c_kind, i);
        if (isfinite(r) && isfinite(c) && fabs(c - r) > ch.allow + ch.rtol * fabs(r)) n += 1.0;
    }
    __shared__ double sh[256];
    sh[threadIdx.x] = n;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = sh[0];
}
"#;

/// How a side's values are stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementKind {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
    /// Integers are compared as the host compares them: each value rounded to float32 first.
    I64 = 3,
    I32 = 4,
}

/// One pair to reduce: `len` elements a side, in `blocks` equal blocks, block `b` starting
/// `b * stride` elements from that side's pointer (one block: the elements in a row; a sample of
/// a batch whose samples are not the first dimension: a block per outer index). The tolerance's
/// terms are `layerwise_analysis::Tolerance`'s.
#[derive(Debug, Clone, Copy)]
pub struct DevicePair {
    pub reference: *const c_void,
    pub candidate: *const c_void,
    pub len: usize,
    pub blocks: usize,
    pub reference_stride: usize,
    pub candidate_stride: usize,
    pub reference_kind: ElementKind,
    pub candidate_kind: ElementKind,
    pub atol: f64,
    pub rtol: f64,
    pub range_tol: f64,
}

/// Folds a pair's chunk totals (the first kernel's slots, in chunk order).
fn fold(numel: usize, chunks: &[[f64; SLOTS]]) -> PairTotals {
    {
        let mut t = PairTotals { numel, worst: -1.0, ..Default::default() };
        let count = |x: f64| x as usize;
        for s in chunks {
            t.sum_abs += s[0];
            t.sum_d2 += s[1];
            t.sum_r2 += s[2];
            t.sum_c2 += s[3];
            t.sum_rc += s[4];
            // Chunks come in element order: a later chunk takes the largest error only when larger.
            if s[5] > t.worst {
                t.worst = s[5];
                t.worst_index = count(s[6]);
            }
            t.compared_max = t.compared_max.max(s[7]);
            t.ref_max_abs = t.ref_max_abs.max(s[8]);
            t.max_rel = t.max_rel.max(s[9]);
            t.ref_nan += count(s[10]);
            t.ref_inf += count(s[11]);
            t.cand_nan += count(s[12]);
            t.cand_inf += count(s[13]);
            t.nonfinite_mismatch += count(s[14]);
            t.ref_fp16_overflow += count(s[15]);
            t.nonzero += count(s[16]);
            t.subnormal += count(s[17]);
            t.sentinels += count(s[18]);
        }
        t
    }
}

/// Where each sample's values of a tensor lie in a run of `--batch` samples at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleLayout {
    /// The samples lie along `axis`: sample `k`'s values are `outer` blocks of `block` elements,
    /// block `o` at element `(o * batch + k) * block` (axis 0: one block, the samples one after
    /// the other; PP-OCRv4's attention puts them second, after the query/key/value split).
    Split { axis: usize, outer: usize, block: usize },
    /// The same shape whatever the batch: values computed from weights or shapes alone, which
    /// every sample shares.
    Shared,
}

impl SampleLayout {
    /// The shape of one sample's values of a tensor of `batched` shape.
    pub fn per_sample(self, batched: &[usize], batch: usize) -> Vec<usize> {
        let mut shape = batched.to_vec();
        if let SampleLayout::Split { axis, .. } = self {
            shape[axis] /= batch;
        }
        shape
    }

    /// Sample `k`'s part of a tensor of `numel` elements in a batch of `batch`: (first element,
    /// blocks, elements a block, elements from one block to the next).
    pub fn part(self, k: usize, batch: usize, numel: usize) -> (usize, usize, usize, usize) {
        match self {
            SampleLayout::Split { outer, block, .. } => (k * block, outer, block, batch * block),
            SampleLayout::Shared => (0, 1, numel, numel),
        }
    }
}

/// Each tensor's layout from its shape in a run of one sample (`one`) and of `batch` samples;
/// `Err` names a tensor that fits neither (its samples are not where the batch puts them).
pub fn sample_layouts(
    one: &HashMap<String, Vec<usize>>,
    batched: &HashMap<String, Vec<usize>>,
    batch: usize,
) -> Result<HashMap<String, SampleLayout>, String> {
    let mut layouts = HashMap::new();
    for (name, b) in batched {
        let Some(o) = one.get(name) else { continue };
        let differing: Vec<usize> = (0..o.len().min(b.len())).filter(|&a| o[a] != b[a]).collect();
        let layout = if o == b {
            SampleLayout::Shared
        } else if o.len() == b.len() && differing.len() == 1 && b[differing[0]] == batch * o[differing[0]] {
            let axis = differing[0];
            SampleLayout::Split { axis, outer: o[..axis].iter().product(), block: o[axis..].iter().product() }
        } else {
            return Err(format!("tensor '{name}' is [{}] for one sample and [{}] for {batch}, which does not hold each sample's values along one dimension", shape_string(o), shape_string(b)));
        };
        layouts.insert(name.clone(), layout);
    }
    Ok(layouts)
}

/// The kernel's view of one chunk (`struct Chunk` in [`KERNEL_SOURCE`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct ChunkRow {
    reference: u64,
    candidate: u64,
    len: i64,
    /// The chunk's first element in its pair.
    first: i64,
    reference_kind: i32,
    candidate_kind: i32,
    allow: f64,
    rtol: f64,
}

type CuResult = c_int;

/// The CUDA driver and NVRTC, the module built from [`KERNEL_SOURCE`] and its two kernels.
pub struct DeviceReducer {
    driver: Library,
    context: *mut c_void,
    totals_kernel: *mut c_void,
    violations_kernel: *mut c_void,
    /// The chunk table, the totals and the violation counts: (device address, bytes), kept from
    /// one reduction to the next and grown when a larger one comes (an allocation and a free each
    /// time cost a device-wide wait each, every batch).
    scratch: [(u64, usize); 3],
}

// SAFETY: the handles are the driver's, usable from any thread once the context is made current
// there (each call does); calls are serialised by `&mut self` where they launch.
unsafe impl Send for DeviceReducer {}

fn load_first(names: &[&str]) -> Result<Library, String> {
    let mut tried = Vec::new();
    for name in names {
        // SAFETY: loading a shared library runs its initialisers; the CUDA driver's and NVRTC's are benign.
        match unsafe { Library::new(*name) } {
            Ok(lib) => return Ok(lib),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(tried.join("; "))
}

/// NVRTC from CUDA 13 or 12 (the `nvidia` Python packages PyTorch installs hold it; their `lib`
/// folder goes on `LD_LIBRARY_PATH`), or where `LAYERWISE_NVRTC` points.
pub fn load_nvrtc() -> Result<Library, String> {
    let own = std::env::var("LAYERWISE_NVRTC").ok();
    let mut names: Vec<&str> = own.iter().map(String::as_str).collect();
    names.extend(["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]);
    load_first(&names).map_err(|e| format!("NVRTC (CUDA's run-time compiler) could not be loaded ({e}); it comes with the CUDA toolkit or `pip install nvidia-cuda-nvrtc`: put its lib folder on LD_LIBRARY_PATH or name the library in LAYERWISE_NVRTC"))
}

/// Compiles [`KERNEL_SOURCE`] to PTX for `arch` (`compute_90`). Needs only NVRTC, no GPU.
pub fn compile_kernels(nvrtc: &Library, arch: &str) -> Result<Vec<u8>, String> {
    type Create = unsafe extern "C" fn(
        *mut *mut c_void,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int;
    type Compile = unsafe extern "C" fn(*mut c_void, c_int, *const *const c_char) -> c_int;
    type Size = unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int;
    type Get = unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int;
    type Destroy = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
    let sym = |name: &[u8]| -> Result<*const c_void, String> {
        // SAFETY: the symbol is looked up by name; its type is given where it is called.
        unsafe { nvrtc.get::<*const c_void>(name).map(|s| *s).map_err(|e| format!("NVRTC: {e}")) }
    };
    let source = CString::new(KERNEL_SOURCE).expect("no NUL in the source");
    let option = CString::new(format!("--gpu-architecture={arch}")).map_err(|e| e.to_string())?;
    // SAFETY: NVRTC's documented C API, called with valid pointers; the program is destroyed below.
    unsafe {
        let create: Create = std::mem::transmute(sym(b"nvrtcCreateProgram\0")?);
        let compile: Compile = std::mem::transmute(sym(b"nvrtcCompileProgram\0")?);
        let ptx_size: Size = std::mem::transmute(sym(b"nvrtcGetPTXSize\0")?);
        let get_ptx: Get = std::mem::transmute(sym(b"nvrtcGetPTX\0")?);
        let log_size: Size = std::mem::transmute(sym(b"nvrtcGetProgramLogSize\0")?);
        let get_log: Get = std::mem::transmute(sym(b"nvrtcGetProgramLog\0")?);
        let destroy: Destroy = std::mem::transmute(sym(b"nvrtcDestroyProgram\0")?);
        let mut program = std::ptr::null_mut();
        let code = create(
            &mut program,
            source.as_ptr(),
            c"layerwise_pairs.cu".as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if code != 0 {
            return Err(format!("nvrtcCreateProgram failed: {code}"));
        }
        let options = [option.as_ptr()];
        let code = compile(program, 1, options.as_ptr());
        let result = if code != 0 {
            let mut size = 0usize;
            log_size(program, &mut size);
            let mut log = vec![0 as c_char; size.max(1)];
            get_log(program, log.as_mut_ptr());
            Err(format!(
                "NVRTC could not compile the reduction kernels ({code}): {}",
                CStr::from_ptr(log.as_ptr()).to_string_lossy()
            ))
        } else {
            let mut size = 0usize;
            ptx_size(program, &mut size);
            let mut ptx = vec![0u8; size.max(1)];
            get_ptx(program, ptx.as_mut_ptr().cast());
            Ok(ptx)
        };
        destroy(&mut program);
        result
    }
}

impl DeviceReducer {
    /// The kernels built for GPU `device` (as CUDA numbers it), in its primary context.
    pub fn new(device: u32) -> Result<DeviceReducer, String> {
        let driver = load_first(&["libcuda.so.1", "libcuda.so"])
            .map_err(|e| format!("the CUDA driver could not be loaded ({e})"))?;
        let nvrtc = load_nvrtc()?;
        let mut reducer = DeviceReducer {
            driver,
            context: std::ptr::null_mut(),
            totals_kernel: std::ptr::null_mut(),
            violations_kernel: std::ptr::null_mut(),
            scratch: [(0, 0); 3],
        };
        // SAFETY: the driver API's documented entry points, with out-pointers to locals.
        unsafe {
            reducer.call("cuInit", |f: unsafe extern "C" fn(c_uint) -> CuResult| f(0))?;
            let mut dev: c_int = 0;
            reducer.call("cuDeviceGet", |f: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult| {
                f(&mut dev, device as c_int)
            })?;
            let (mut major, mut minor): (c_int, c_int) = (0, 0);
            // 75, 76: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _MINOR.
            reducer.call("cuDeviceGetAttribute", |f: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult| {
                f(&mut major, 75, dev)
            })?;
            reducer.call("cuDeviceGetAttribute", |f: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult| {
                f(&mut minor, 76, dev)
            })?;
            let mut context = std::ptr::null_mut();
            reducer
                .call("cuDevicePrimaryCtxRetain", |f: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult| {
                    f(&mut context, dev)
                })?;
            reducer.context = context;
            reducer.make_current()?;
            let ptx = compile_kernels(&nvrtc, &format!("compute_{major}{minor}"))?;
            let mut module = std::ptr::null_mut();
            reducer.call(
                "cuModuleLoadData",
                |f: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CuResult| {
                    f(&mut module, ptx.as_ptr().cast())
                },
            )?;
            let mut functions = [std::ptr::null_mut(); 2];
            for (name, function) in [c"pair_totals", c"pair_violations"].into_iter().zip(&mut functions) {
                reducer.call(
                    "cuModuleGetFunction",
                    |f: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> CuResult| {
                        f(function, module, name.as_ptr())
                    },
                )?;
            }
            [reducer.totals_kernel, reducer.violations_kernel] = functions;
        }
        Ok(reducer)
    }

    /// Calls the driver's `name` through `call`, turning a non-zero result into its error text.
    ///
    /// # Safety
    /// `F` must be the C signature of `name`.
    unsafe fn call<F: Copy>(&self, name: &str, call: impl FnOnce(F) -> CuResult) -> Result<(), String> {
        let symbol = CString::new(name).expect("no NUL in a name");
        let f: F = *self.driver.get::<F>(symbol.as_bytes_with_nul()).map_err(|e| format!("CUDA driver: {e}"))?;
        let code = call(f);
        if code == 0 {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        if let Ok(describe) =
            self.driver.get::<unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult>(b"cuGetErrorString\0")
        {
            describe(code, &mut text);
        }
        let text = if text.is_null() { String::new() } else { CStr::from_ptr(text).to_string_lossy().to_string() };
        Err(format!("{name} failed: error {code} ({text})"))
    }

    fn make_current(&self) -> Result<(), String> {
        // SAFETY: cuCtxSetCurrent(CUcontext) with the retained primary context.
        unsafe { self.call("cuCtxSetCurrent", |f: unsafe extern "C" fn(*mut c_void) -> CuResult| f(self.context)) }
    }

    /// A device buffer of `bytes`, freed by [`DeviceReducer::free`].
    fn alloc(&self, bytes: usize) -> Result<u64, String> {
        let mut ptr = 0u64;
        // SAFETY: cuMemAlloc_v2(CUdeviceptr*, size_t).
        unsafe {
            self.call("cuMemAlloc_v2", |f: unsafe extern "C" fn(*mut u64, usize) -> CuResult| {
                f(&mut ptr, bytes.max(8))
            })?
        };
        Ok(ptr)
    }

    fn free(&self, ptr: u64) {
        // SAFETY: cuMemFree_v2(CUdeviceptr) of a buffer this reducer allocated.
        let _ = unsafe { self.call("cuMemFree_v2", |f: unsafe extern "C" fn(u64) -> CuResult| f(ptr)) };
    }

    fn to_device<T: Copy>(&self, dst: u64, values: &[T]) -> Result<(), String> {
        // SAFETY: cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t) from a live slice into a buffer
        // at least as large.
        unsafe {
            self.call("cuMemcpyHtoD_v2", |f: unsafe extern "C" fn(u64, *const c_void, usize) -> CuResult| {
                f(dst, values.as_ptr().cast(), std::mem::size_of_val(values))
            })
        }
    }

    fn to_host<T: Copy>(&self, values: &mut [T], src: u64) -> Result<(), String> {
        // SAFETY: cuMemcpyDtoH_v2(void*, CUdeviceptr, size_t) into a live slice from a buffer at least as large.
        unsafe {
            self.call("cuMemcpyDtoH_v2", |f: unsafe extern "C" fn(*mut c_void, u64, usize) -> CuResult| {
                f(values.as_mut_ptr().cast(), src, std::mem::size_of_val(values))
            })
        }
    }

    fn launch(&self, kernel: *mut c_void, blocks: usize, table: u64, out: u64) -> Result<(), String> {
        let (mut table, mut out) = (table, out);
        let mut params = [(&mut table as *mut u64).cast::<c_void>(), (&mut out as *mut u64).cast::<c_void>()];
        type Launch = unsafe extern "C" fn(
            *mut c_void,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> CuResult;
        // SAFETY: cuLaunchKernel with the two pointer parameters the kernels take, on the default stream.
        unsafe {
            self.call("cuLaunchKernel", |f: Launch| {
                f(
                    kernel,
                    blocks as c_uint,
                    1,
                    1,
                    THREADS,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })
        }
    }

    /// `values` copied to a new device buffer (freed by [`DeviceReducer::release`]): for checks
    /// that reduce host data on the device.
    pub fn upload<T: Copy>(&mut self, values: &[T]) -> Result<u64, String> {
        self.make_current()?;
        let ptr = self.alloc(std::mem::size_of_val(values))?;
        self.to_device(ptr, values).inspect_err(|_| self.free(ptr))?;
        Ok(ptr)
    }

    /// `bytes` bytes at device address `ptr`, copied to the host.
    pub fn download(&mut self, ptr: *const c_void, bytes: usize) -> Result<Vec<u8>, String> {
        self.make_current()?;
        let mut host = vec![0u8; bytes];
        if bytes > 0 {
            self.to_host(&mut host, ptr as u64)?;
        }
        Ok(host)
    }

    /// Frees a buffer of [`DeviceReducer::upload`].
    pub fn release(&mut self, ptr: u64) {
        self.free(ptr);
    }

    /// The totals of every pair, in order. The pairs' buffers must stay alive and unchanged until
    /// this returns (it waits for the kernels).
    pub fn reduce(&mut self, pairs: &[DevicePair]) -> Result<Vec<PairTotals>, String> {
        self.make_current()?;
        let mut rows: Vec<ChunkRow> = Vec::new();
        let mut spans = Vec::with_capacity(pairs.len());
        for p in pairs {
            let start = rows.len();
            let (rs, cs) = (element_bytes(p.reference_kind), element_bytes(p.candidate_kind));
            let blocks = p.blocks.max(1);
            if p.len % blocks != 0 {
                return Err(format!("a pair of {} elements does not split into {blocks} blocks", p.len));
            }
            let block = p.len / blocks;
            for b in 0..blocks {
                for first in (0..block).step_by(CHUNK) {
                    rows.push(ChunkRow {
                        reference: p.reference as u64 + ((b * p.reference_stride + first) * rs) as u64,
                        candidate: p.candidate as u64 + ((b * p.candidate_stride + first) * cs) as u64,
                        len: CHUNK.min(block - first) as i64,
                        first: (b * block + first) as i64,
                        reference_kind: p.reference_kind as i32,
                        candidate_kind: p.candidate_kind as i32,
                        allow: 0.0,
                        rtol: p.rtol,
                    });
                }
            }
            spans.push(start..rows.len());
        }
        if rows.is_empty() {
            return Ok(pairs.iter().map(|p| PairTotals { numel: p.len, worst: -1.0, ..Default::default() }).collect());
        }
        let started = std::time::Instant::now();
        let mut buffers = [0u64; 3];
        for (k, bytes) in
            [std::mem::size_of_val(rows.as_slice()), rows.len() * SLOTS * 8, rows.len() * 8].into_iter().enumerate()
        {
            buffers[k] = self.scratch_of(k, bytes)?;
        }
        let [table, totals, counts] = buffers;
        self.to_device(table, &rows)?;
        self.launch(self.totals_kernel, rows.len(), table, totals)?;
        let mut partial = vec![[0f64; SLOTS]; rows.len()];
        self.to_host(&mut partial, totals)?;
        let mut folded: Vec<PairTotals> =
            pairs.iter().zip(&spans).map(|(p, span)| fold(p.len, &partial[span.clone()])).collect();
        // The allowance needs the pair's range, known only now (`Tolerance`'s rule).
        for ((p, span), t) in pairs.iter().zip(&spans).zip(&folded) {
            let range = if t.sentinels > 0 { t.compared_max } else { t.ref_max_abs };
            for row in &mut rows[span.clone()] {
                row.allow = p.atol + p.range_tol * range;
            }
        }
        self.to_device(table, &rows)?;
        self.launch(self.violations_kernel, rows.len(), table, counts)?;
        let mut violations = vec![0f64; rows.len()];
        self.to_host(&mut violations, counts)?;
        for (t, span) in folded.iter_mut().zip(&spans) {
            t.finite_violations = violations[span.clone()].iter().map(|&v| v as usize).sum();
        }
        crate::timing_mark(|| {
            format!(
                "GPU reduction of {} pairs in {} chunks: {:.2} ms",
                pairs.len(),
                rows.len(),
                1e3 * started.elapsed().as_secs_f64()
            )
        });
        Ok(folded)
    }

    /// Scratch buffer `k`, at least `bytes` long (grown by half again when it must grow).
    fn scratch_of(&mut self, k: usize, bytes: usize) -> Result<u64, String> {
        let (ptr, capacity) = self.scratch[k];
        if capacity >= bytes {
            return Ok(ptr);
        }
        if capacity > 0 {
            self.free(ptr);
            self.scratch[k] = (0, 0);
        }
        let capacity = bytes + bytes / 2;
        let ptr = self.alloc(capacity)?;
        self.scratch[k] = (ptr, capacity);
        Ok(ptr)
    }
}

impl Drop for DeviceReducer {
    fn drop(&mut self) {
        // The module goes with the context's last release; the primary context is ONNX Runtime's too,
        // so only this reducer's hold on it is released.
        if self.make_current().is_ok() {
            for (ptr, capacity) in self.scratch {
                if capacity > 0 {
                    self.free(ptr);
                }
            }
        }
        // SAFETY: cuDevicePrimaryCtxRelease(CUdevice) for the device retained in `new`.
        unsafe {
            let mut dev: c_int = 0;
            if self.call("cuCtxGetDevice", |f: unsafe extern "C" fn(*mut c_int) -> CuResult| f(&mut dev)).is_ok() {
                let _ = self.call("cuDevicePrimaryCtxRelease_v2", |f: unsafe extern "C" fn(c_int) -> CuResult| f(dev));
            }
        }
    }
}

fn element_bytes(kind: ElementKind) -> usize {
    match kind {
        ElementKind::I64 => 8,
        ElementKind::F32 | ElementKind::I32 => 4,
        ElementKind::F16 | ElementKind::Bf16 => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chunk_row_is_the_kernels_struct() {
        // long long x4 (pointers as 8 bytes), int x2, double x2.
        assert_eq!(std::mem::size_of::<ChunkRow>(), 8 * 4 + 4 * 2 + 8 * 2);
        assert!(KERNEL_SOURCE.contains("struct Chunk { const void* r; const void* c; long long n; long long first; int r_kind; int c_kind; double allow; double rtol; };"));
    }

    fn shapes(list: &[(&str, &[usize])]) -> HashMap<String, Vec<usize>> {
        list.iter().map(|(n, s)| (n.to_string(), s.to_vec())).collect()
    }

    #[test]
    fn a_tensor_holds_its_samples_along_one_dimension_or_is_shared() {
        let one = shapes(&[("conv", &[1, 8, 4, 4]), ("rows", &[3, 16]), ("weights", &[16, 16]), ("shape", &[4])]);
        let batched = shapes(&[("conv", &[4, 8, 4, 4]), ("rows", &[12, 16]), ("weights", &[16, 16]), ("shape", &[4])]);
        let layouts = sample_layouts(&one, &batched, 4).unwrap();
        assert_eq!(layouts["conv"], SampleLayout::Split { axis: 0, outer: 1, block: 128 });
        assert_eq!(
            layouts["rows"],
            SampleLayout::Split { axis: 0, outer: 1, block: 48 },
            "a first dimension that folds the batch in"
        );
        assert_eq!(layouts["weights"], SampleLayout::Shared);
        assert_eq!(layouts["shape"], SampleLayout::Shared);
        // Time-major, or attention's query/key/value first: the samples lie along the second axis.
        let layouts =
            sample_layouts(&shapes(&[("qkv", &[3, 1, 8, 40, 15])]), &shapes(&[("qkv", &[3, 4, 8, 40, 15])]), 4)
                .unwrap();
        let qkv = layouts["qkv"];
        assert_eq!(qkv, SampleLayout::Split { axis: 1, outer: 3, block: 4800 });
        assert_eq!(qkv.per_sample(&[3, 4, 8, 40, 15], 4), vec![3, 1, 8, 40, 15]);
        assert_eq!(
            qkv.part(2, 4, 3 * 4 * 4800),
            (2 * 4800, 3, 4800, 4 * 4800),
            "sample 2: its block in each of the 3 outer rows"
        );
        // Two axes changed: no sample lies in one place.
        let err = sample_layouts(&shapes(&[("m", &[2, 3])]), &shapes(&[("m", &[8, 6])]), 4).unwrap_err();
        assert!(err.contains("tensor 'm' is [2x3] for one sample and [8x6] for 4"), "{err}");
    }

    #[test]
    fn chunks_fold_in_order_keeping_the_first_largest_error() {
        let mut a = [0f64; SLOTS];
        let mut b = [0f64; SLOTS];
        (a[0], a[5], a[6], a[8], a[16]) = (1.5, 2.0, 7.0, 3.0, 4.0);
        (b[0], b[5], b[6], b[8], b[16]) = (0.5, 2.0, 70_000.0, 5.0, 1.0);
        let t = fold(100_000, &[a, b]);
        assert_eq!((t.sum_abs, t.worst, t.worst_index, t.ref_max_abs, t.nonzero), (2.0, 2.0, 7, 5.0, 5));
        b[5] = 2.5;
        assert_eq!(fold(100_000, &[a, b]).worst_index, 70_000);
    }
}
