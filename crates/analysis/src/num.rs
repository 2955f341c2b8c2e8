//! JSON has no inf or NaN: reports write non-finite numbers as the strings "inf", "-inf", "nan".

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serializer};

/// The JSON Schema of a number written by [`finite_or_string`], for the fields that write one:
/// `#[schemars(with = "FiniteOrString")]` (or `Option<FiniteOrString>`, `Vec<...>`) beside their
/// `#[serde(with = ...)]`. Never constructed.
pub enum FiniteOrString {}

impl JsonSchema for FiniteOrString {
    fn schema_name() -> Cow<'static, str> {
        "FiniteOrString".into()
    }

    fn schema_id() -> Cow<'static, str> {
        concat!(module_path!(), "::FiniteOrString").into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A number. JSON has no inf or NaN: those are written as the strings \"inf\", \"-inf\" and \"nan\".",
            "anyOf": [{ "type": "number" }, { "type": "string", "enum": ["inf", "-inf", "nan"] }]
        })
    }
}

pub fn finite_or_string<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_finite() {
        s.serialize_f64(*v)
    } else if v.is_nan() {
        s.serialize_str("nan")
    } else if *v > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

/// Like [`finite_or_string`], with `None` as `null` (a value that was not measured).
pub fn option_finite_or_string<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => finite_or_string(v, s),
        None => s.serialize_none(),
    }
}

/// A number as the reports write it: a JSON number, or "inf", "-inf", "nan".
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrString {
    Number(f64),
    Text(String),
}

fn parse(v: NumberOrString) -> Result<f64, String> {
    match v {
        NumberOrString::Number(x) => Ok(x),
        NumberOrString::Text(t) => match t.as_str() {
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            "nan" => Ok(f64::NAN),
            other => Err(format!("'{other}' is not a number")),
        },
    }
}

/// The inverse of [`finite_or_string`].
pub fn finite_or_string_de<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    parse(NumberOrString::deserialize(d)?).map_err(serde::de::Error::custom)
}

/// A list of [`option_finite_or_string`] values.
pub fn vec_option_finite_or_string<S: Serializer>(v: &[Option<f64>], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    struct One<'a>(&'a Option<f64>);
    impl serde::Serialize for One<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            option_finite_or_string(self.0, s)
        }
    }
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for x in v {
        seq.serialize_element(&One(x))?;
    }
    seq.end()
}

/// The inverse of [`vec_option_finite_or_string`].
pub fn vec_option_finite_or_string_de<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Option<f64>>, D::Error> {
    let raw: Vec<Option<NumberOrString>> = Vec::deserialize(d)?;
    raw.into_iter().map(|v| v.map(parse).transpose().map_err(serde::de::Error::custom)).collect()
}

/// `#[serde(with = "crate::num::finite")]`: an f64 written by [`finite_or_string`] and read back.
pub mod finite {
    pub use super::finite_or_string as serialize;
    pub use super::finite_or_string_de as deserialize;
}

/// `#[serde(default, with = "crate::num::option_finite")]`: an `Option<f64>` written by
/// [`option_finite_or_string`] and read back (`null` is `None`).
pub mod option_finite {
    pub use super::option_finite_or_string as serialize;

    pub fn deserialize<'de, D: super::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        use serde::Deserialize;
        let raw: Option<super::NumberOrString> = Option::deserialize(d)?;
        raw.map(super::parse).transpose().map_err(serde::de::Error::custom)
    }
}
