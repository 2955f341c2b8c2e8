//! Where JSON reports enter: a `layerwise.report/1` or `layerwise.fix/1` document read into its
//! typed form, after checking that it is one.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::{FixReport, Report, FIX_SCHEMA, SCHEMA};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {name}: {why}")]
    Io { name: String, why: String },
    #[error("{name} is not JSON: {why}")]
    NotJson { name: String, why: String },
    #[error("{name} is not a {what} (schema {expected} expected, found {found})")]
    Schema { name: String, what: &'static str, expected: &'static str, found: String },
    #[error("{name} does not read as a {expected} document: {why}")]
    Shape { name: String, expected: &'static str, why: String },
}

/// Only the field that says what a document is.
#[derive(Deserialize)]
struct Schema {
    schema: Option<serde_json::Value>,
}

fn parse<T: DeserializeOwned>(
    text: &str,
    name: &str,
    what: &'static str,
    expected: &'static str,
) -> Result<T, ReadError> {
    let schema: Schema =
        serde_json::from_str(text).map_err(|e| ReadError::NotJson { name: name.into(), why: e.to_string() })?;
    match schema.schema {
        Some(serde_json::Value::String(s)) if s == expected => {}
        other => {
            let found = other.map_or_else(|| "none".to_string(), |v| v.to_string());
            return Err(ReadError::Schema { name: name.into(), what, expected, found });
        }
    }
    serde_json::from_str(text).map_err(|e| ReadError::Shape { name: name.into(), expected, why: e.to_string() })
}

fn read<T: DeserializeOwned>(path: &Path, what: &'static str, expected: &'static str) -> Result<T, ReadError> {
    let name = path.display().to_string();
    // A device or FIFO named as a report is refused before a byte is read.
    let mut text = String::new();
    layerwise_model::open_regular(path)
        .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
        .map_err(|e| ReadError::Io { name: name.clone(), why: e.to_string() })?;
    parse(&text, &name, what, expected)
}

/// A bisect report from JSON text; `name` is what errors call it.
pub fn parse_report(text: &str, name: &str) -> Result<Report, ReadError> {
    parse(text, name, "layerwise report", SCHEMA)
}

/// A bisect report from a file.
pub fn read_report(path: &Path) -> Result<Report, ReadError> {
    read(path, "layerwise report", SCHEMA)
}

/// A fix report from JSON text.
pub fn parse_fix_report(text: &str, name: &str) -> Result<FixReport, ReadError> {
    parse(text, name, "layerwise fix report", FIX_SCHEMA)
}

/// A fix report (`layerwise fix --json`) from a file.
pub fn read_fix_report(path: &Path) -> Result<FixReport, ReadError> {
    read(path, "layerwise fix report", FIX_SCHEMA)
}
