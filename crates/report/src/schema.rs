//! The JSON Schemas of the two documents, derived from their types: what `serde` writes is what
//! the schema says. Published as docs/schema/*.schema.json (tests/schema.rs keeps those files equal
//! to these and validates real reports against them).

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;

use crate::{FixReport, Report, FIX_SCHEMA, SCHEMA};

/// The schema of a `layerwise.report/1` document (`bisect --json`, `merge`).
pub fn report_schema() -> serde_json::Value {
    schema_of::<Report>(
        SCHEMA,
        "A layerwise bisect report (`bisect --json`, `merge --json`); see docs/report-format.md.",
    )
}

/// The schema of a `layerwise.fix/1` document (`fix --json`).
pub fn fix_report_schema() -> serde_json::Value {
    schema_of::<FixReport>(FIX_SCHEMA, "A layerwise fix report (`fix --json`); see docs/fix.md.")
}

fn schema_of<T: JsonSchema>(title: &str, description: &str) -> serde_json::Value {
    // The serialize contract: a field is required when it is always written (an `Option` as
    // `null`), and not where the writer leaves it out (`skip_serializing_if`).
    let mut schema = SchemaSettings::draft2020_12().for_serialize().into_generator().into_root_schema_for::<T>();
    schema.insert("title".into(), title.into());
    schema.insert("description".into(), description.into());
    schema.to_value()
}
