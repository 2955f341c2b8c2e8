//! The words and numbers every format shares: a verdict's headline, cause names, shortened
//! names and how numbers are written.

use layerwise_analysis::TensorRecord;

use crate::json::{self, Report};

/// The name reports give a cause kind (its JSON spelling).
pub fn cause_name(kind: layerwise_analysis::CauseKind) -> String {
    serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// A pass where every compared output passed on matching inf/NaN alone (`OutputInfo::unjudged`):
/// nothing was judged, which every format's heading says rather than a bare pass.
pub fn nothing_judged(report: &Report) -> bool {
    let compared: Vec<&json::OutputInfo> = report.outputs.iter().filter(|o| o.compared).collect();
    report.verdict.status == layerwise_analysis::Status::Pass
        && !compared.is_empty()
        && compared.iter().all(|o| o.unjudged)
}

/// The heading over the tensors with inf/NaN on one side only: where the candidate has none in
/// any of them (a quantizer turned the reference's NaN into finite codes), they are the
/// reference's, and a heading that named the candidate would say the opposite of the numbers.
pub fn non_finite_heading(verdict: &layerwise_analysis::Verdict) -> &'static str {
    if verdict.non_finite.iter().all(|n| n.cand_nan + n.cand_inf == 0) {
        "Non-finite values in the reference only (the candidate has finite values there)"
    } else {
        "Non-finite values in the candidate"
    }
}

/// The verdict's first line, the same in every format.
pub fn verdict_headline(report: &Report) -> String {
    // The answers beside the numbers (`--task`): an element-wise PASS whose answer changed, or a
    // DIVERGED whose answers held, says so in the headline every format shows.
    let answers = &report.extras.answers;
    let judged: Vec<&layerwise_analysis::AnswerRecord> = answers.iter().filter(|a| a.not_judged.is_none()).collect();
    let named = |changed: bool| {
        judged
            .iter()
            .filter(|a| (a.changed_cases > 0) == changed)
            .map(|a| format!("'{}' ({})", a.output, a.task))
            .collect::<Vec<_>>()
    };
    let (changed, held) = (named(true), named(false));
    let suffix = if !changed.is_empty() {
        format!("; the answer changed: {}", changed.join(", "))
    } else if !held.is_empty() && report.verdict.status == layerwise_analysis::Status::Diverged {
        format!("; the answers held: {}", held.join(", "))
    } else {
        String::new()
    };
    format!("{}{suffix}", numeric_headline(report))
}

/// The headline from the element-wise judgement alone.
fn numeric_headline(report: &Report) -> String {
    use layerwise_analysis::Status;
    // Each output once (a model may list one twice); those not compared are said so, never
    // counted as within or out of tolerance.
    let mut outputs: Vec<&json::OutputInfo> = Vec::new();
    for o in &report.outputs {
        if !outputs.iter().any(|seen| seen.name == o.name) {
            outputs.push(o);
        }
    }
    let compared: Vec<&json::OutputInfo> = outputs.iter().copied().filter(|o| o.compared).collect();
    let unseen: Vec<String> = outputs.iter().filter(|o| !o.compared).map(|o| format!("'{}'", o.name)).collect();
    let (of, not_compared) = if unseen.is_empty() {
        ("", String::new())
    } else {
        (" compared", format!("; not compared: {}", unseen.join(", ")))
    };
    match report.verdict.status {
        Status::Pass => {
            // Outputs all NaN/inf on both sides pass on matching inf/NaN alone: said, not counted.
            let unjudged: Vec<String> =
                compared.iter().filter(|o| o.unjudged).map(|o| format!("'{}'", o.name)).collect();
            if !unjudged.is_empty() && unjudged.len() == compared.len() {
                format!(
                    "VERDICT: PASS - nothing judged: every value of {} is NaN or inf on both sides{not_compared}",
                    unjudged.join(", ")
                )
            } else if !unjudged.is_empty() {
                format!("VERDICT: PASS - all {}{of} model outputs are within tolerance, but nothing judged of {} (every value NaN or inf on both sides){not_compared}", compared.len(), unjudged.join(", "))
            } else {
                format!("VERDICT: PASS - all {}{of} model outputs are within tolerance{not_compared}", compared.len())
            }
        }
        Status::Diverged => {
            let failing: Vec<String> = compared
                .iter()
                .filter(|o| !o.pass)
                .map(|o| format!("'{}' (rel L2 {})", o.name, format_number(o.rel_l2_err)))
                .collect();
            format!(
                "VERDICT: DIVERGED - {} of {}{of} outputs out of tolerance: {}{not_compared}",
                failing.len(),
                compared.len(),
                failing.join(", ")
            )
        }
    }
}

/// `text` in at most `width` characters: cut in the middle (`head…tail`), since a name's start
/// (the block, the Loop iteration) and its end (the op) both tell it apart.
pub(crate) fn shorten(text: &str, width: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= width || width < 3 {
        return text.to_string();
    }
    let head = (width - 1) * 2 / 5;
    let tail = width - 1 - head;
    format!("{}…{}", chars[..head].iter().collect::<String>(), chars[chars.len() - tail..].iter().collect::<String>())
}

/// The names of one table column, each in at most `width` characters, cut so that names that
/// differ stay different: a name whose middle cut collides with another's shows the part where
/// the two differ (`…iter12/body…`). Found on Loop iterations, whose names lost their iteration
/// when cut from the left.
pub(crate) fn shorten_distinct(names: &[&str], width: usize) -> Vec<String> {
    let cut: Vec<String> = names.iter().map(|n| shorten(n, width)).collect();
    let mut shown = cut.clone();
    // Names whose cuts collide, grouped; each group's distinct names sorted. In sorted order the
    // common prefix only shrinks with distance, so the fewest characters a name shares with any
    // other of its group are those it shares with the group's first or last name: linear in the
    // table, not quadratic (a blame chain can be as long as the graph).
    let mut groups: std::collections::HashMap<&str, Vec<usize>> = std::collections::HashMap::new();
    for (i, c) in cut.iter().enumerate() {
        groups.entry(c.as_str()).or_default().push(i);
    }
    let common = |a: &str, b: &str| a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    for members in groups.values().filter(|m| m.len() > 1) {
        let mut distinct: Vec<&str> = members.iter().map(|&i| names[i]).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let (Some(&first), Some(&last)) = (distinct.first(), distinct.last()) else { continue };
        if distinct.len() < 2 {
            continue;
        }
        for &i in members {
            let name = names[i];
            // The first character where this name differs from the names it collides with.
            let differs = match (name == first, name == last) {
                (true, _) => common(name, last),
                (_, true) => common(name, first),
                _ => common(name, first).min(common(name, last)),
            };
            let chars: Vec<char> = name.chars().collect();
            let start = differs.saturating_sub(width / 3).min(chars.len().saturating_sub(width - 1));
            let end = (start + width - 2).min(chars.len());
            let window: String = chars[start..end].iter().collect();
            shown[i] =
                format!("{}{window}{}", if start > 0 { "…" } else { "" }, if end < chars.len() { "…" } else { "" });
        }
    }
    shown
}

/// How every report writes the numbers that need no digits: "nan", "inf", "-inf", "0".
pub fn special_number(v: f64) -> Option<&'static str> {
    if v.is_nan() {
        Some("nan")
    } else if v == f64::INFINITY {
        Some("inf")
    } else if v == f64::NEG_INFINITY {
        Some("-inf")
    } else if v == 0.0 {
        Some("0")
    } else {
        None
    }
}

/// A number as the HTML and Markdown reports write it: four decimals from 1e-3 to 1e4, else
/// scientific.
pub(crate) fn fmt(v: f64) -> String {
    if let Some(s) = special_number(v) {
        s.into()
    } else if (1e-3..1e4).contains(&v.abs()) {
        format!("{v:.4}")
    } else {
        format!("{v:.3e}")
    }
}

/// A tensor record's error level as every format shows it: relative L2, inf when it could not be
/// compared.
pub(crate) fn error_of(t: &TensorRecord) -> f64 {
    if t.mismatch.is_none() {
        t.metrics.rel_l2_err
    } else {
        f64::INFINITY
    }
}

/// A first divergent node's input error: a number, or "not compared".
pub(crate) fn input_error_text(v: Option<f64>) -> String {
    v.map(fmt).unwrap_or_else(|| "not compared".to_string())
}

/// A number as the terminal summaries write it: two significant decimals, `1.23e-04`.
pub fn format_number(v: f64) -> String {
    if let Some(s) = special_number(v) {
        return s.into();
    }
    // 1.23e-04 rather than Rust's 1.23e-4, so columns line up.
    let s = format!("{v:.2e}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let e: i32 = exp.parse().unwrap_or(0);
            format!("{mantissa}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
        }
        None => s,
    }
}

#[cfg(test)]
mod shorten_tests {
    use super::{shorten, shorten_distinct};

    #[test]
    fn long_names_keep_their_start_and_end() {
        assert_eq!(shorten("short", 40), "short");
        let cut = shorten("encoder/block_17/attention/softmax/output_0_with_a_long_tail", 20);
        assert_eq!(cut.chars().count(), 20);
        assert!(cut.starts_with("encoder") && cut.ends_with("long_tail"), "{cut}");
    }

    /// The quadratic definition: a colliding name shows the window at the first character where
    /// it differs from any name its cut collides with.
    fn shorten_distinct_by_definition(names: &[&str], width: usize) -> Vec<String> {
        let cut: Vec<String> = names.iter().map(|n| shorten(n, width)).collect();
        let mut shown = cut.clone();
        for i in 0..names.len() {
            let clash: Vec<usize> =
                (0..names.len()).filter(|&j| j != i && cut[j] == cut[i] && names[j] != names[i]).collect();
            if clash.is_empty() {
                continue;
            }
            let chars: Vec<char> = names[i].chars().collect();
            let differs = clash
                .iter()
                .map(|&j| chars.iter().zip(names[j].chars()).take_while(|(a, b)| **a == *b).count())
                .min()
                .unwrap_or(0);
            let start = differs.saturating_sub(width / 3).min(chars.len().saturating_sub(width - 1));
            let end = (start + width - 2).min(chars.len());
            let window: String = chars[start..end].iter().collect();
            shown[i] =
                format!("{}{window}{}", if start > 0 { "…" } else { "" }, if end < chars.len() { "…" } else { "" });
        }
        shown
    }

    #[test]
    fn the_linear_cut_equals_the_definition() {
        // Seeded names from a small alphabet with long shared heads and tails, so that cuts collide
        // often, repeated names included.
        let mut state = 37u64;
        let mut next = |n: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        for round in 0..300 {
            let width = 8 + next(30) as usize;
            let count = 1 + next(12) as usize;
            let names: Vec<String> = (0..count)
                .map(|_| {
                    let middle: String = (0..next(6)).map(|_| ['a', 'b', 'é', '_'][next(4) as usize]).collect();
                    format!("{}{middle}{}", "head/".repeat(next(4) as usize), "/tail".repeat(next(6) as usize))
                })
                .collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            assert_eq!(
                shorten_distinct(&refs, width),
                shorten_distinct_by_definition(&refs, width),
                "round {round}: {refs:?} at width {width}"
            );
        }
    }

    #[test]
    fn names_that_differ_stay_different_when_cut() {
        // Loop iterations: cut from the left (before) all showed the same tail.
        let names: Vec<String> = (10..14)
            .map(|k| format!("decoder/while_loop/iteration_{k}/body/transformer_block/self_attention/matmul_output_0"))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let shown = shorten_distinct(&refs, 40);
        let distinct: std::collections::HashSet<&String> = shown.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{shown:?}");
        for (s, k) in shown.iter().zip(10..14) {
            assert!(s.chars().count() <= 40 && s.contains(&format!("iteration_{k}")), "{s}");
        }
        // A name equal to another (one tensor listed twice) stays as the middle cut.
        let twice = shorten_distinct(&[refs[0], refs[0]], 40);
        assert_eq!(twice[0], twice[1]);
        assert_eq!(twice[0], shorten(refs[0], 40));
    }
}
