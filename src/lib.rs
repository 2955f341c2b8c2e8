//! layerwise: find where a model's accuracy breaks between a float32 reference and a candidate
//! backend or precision. The binary (`src/main.rs`) runs [`cli`], a thin command-line layer over
//! [`pipeline::bisect`]; the work happens in the `layerwise-*` crates.

pub mod child;
pub mod cli;
pub mod data_loader;
pub mod demo;
pub mod fix;
pub mod keep;
pub mod load_check;
pub mod merge;
pub mod pipeline;
pub mod write_rule;
