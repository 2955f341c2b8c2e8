//! JSON has no inf or NaN: reports write non-finite numbers as the strings "inf", "-inf", "nan".

use serde::Serializer;

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
