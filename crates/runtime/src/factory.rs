//! Creates the backend a parsed spec names.

use crate::backend::Backend;
use crate::spec::BackendSpec;
use crate::RuntimeError;

/// Creates the backend `spec` names. GPU backends need ONNX Runtime's GPU build.
pub fn create_backend(spec: &BackendSpec) -> Result<Box<dyn Backend>, RuntimeError> {
    if spec.ort_gpu() {
        crate::ortlib::require_gpu_build()?;
    }
    Ok(match spec {
        BackendSpec::Ort(options) => Box::new(crate::ort_backend::OrtBackend::new(spec, options.clone(), None)),
        BackendSpec::Sim { rounding, trt_style, options } => {
            let mut backend = crate::ort_backend::OrtBackend::new(spec, options.clone(), Some(*rounding));
            backend.trt_style = *trt_style;
            Box::new(backend)
        }
        // The Q/DQ model the pipeline wrote runs on ONNX Runtime's CPU provider as any Q/DQ model.
        BackendSpec::Quantized { options, .. } => Box::new(crate::ort_backend::OrtBackend::new(spec, options.clone(), None)),
        BackendSpec::Saved(path) => Box::new(crate::saved::SavedBackend::open(spec, path)?),
        #[cfg(feature = "tensorrt")]
        BackendSpec::Trt { tf32, opt_level, workspace_mib } => {
            Box::new(crate::trt::TrtBackend::new(spec, crate::trt::TrtOptions { tf32: *tf32, opt_level: *opt_level, workspace_mib: *workspace_mib }))
        }
        #[cfg(not(feature = "tensorrt"))]
        BackendSpec::Trt { .. } => {
            return Err(RuntimeError::BadSpec {
                spec: spec.to_string(),
                why: "this layerwise was built without native TensorRT; rebuild with `--features tensorrt` (docs/tensorrt.md)".into(),
            })
        }
    })
}
