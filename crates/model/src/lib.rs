//! ONNX model I/O, the graph index and the rewrites layerwise needs: exposing intermediate tensors as
//! graph outputs and emulating FP16 storage on an FP32 runtime.
//!
//! This crate is the first stage of the data flow (model -> runtime -> analysis -> report) and
//! depends on no other layerwise crate.

#[allow(clippy::all, missing_docs, rustdoc::all)]
pub mod onnx;

pub mod arithmetic;
pub mod builder;
pub mod convert;
pub mod cuda_bf16;
pub mod engine_style;
mod error;
pub mod explorer_ids;
pub mod extract;
pub mod fp16;
pub mod functions;
mod graph;
pub mod inline;
pub mod layernorm;
pub mod matching;
mod model;
pub mod pair;
pub mod perturb;
pub mod qdq_form;
pub mod quant;
pub mod quantize;
mod rewrite;
pub mod rounding;
pub mod scratch;
pub mod slices;
pub mod tensor;
pub mod terminal_text;
pub mod unquantize;
mod weights;

pub use arithmetic::{Arithmetic, Precision, QuantFamily};
pub use error::ModelError;
pub use graph::{FreshNames, GraphIndex, NodeInfo};
pub use model::{data_type_name, data_type_size, is_external, open_regular, Model};
pub use rewrite::{emulate, emulate_reusing, emulate_tf32, expose, Emulation, RoundedWeights, Selection};
pub use rounding::Rounding;
pub use tensor::{shape_string, DType, Tensor, TensorData};
pub use weights::{
    float_weight_values, for_each_float_chunk, scan_fp16_weight_range, share_unchanged_weights, WeightRange,
};

/// ONNX `TensorProto.DataType` codes used throughout layerwise.
pub use onnx::tensor_proto::DataType;
