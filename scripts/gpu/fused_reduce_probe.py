"""Issue 41 probe, second design: both programs on the GPU in their own CUDA sessions (TF32 off for
the float32 reference), every tensor an output left on the device (IOBinding), and every pair of
tensors reduced by one fused kernel (CUDA C compiled at run time with NVRTC, launched through the
driver API on the sessions' own context) that reads each pair once and writes only per-chunk
statistics; a second kernel counts the tolerance violations once max|r| is known. Only the
statistics come back to the host. Not layerwise itself: a prototype, to learn whether this design
reaches "each sample within 2x of one plain candidate run" without batching.

Rows (medians of --runs after 3 warm-ups, per sample = run / batch):
  plain         the candidate file alone, its own outputs, a plain `run` (the issue's yardstick)
  ref-dev       the float32 file, every tensor an output kept on the device (the run and the
                Python wrappers of its outputs; ref-run: the run alone)
  cand-dev      the candidate file likewise (cand-run: the run alone)
  sample        ref-dev + cand-dev + kernels (the whole cost but the table's Python bookkeeping)
  kernels       the chunk table copied in, both kernels, the statistics copied back and folded
  table-python  building the chunk table from the outputs in Python (not in `sample`: a loop over
                the pairs that a compiled caller does in microseconds)

The statistics of the first run are checked against numpy on the host (every pair copied out):
max |d| and max |r| must agree exactly, the f64 sums to 1e-9 relative, the violation counts exactly.

usage: python3 fused_reduce_probe.py REF.onnx CAND_FP16.onnx [--batches 1,8] [--runs 30]
Prints one JSON line per row and one for the check.
"""
import argparse
import ctypes
import glob
import json
import os
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort

parser = argparse.ArgumentParser()
parser.add_argument("ref")
parser.add_argument("cand")
parser.add_argument("--batches", default="1,8")
parser.add_argument("--runs", type=int, default=30)
parser.add_argument("--shape", default="B,3,48,320", help="the input's shape, B the batch")
args = parser.parse_args()

ATOL, RTOL, RANGE_TOL = 1e-4, 1e-2, 1e-2  # layerwise's FP16 defaults
CHUNK = 1 << 16

KERNELS = r"""
struct Chunk { const float* r; const void* c; long long n; int half; int pad; double allow; double rtol; };
__device__ __forceinline__ float cand_at(const Chunk& ch, long long i) {
    if (ch.half) {
        unsigned short h = ((const unsigned short*)ch.c)[i];
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    return ((const float*)ch.c)[i];
}
// Per chunk: sum|d|, sum d^2, sum r^2, sum c^2, sum r*c, max|d|, max|r| over finite pairs, and the
// non-finite elements, in f64, reduced in a fixed order (deterministic).
extern "C" __global__ void stats(const Chunk* chunks, double* out) {
    const Chunk ch = chunks[blockIdx.x];
    double v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (long long i = threadIdx.x; i < ch.n; i += blockDim.x) {
        double r = ch.r[i], c = cand_at(ch, i);
        if (isfinite(r) && isfinite(c)) {
            double d = fabs(c - r);
            v[0] += d; v[1] += d * d; v[2] += r * r; v[3] += c * c; v[4] += r * c;
            v[5] = fmax(v[5], d); v[6] = fmax(v[6], fabs(r));
        } else {
            v[7] += 1.0;
        }
    }
    __shared__ double sh[8][256];
    for (int k = 0; k < 8; k++) sh[k][threadIdx.x] = v[k];
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            for (int k = 0; k < 8; k++) {
                double a = sh[k][threadIdx.x], b = sh[k][threadIdx.x + s];
                sh[k][threadIdx.x] = (k == 5 || k == 6) ? fmax(a, b) : a + b;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x < 8) out[blockIdx.x * 8 + threadIdx.x] = sh[threadIdx.x][0];
}
// Per chunk: elements outside allow + rtol*|r| (finite pairs).
extern "C" __global__ void violations(const Chunk* chunks, double* out) {
    const Chunk ch = chunks[blockIdx.x];
    double n = 0;
    for (long long i = threadIdx.x; i < ch.n; i += blockDim.x) {
        double r = ch.r[i], c = cand_at(ch, i);
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
"""
CHUNK_DTYPE = np.dtype([("r", "<u8"), ("c", "<u8"), ("n", "<i8"), ("half", "<i4"), ("pad", "<i4"), ("allow", "<f8"), ("rtol", "<f8")])


def find_lib(pattern):
    import nvidia

    for root in nvidia.__path__:
        hits = sorted(glob.glob(os.path.join(root, "**", pattern), recursive=True))
        if hits:
            return hits[-1]
    raise SystemExit(f"no {pattern} under the nvidia package")


nvrtc = ctypes.CDLL(find_lib("libnvrtc.so*[0-9]"))
cu = ctypes.CDLL("libcuda.so.1")


def check(code, what):
    if code != 0:
        raise SystemExit(f"{what} failed: {code}")


def compile_kernels():
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(cu.cuDeviceGetAttribute(ctypes.byref(major), 75, 0), "cuDeviceGetAttribute")
    check(cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, 0), "cuDeviceGetAttribute")
    prog = ctypes.c_void_p()
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), KERNELS.encode(), b"reduce.cu", 0, None, None), "nvrtcCreateProgram")
    opts = [f"--gpu-architecture=compute_{major.value}{minor.value}".encode()]
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    if rc != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise SystemExit("nvrtc: " + log.value.decode())
    size = ctypes.c_size_t()
    check(nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
    ptx = ctypes.create_string_buffer(size.value)
    check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    module = ctypes.c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(module), ptx), "cuModuleLoadData")
    fns = {}
    for name in (b"stats", b"violations"):
        f = ctypes.c_void_p()
        check(cu.cuModuleGetFunction(ctypes.byref(f), module, name), "cuModuleGetFunction")
        fns[name.decode()] = f
    return fns


class DeviceBuffer:
    def __init__(self, nbytes):
        self.ptr = ctypes.c_uint64()
        self.nbytes = nbytes
        check(cu.cuMemAlloc_v2(ctypes.byref(self.ptr), ctypes.c_size_t(max(nbytes, 1))), "cuMemAlloc")


def launch(fn, blocks, *ptrs):
    params = (ctypes.c_void_p * len(ptrs))(*[ctypes.addressof(p) for p in ptrs])
    check(cu.cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, None, params, None), "cuLaunchKernel")


def every_tensor(path):
    m = onnx.load(path)
    listed = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in listed:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                listed.add(o)
    return m.SerializeToString()


def session(model, tf32_off):
    so = ort.SessionOptions()
    opts = {"device_id": "0"}
    if tf32_off:
        opts["use_tf32"] = "0"
    return ort.InferenceSession(model, so, providers=[("CUDAExecutionProvider", opts)])


ref_s = session(every_tensor(args.ref), True)
cand_s = session(every_tensor(args.cand), False)
plain_s = session(args.cand, False)
ref_names = [o.name for o in ref_s.get_outputs()]
cand_names = [o.name for o in cand_s.get_outputs()]
input_name = ref_s.get_inputs()[0].name
check(cu.cuInit(0), "cuInit")
fns = None


def binding(s, names, feed):
    """Bound once per batch: the input from the host, every output to the device (ONNX Runtime
    allocates them at each run)."""
    io = s.io_binding()
    io.bind_cpu_input(input_name, feed)
    for n in names:
        io.bind_output(n, "cuda", 0)
    return io


def run_dev(s, io, names, spent):
    t = time.perf_counter()
    s.run_with_iobinding(io)
    spent.append(time.perf_counter() - t)
    return dict(zip(names, io.get_outputs()))


def chunk_table(ref_out, cand_out):
    """Pairs (name, numel, half) and the chunk rows, in pair order."""
    pairs, rows = [], []
    for name, rv in ref_out.items():
        cv = cand_out.get(name)
        if cv is None or rv.data_type() != "tensor(float)" or cv.data_type() not in ("tensor(float)", "tensor(float16)"):
            continue
        n = int(np.prod(rv.shape()))
        if n == 0 or n != int(np.prod(cv.shape())):
            continue
        half = cv.data_type() == "tensor(float16)"
        first = len(rows)
        for start in range(0, n, CHUNK):
            rows.append((rv.data_ptr() + 4 * start, cv.data_ptr() + (2 if half else 4) * start, min(CHUNK, n - start), int(half), 0, 0.0, RTOL))
        pairs.append((name, n, half, first, len(rows)))
    return pairs, np.array(rows, dtype=CHUNK_DTYPE)


def reduce_on_device(pairs, rows):
    table = DeviceBuffer(rows.nbytes)
    stats = DeviceBuffer(rows.size * 8 * 8)
    viol = DeviceBuffer(rows.size * 8)
    check(cu.cuMemcpyHtoD_v2(table.ptr, ctypes.c_void_p(rows.ctypes.data), ctypes.c_size_t(rows.nbytes)), "cuMemcpyHtoD")
    launch(fns["stats"], rows.size, table.ptr, stats.ptr)
    partial = np.empty((rows.size, 8), np.float64)
    check(cu.cuMemcpyDtoH_v2(ctypes.c_void_p(partial.ctypes.data), stats.ptr, ctypes.c_size_t(partial.nbytes)), "cuMemcpyDtoH")
    starts = np.array([p[3] for p in pairs])
    sums = np.add.reduceat(partial[:, [0, 1, 2, 3, 4, 7]], starts, axis=0)
    maxes = np.maximum.reduceat(partial[:, [5, 6]], starts, axis=0)
    # The allowance needs max|r| of the whole tensor: written into the table, then the second pass.
    per_row = np.repeat(ATOL + RANGE_TOL * maxes[:, 1], [p[4] - p[3] for p in pairs])
    rows["allow"] = per_row
    check(cu.cuMemcpyHtoD_v2(table.ptr, ctypes.c_void_p(rows.ctypes.data), ctypes.c_size_t(rows.nbytes)), "cuMemcpyHtoD")
    launch(fns["violations"], rows.size, table.ptr, viol.ptr)
    counts = np.empty(rows.size, np.float64)
    check(cu.cuMemcpyDtoH_v2(ctypes.c_void_p(counts.ctypes.data), viol.ptr, ctypes.c_size_t(counts.nbytes)), "cuMemcpyDtoH")
    for b in (table, stats, viol):
        cu.cuMemFree_v2(b.ptr)
    return pairs, sums, maxes, np.add.reduceat(counts, starts)


def to_host(ov):
    a = np.empty(ov.shape(), np.float16 if ov.data_type() == "tensor(float16)" else np.float32)
    check(cu.cuMemcpyDtoH_v2(ctypes.c_void_p(a.ctypes.data), ctypes.c_uint64(ov.data_ptr()), ctypes.c_size_t(a.nbytes)), "cuMemcpyDtoH")
    return a


def host_check(pairs, sums, maxes, viols, ref_out, cand_out):
    worst = {"max_equal": True, "sum_rel": 0.0, "viol_equal": True}
    for k, (name, n, half, _, _) in enumerate(pairs):
        r = to_host(ref_out[name]).astype(np.float64).ravel()
        c = to_host(cand_out[name]).astype(np.float64).ravel()
        ok = np.isfinite(r) & np.isfinite(c)
        r, c = r[ok], c[ok]
        d = np.abs(c - r)
        host = [d.sum(), (d * d).sum(), (r * r).sum(), (c * c).sum(), (r * c).sum()]
        for h, g in zip(host, sums[k][:5]):
            if h != 0:
                worst["sum_rel"] = max(worst["sum_rel"], abs(g - h) / abs(h))
        mx = [d.max() if d.size else 0.0, np.abs(r).max() if r.size else 0.0]
        worst["max_equal"] &= bool(mx[0] == maxes[k][0] and mx[1] == maxes[k][1])
        allow = ATOL + RANGE_TOL * maxes[k][1]
        worst["viol_equal"] &= bool((d > allow + RTOL * np.abs(r)).sum() == viols[k])
    return worst


def median_ms(xs):
    return round(1000 * statistics.median(xs), 3)


plain_batch1 = None
for batch in [int(b) for b in args.batches.split(",")]:
    shape = [batch if d == "B" else int(d) for d in args.shape.split(",")]
    rng = np.random.default_rng(batch)
    feed = rng.random(shape, dtype=np.float32)
    times = {"plain": [], "ref-dev": [], "cand-dev": [], "sample": [], "kernels": [], "table-python": [], "ref-run": [], "cand-run": []}
    ref_run, cand_run = [], []
    io_r, io_c = binding(ref_s, ref_names, feed), binding(cand_s, cand_names, feed)
    for it in range(3 + args.runs):
        t0 = time.perf_counter()
        plain_s.run(None, {input_name: feed})
        t1 = time.perf_counter()
        ref_out = run_dev(ref_s, io_r, ref_names, ref_run)
        t2 = time.perf_counter()
        cand_out = run_dev(cand_s, io_c, cand_names, cand_run)
        t3 = time.perf_counter()
        if fns is None:
            # The sessions' context (the primary one) exists now: the module goes into it.
            ctx = ctypes.c_void_p()
            check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
            check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            fns = compile_kernels()
        t4 = time.perf_counter()
        # Python-side bookkeeping a compiled caller would do in microseconds: timed on its own.
        pairs, rows = chunk_table(ref_out, cand_out)
        t4b = time.perf_counter()
        pairs, sums, maxes, viols = reduce_on_device(pairs, rows)
        t5 = time.perf_counter()
        if it == 0 and batch == 1:
            print(json.dumps({"check": host_check(pairs, sums, maxes, viols, ref_out, cand_out), "pairs": len(pairs),
                              "values_a_side": int(sum(p[1] for p in pairs)), "chunks": int(sum(p[4] - p[3] for p in pairs))}), flush=True)
        if it >= 3:
            times["plain"].append(t1 - t0)
            times["ref-dev"].append(t2 - t1)
            times["cand-dev"].append(t3 - t2)
            times["table-python"].append(t4b - t4)
            times["kernels"].append(t5 - t4b)
            times["sample"].append((t3 - t1) + (t5 - t4b))
        del ref_out, cand_out
    del io_r, io_c
    times["ref-run"], times["cand-run"] = ref_run[3:], cand_run[3:]
    row = {k: median_ms(v) for k, v in times.items()}
    row["batch"] = batch
    row["per_sample_ms"] = round(row["sample"] / batch, 3)
    row["plain_per_sample_ms"] = round(row["plain"] / batch, 3)
    if batch == 1:
        plain_batch1 = row["plain"]
    row["per_sample_to_plain_batch1"] = round(row["per_sample_ms"] / plain_batch1, 2)
    print(json.dumps(row), flush=True)
