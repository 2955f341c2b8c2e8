//! Reports: the versioned JSON document (`layerwise.report/1`, see docs/report-format.md) and the
//! terminal summary. Files are written atomically: a report is either complete or absent.

pub mod escape;
mod fix_report;
mod formats;
mod html;
mod json;
mod read;
mod schema;
mod svg;
mod terminal;
mod words;
mod write;

pub use fix_report::{
    kept_nodes, render_fix_html, render_fix_terminal, FixReport, FixStage, FixStatus, KeptPattern, LoadCheck,
    LoadStatus, ModelCheck, OtherPrecision, OutputChange, Round, FIX_SCHEMA,
};
pub use formats::{render_csv, render_markdown, render_model_explorer};
pub use html::render_html;
pub use json::{build_report, InputInfo, Report, ReportContext, RunInfo, SCHEMA};
pub use read::{parse_fix_report, parse_report, read_fix_report, read_report, ReadError};
pub use schema::{fix_report_schema, report_schema};
pub use terminal::render_terminal;
pub use words::{cause_name, format_number, non_finite_heading, nothing_judged, special_number, verdict_headline};
pub(crate) use words::{error_of, fmt, input_error_text, shorten, shorten_distinct};
pub use write::{stage_atomic, to_json, write_atomic, Outputs, ReportError, StagedFile};
