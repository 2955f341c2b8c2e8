//! Comparing two runs tensor by tensor, and walking back from the worst output to the layer that
//! first diverges.

pub mod answers;
mod causes;
mod compare;
mod defaults;
pub mod findings;
mod histogram;
mod integers;
mod metrics;
pub mod num;
mod patterns;
pub mod search;
mod storage;
mod verdict;
mod walk;

pub use compare::{
    add_passed_through, compare_all, different_meaning, fed_value, is_weight_output, missing_reason, passed_through,
    tensor_record, Comparison, KeptValues, PairedComparison, TensorRecord, HISTOGRAM_BINS, WEIGHT_OUTPUT,
};
pub use defaults::defaults_and_rule;
pub use findings::{
    aggregate_samples, chosen_sample, verdict_order, AnswerRecord, ComparisonMode, ControlFlow, Counterfactual, Extras,
    InlinedNode, Isolation, KeepCheck, LocalError, MemoryPlan, NoiseFloor, QuantizerAlone, QuantizersAlone, Repro,
    SampleData, SampleRun, SampleStats, Samples, Shard, TensorMatching, ILL_CONDITIONED_FACTOR,
};
pub use histogram::{histogram, Histogram};
pub use integers::IntegerTensors;
pub use metrics::{
    compute, metrics_of_totals, MaskSentinels, Metrics, OutputJudge, OutputParts, PairTotals, PartJudging, Tolerance,
    ToleranceSet, MASK_SENTINEL_MIN_ABS, PART_SCALE_RATIO,
};
pub use patterns::{
    cause_nodes, close_over_fp16_range, keep_pattern, may_compute_integer_from_float, pattern_of, Pattern,
};
pub use search::{run_bound, search_first_divergent, SearchResult, SearchRun};
pub use verdict::{
    Candidate, Cause, CauseKind, ChainStep, Evidence, FirstDivergent, Mechanism, NonFiniteTensor, SightEnd, Status,
    Verdict, WalkRule,
};
pub use walk::{judge_node, verdict_from_chain, walk_back};
