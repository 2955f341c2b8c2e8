//! The few CUDA runtime calls that running a TensorRT engine needs (device buffers, copies, a
//! stream), from `libcudart` loaded at run time: layerwise builds and runs without CUDA, and
//! says so when an engine must run on a machine that has none.

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::{Library, Symbol};

const HOST_TO_DEVICE: c_int = 1;
const DEVICE_TO_HOST: c_int = 2;

pub struct Cuda {
    lib: Library,
}

/// A device allocation, freed on drop.
pub struct DeviceBuffer<'a> {
    pub ptr: *mut c_void,
    pub bytes: usize,
    cuda: &'a Cuda,
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        let _ = self.cuda.call1("cudaFree", self.ptr);
    }
}

impl Cuda {
    /// Loads the CUDA runtime (CUDA 13, then 12).
    pub fn load() -> Result<Cuda, String> {
        let mut tried = Vec::new();
        for name in ["libcudart.so.13", "libcudart.so.12", "libcudart.so"] {
            // SAFETY: loading a shared library runs its initialisers; libcudart's are benign.
            match unsafe { Library::new(name) } {
                Ok(lib) => return Ok(Cuda { lib }),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(format!("the CUDA runtime could not be loaded ({})", tried.join("; ")))
    }

    fn check(&self, what: &str, code: c_int) -> Result<(), String> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString takes an error code and returns a static C string.
        let text = unsafe {
            self.lib
                .get::<unsafe extern "C" fn(c_int) -> *const c_char>(b"cudaGetErrorString\0")
                .ok()
                .map(|f| CStr::from_ptr(f(code)).to_string_lossy().to_string())
        };
        Err(format!("{what} failed: error {code} ({})", text.unwrap_or_default()))
    }

    fn call1(&self, name: &str, arg: *mut c_void) -> Result<(), String> {
        // SAFETY: every function called through here takes one pointer-sized argument.
        unsafe {
            let f: Symbol<unsafe extern "C" fn(*mut c_void) -> c_int> =
                self.lib.get(format!("{name}\0").as_bytes()).map_err(|e| format!("{name}: {e}"))?;
            self.check(name, f(arg))
        }
    }

    pub fn set_device(&self, device: i32) -> Result<(), String> {
        // SAFETY: cudaSetDevice(int).
        unsafe {
            let f: Symbol<unsafe extern "C" fn(c_int) -> c_int> =
                self.lib.get(b"cudaSetDevice\0").map_err(|e| e.to_string())?;
            self.check("cudaSetDevice", f(device))
        }
    }

    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer<'_>, String> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: cudaMalloc(void**, size_t) writes the allocation to ptr.
        unsafe {
            let f: Symbol<unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int> =
                self.lib.get(b"cudaMalloc\0").map_err(|e| e.to_string())?;
            self.check("cudaMalloc", f(&mut ptr, bytes.max(1)))?;
        }
        Ok(DeviceBuffer { ptr, bytes, cuda: self })
    }

    fn memcpy(&self, dst: *mut c_void, src: *const c_void, bytes: usize, kind: c_int) -> Result<(), String> {
        // SAFETY: cudaMemcpy(dst, src, count, kind) with buffers of at least `bytes`.
        unsafe {
            let f: Symbol<unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int> =
                self.lib.get(b"cudaMemcpy\0").map_err(|e| e.to_string())?;
            self.check("cudaMemcpy", f(dst, src, bytes, kind))
        }
    }

    pub fn upload(&self, dst: &DeviceBuffer, src: &[u8]) -> Result<(), String> {
        assert!(src.len() <= dst.bytes);
        self.memcpy(dst.ptr, src.as_ptr().cast(), src.len(), HOST_TO_DEVICE)
    }

    pub fn download(&self, src: &DeviceBuffer, dst: &mut [u8]) -> Result<(), String> {
        assert!(dst.len() <= src.bytes);
        self.memcpy(dst.as_mut_ptr().cast(), src.ptr, dst.len(), DEVICE_TO_HOST)
    }

    pub fn create_stream(&self) -> Result<*mut c_void, String> {
        let mut stream: *mut c_void = std::ptr::null_mut();
        // SAFETY: cudaStreamCreate(cudaStream_t*).
        unsafe {
            let f: Symbol<unsafe extern "C" fn(*mut *mut c_void) -> c_int> =
                self.lib.get(b"cudaStreamCreate\0").map_err(|e| e.to_string())?;
            self.check("cudaStreamCreate", f(&mut stream))?;
        }
        Ok(stream)
    }

    pub fn synchronize(&self, stream: *mut c_void) -> Result<(), String> {
        self.call1("cudaStreamSynchronize", stream)
    }

    pub fn destroy_stream(&self, stream: *mut c_void) -> Result<(), String> {
        self.call1("cudaStreamDestroy", stream)
    }
}
