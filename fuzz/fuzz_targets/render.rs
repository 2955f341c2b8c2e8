//! The escaping of every medium text from a model reaches (`layerwise_report::escape`): a random
//! string as a name goes through the terminal, Markdown, CSV and shell escaping, and each result
//! is read back by a parser of its medium (crates/report/tests/common/escape_check.rs, also run
//! over seeded strings by crates/report/tests/escape_props.rs): no control or bidi character, no
//! raw HTML or markup from pulldown-cmark and the text shown as written, no formula cell through
//! the csv crate, one shell word per argument that splits back to it.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/report/tests/common/escape_check.rs"]
mod escape_check;

fuzz_target!(|text: &str| {
    escape_check::check(text);
});
