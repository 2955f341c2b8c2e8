//! The integration tests, compiled into one binary: one link after a change to `src/`, and one
//! pool of test threads for all of them. The suites CI runs by name stay binaries of their own
//! (Cargo.toml's `[[test]]` list): the opt-in real-model, node-sweep, huge-model, browser and
//! Slurm suites, the tensorrt feature's, and optimized_pieces, which sets a process-wide
//! environment variable.

mod common;

mod accumulation;
mod answers;
mod architecture;
mod bisection;
mod cancellation;
mod catalogue;
mod cli;
mod control_flow;
mod device_reduction;
mod diagnoses;
mod emulations;
mod fix;
mod golden;
mod hostile_contradictions;
mod hostile_reads;
mod hostile_text;
mod hostile_writes;
mod interrupt;
mod island_edges;
mod keep_parts;
mod load_check;
mod mask_sentinels;
mod matching;
mod onnx_node_suite;
mod paired;
mod pipeline;
mod quantized;
mod quantized_deployed;
mod quantized_faults;
mod reports;
mod repro;
mod schema;
mod shards;
mod sim_quant;
mod typed_shared;
