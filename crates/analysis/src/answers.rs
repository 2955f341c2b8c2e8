//! Did the answer change? An output judged in the model's own terms beside the element-wise
//! metrics: a classifier's top-k classes, a detector's boxes above a confidence threshold, a
//! greedy CTC decode, an argmax mask, an embedding's direction. The element-wise error can fail
//! with every answer the same (a classifier's logits 1e-2 apart, the same top-1), or pass with an
//! answer changed (a detector's scores beside boxes hundreds of pixels wide set the range term of
//! the tolerance; one CTC step flipped by 1e-3).
//!
//! Each output is read as rows of its last axis (classes, channels, an embedding's components):
//! every other axis counts cases (a batch, a sequence's steps).

use serde::{Deserialize, Serialize};

/// What an output answers, and how it is read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Task {
    /// Class scores (logits or probabilities) on the last axis: top-1 and top-`topk` agreement.
    Classify { topk: usize },
    /// Per-step class scores [.., T, C]: greedy CTC decode (best class per step, repeats merged,
    /// `blank` dropped); a case is one sequence.
    Ctc { blank: usize },
    /// Per-pixel class scores [N, C, H, W] (classes on axis 1): the argmax mask, judged by the
    /// share of pixels whose class changed and the IoU of each class present.
    Mask { min_iou: f64 },
    /// Vectors on the last axis: the cosine of each pair.
    Embedding { min_cosine: f64 },
    /// Detections: one row per candidate box, its fields on the channel axis (of the last two, the
    /// one that holds them, the smaller where both do: YOLO's [1, 4 + C, N] or an NMS output's
    /// [1, N, 6]): `boxes` (4 columns, centre x,
    /// y, width, height where `xywh`, else corners), `scores` (one column per class) or one score
    /// column with `class` its class's column. Boxes above `conf` are suppressed (per class, IoU
    /// above `iou`) and matched across the two sides by class and IoU >= `iou`.
    Detect {
        boxes: (usize, usize),
        scores: (usize, Option<usize>),
        class: Option<usize>,
        xywh: bool,
        conf: f64,
        iou: f64,
    },
}

impl Task {
    /// The name users give in `--task OUTPUT:NAME`.
    pub fn name(&self) -> &'static str {
        match self {
            Task::Classify { .. } => "classify",
            Task::Ctc { .. } => "ctc",
            Task::Mask { .. } => "mask",
            Task::Embedding { .. } => "embedding",
            Task::Detect { .. } => "detect",
        }
    }

    /// `classify[,topk=5]`, `ctc[,blank=0]`, `mask[,min_iou=0.9]`, `embedding[,min_cosine=0.99]`,
    /// `detect[,boxes=0:4,scores=4:,class=K,format=xywh|xyxy,conf=0.25,iou=0.5]`.
    pub fn parse(text: &str) -> Result<Task, String> {
        let mut parts = text.split(',');
        let head = parts.next().unwrap_or_default().trim();
        let options: Vec<(&str, &str)> = parts
            .map(|p| {
                p.split_once('=').map(|(k, v)| (k.trim(), v.trim())).ok_or_else(|| format!("'{p}' is not KEY=VALUE"))
            })
            .collect::<Result<_, _>>()?;
        let number = |key: &str, value: &str| -> Result<f64, String> {
            value.parse::<f64>().ok().filter(|v| v.is_finite()).ok_or_else(|| format!("{key}={value}: not a number"))
        };
        let count = |key: &str, value: &str| -> Result<usize, String> {
            value.parse::<usize>().map_err(|_| format!("{key}={value}: not a count"))
        };
        let unknown = |key: &str, known: &str| format!("{head}: unknown option '{key}' (it takes {known})");
        let mut task = match head {
            "classify" => Task::Classify { topk: 5 },
            "ctc" => Task::Ctc { blank: 0 },
            "mask" => Task::Mask { min_iou: 0.9 },
            "embedding" => Task::Embedding { min_cosine: 0.99 },
            "detect" => {
                Task::Detect { boxes: (0, 4), scores: (4, None), class: None, xywh: true, conf: 0.25, iou: 0.5 }
            }
            other => {
                return Err(format!("unknown task '{other}': one of classify, ctc, mask, embedding, detect"));
            }
        };
        let fraction = |key: &str, value: &str, low: f64, high: f64| -> Result<f64, String> {
            let v = number(key, value)?;
            if v < low || v > high {
                return Err(format!("{key}={value}: must be within [{low}, {high}]"));
            }
            Ok(v)
        };
        let mut seen = std::collections::HashSet::new();
        for (key, value) in options {
            if !seen.insert(key) {
                return Err(format!("{head}: '{key}' given twice"));
            }
            match (&mut task, key) {
                (Task::Classify { topk }, "topk") => {
                    *topk = count(key, value)?;
                    if *topk == 0 {
                        return Err("topk=0: at least 1".into());
                    }
                }
                (Task::Classify { .. }, _) => return Err(unknown(key, "topk")),
                (Task::Ctc { blank }, "blank") => *blank = count(key, value)?,
                (Task::Ctc { .. }, _) => return Err(unknown(key, "blank")),
                (Task::Mask { min_iou }, "min_iou") => *min_iou = fraction(key, value, 0.0, 1.0)?,
                (Task::Mask { .. }, _) => return Err(unknown(key, "min_iou")),
                (Task::Embedding { min_cosine }, "min_cosine") => *min_cosine = fraction(key, value, -1.0, 1.0)?,
                (Task::Embedding { .. }, _) => return Err(unknown(key, "min_cosine")),
                (Task::Detect { boxes, .. }, "boxes") => {
                    let r = range(value)?;
                    if r.1 != Some(r.0 + 4) {
                        return Err(format!("boxes={value}: four columns, as 0:4"));
                    }
                    *boxes = (r.0, r.0 + 4);
                }
                (Task::Detect { scores, .. }, "scores") => *scores = range(value)?,
                (Task::Detect { class, .. }, "class") => *class = Some(count(key, value)?),
                (Task::Detect { xywh, .. }, "format") => {
                    *xywh = match value {
                        "xywh" => true,
                        "xyxy" => false,
                        _ => return Err(format!("format={value}: xywh or xyxy")),
                    }
                }
                (Task::Detect { conf, .. }, "conf") => *conf = fraction(key, value, 0.0, 1.0)?,
                (Task::Detect { iou, .. }, "iou") => *iou = fraction(key, value, 0.0, 1.0)?,
                (Task::Detect { .. }, _) => return Err(unknown(key, "boxes, scores, class, format, conf, iou")),
            }
        }
        Ok(task)
    }
}

/// `A:B` or `A:` (to the end) of columns.
fn range(text: &str) -> Result<(usize, Option<usize>), String> {
    let (a, b) = text.split_once(':').ok_or_else(|| format!("'{text}' is not START:END"))?;
    let a: usize = a.parse().map_err(|_| format!("'{text}': '{a}' is not a column"))?;
    let b = if b.is_empty() {
        None
    } else {
        Some(b.parse::<usize>().map_err(|_| format!("'{text}': '{b}' is not a column"))?)
    };
    if b.is_some_and(|b| b <= a) {
        return Err(format!("'{text}': the end must be past the start"));
    }
    Ok((a, b))
}

/// One output's answers compared on one sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerCheck {
    /// Cases judged (rows: a batch's items, or one sequence, one image).
    pub cases: usize,
    /// The cases whose answer changed, by index.
    pub changed: Vec<usize>,
    /// What changed and by how much, in words.
    pub detail: String,
}

impl AnswerCheck {
    pub fn held(&self) -> bool {
        self.changed.is_empty()
    }
}

/// The answers of `reference` and `candidate` (values of one output, shape `shape`) compared.
pub fn check(task: &Task, shape: &[usize], reference: &[f32], candidate: &[f32]) -> Result<AnswerCheck, String> {
    if reference.len() != candidate.len() || reference.len() != shape.iter().product::<usize>() {
        return Err(format!(
            "the two sides differ in shape or size ({} and {} values for {shape:?})",
            reference.len(),
            candidate.len()
        ));
    }
    match task {
        Task::Classify { topk } => Ok(classify(shape, reference, candidate, *topk)),
        Task::Ctc { blank } => ctc(shape, reference, candidate, *blank),
        Task::Embedding { min_cosine } => Ok(embedding(shape, reference, candidate, *min_cosine)),
        Task::Mask { min_iou } => mask(shape, reference, candidate, *min_iou),
        Task::Detect { .. } => detect(task, shape, reference, candidate),
    }
}

fn last_axis(shape: &[usize]) -> usize {
    shape.last().copied().unwrap_or(1).max(1)
}

/// Indices of a row's values from largest to smallest (NaN last).
fn ranked(row: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (row[a], row[b]);
        y.partial_cmp(&x).unwrap_or_else(|| x.is_nan().cmp(&y.is_nan()))
    });
    order
}

fn classify(shape: &[usize], reference: &[f32], candidate: &[f32], topk: usize) -> AnswerCheck {
    let classes = last_axis(shape);
    let k = topk.min(classes);
    let (mut changed, mut topk_changed, mut margins) = (Vec::new(), 0usize, Vec::new());
    for (case, (r, c)) in reference.chunks(classes).zip(candidate.chunks(classes)).enumerate() {
        let (rr, cr) = (ranked(r), ranked(c));
        if rr[0] != cr[0] {
            // How close the reference's own first two were: a flip between near ties.
            let margin = if classes > 1 { (r[rr[0]] - r[rr[1]]) as f64 } else { 0.0 };
            margins.push(margin);
            changed.push(case);
        }
        let (mut a, mut b) = (rr[..k].to_vec(), cr[..k].to_vec());
        a.sort_unstable();
        b.sort_unstable();
        if a != b {
            topk_changed += 1;
        }
    }
    let cases = reference.len() / classes;
    let smallest = margins.iter().copied().fold(f64::INFINITY, f64::min);
    // A top-k set of one class, or of every class, says nothing the top-1 count does not.
    let topk = if k > 1 && k < classes { format!("; top-{k} set changed in {topk_changed}") } else { String::new() };
    let detail = if changed.is_empty() {
        format!("top-1 class the same in {cases} of {cases}{topk}")
    } else {
        format!(
            "top-1 class changed in {} of {cases} (smallest margin between the reference's first two: {smallest:.3e}){topk}",
            changed.len()
        )
    };
    AnswerCheck { cases, changed, detail }
}

/// The index `ranked` puts first (the largest value, the first of ties, NaN only where all are),
/// without sorting the row: a CTC step has thousands of classes.
fn first_ranked(row: &[f32]) -> usize {
    let mut best = 0;
    for (k, &v) in row.iter().enumerate().skip(1) {
        if v > row[best] || (row[best].is_nan() && !v.is_nan()) {
            best = k;
        }
    }
    best
}

/// Greedy CTC decode of one sequence's [T, C] scores.
fn ctc_decode(steps: &[f32], classes: usize, blank: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut last = None;
    for step in steps.chunks(classes) {
        let best = first_ranked(step);
        if Some(best) != last && best != blank {
            out.push(best);
        }
        last = Some(best);
    }
    out
}

/// Levenshtein distance between two sequences.
fn edit_distance(a: &[usize], b: &[usize]) -> usize {
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, x) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, y) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(x != y));
            diagonal = above;
        }
    }
    row[b.len()]
}

fn ctc(shape: &[usize], reference: &[f32], candidate: &[f32], blank: usize) -> Result<AnswerCheck, String> {
    if shape.len() < 2 {
        return Err(format!("ctc reads [.., steps, classes]; this output is {shape:?}"));
    }
    let classes = last_axis(shape);
    if blank >= classes {
        return Err(format!("ctc blank={blank} is not one of the {classes} classes"));
    }
    let per_sequence = classes * shape[shape.len() - 2].max(1);
    let (mut changed, mut distance) = (Vec::new(), 0usize);
    let mut first = None;
    for (case, (r, c)) in reference.chunks(per_sequence).zip(candidate.chunks(per_sequence)).enumerate() {
        let (a, b) = (ctc_decode(r, classes, blank), ctc_decode(c, classes, blank));
        if a != b {
            let d = edit_distance(&a, &b);
            distance += d;
            first.get_or_insert((case, d, a.len()));
            changed.push(case);
        }
    }
    let cases = reference.len() / per_sequence;
    let detail = match first {
        None => format!("decoded sequence the same in {cases} of {cases} (greedy CTC, blank {blank})"),
        Some((case, d, len)) => format!(
            "decoded sequence changed in {} of {cases} (greedy CTC, blank {blank}; edit distance {distance} in all; sequence {case}: {d} of its {len} symbols)",
            changed.len()
        ),
    };
    Ok(AnswerCheck { cases, changed, detail })
}

fn embedding(shape: &[usize], reference: &[f32], candidate: &[f32], min_cosine: f64) -> AnswerCheck {
    let width = last_axis(shape);
    let (mut changed, mut nonfinite) = (Vec::new(), 0usize);
    let mut lowest = f64::INFINITY;
    for (case, (r, c)) in reference.chunks(width).zip(candidate.chunks(width)).enumerate() {
        // A vector holding inf/NaN has no direction: its answer changed, and no cosine is made up.
        if r.iter().chain(c).any(|v| !v.is_finite()) {
            nonfinite += 1;
            changed.push(case);
            continue;
        }
        let (mut dot, mut rr, mut cc) = (0f64, 0f64, 0f64);
        for (&x, &y) in r.iter().zip(c) {
            dot += x as f64 * y as f64;
            rr += x as f64 * x as f64;
            cc += y as f64 * y as f64;
        }
        let cosine = if rr == 0.0 && cc == 0.0 { 1.0 } else { dot / (rr.sqrt() * cc.sqrt()) };
        lowest = lowest.min(cosine);
        if cosine.is_nan() || cosine < min_cosine {
            changed.push(case);
        }
    }
    let cases = reference.len() / width;
    let finite = cases - nonfinite;
    let mut detail = format!("cosine below {min_cosine} in {} of {finite}", changed.len() - nonfinite);
    if finite > 0 {
        detail.push_str(&format!(" (lowest {lowest:.6})"));
    }
    if nonfinite > 0 {
        detail.push_str(&format!("; {nonfinite} of {cases} vectors hold inf/NaN (no cosine)"));
    }
    AnswerCheck { cases, changed, detail }
}

fn mask(shape: &[usize], reference: &[f32], candidate: &[f32], min_iou: f64) -> Result<AnswerCheck, String> {
    if shape.len() < 3 {
        return Err(format!("mask reads [N, classes, ..pixels]; this output is {shape:?}"));
    }
    let (n, classes) = (shape[0].max(1), shape[1].max(1));
    if classes < 2 {
        return Err(format!("mask takes the argmax over classes on axis 1, and this output has {classes} ({shape:?}): a one-channel map is read by a threshold, which no argmax can judge"));
    }
    let pixels: usize = shape[2..].iter().product::<usize>().max(1);
    let argmax = |values: &[f32], image: usize, p: usize| {
        (0..classes)
            .max_by(|&a, &b| {
                let (x, y) = (values[(image * classes + a) * pixels + p], values[(image * classes + b) * pixels + p]);
                x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal)
            })
            .unwrap_or(0)
    };
    let (mut changed, mut flipped_all, mut worst) = (Vec::new(), 0usize, 1f64);
    for image in 0..n {
        let (mut inter, mut union) = (vec![0usize; classes], vec![0usize; classes]);
        let mut flipped = 0;
        for p in 0..pixels {
            let (a, b) = (argmax(reference, image, p), argmax(candidate, image, p));
            if a == b {
                inter[a] += 1;
                union[a] += 1;
            } else {
                flipped += 1;
                union[a] += 1;
                union[b] += 1;
            }
        }
        flipped_all += flipped;
        let ious: Vec<f64> =
            (0..classes).filter(|&k| union[k] > 0).map(|k| inter[k] as f64 / union[k] as f64).collect();
        let lowest = ious.iter().copied().fold(1f64, f64::min);
        worst = worst.min(lowest);
        if lowest < min_iou {
            changed.push(image);
        }
    }
    let detail = format!(
        "{flipped_all} of {} pixels changed class; lowest class IoU {worst:.4} (below {min_iou} in {} of {n})",
        n * pixels,
        changed.len()
    );
    Ok(AnswerCheck { cases: n, changed, detail })
}

/// One detection: corners, score, class.
#[derive(Debug, Clone, Copy)]
struct Detection {
    corners: [f64; 4],
    score: f64,
    class: usize,
}

fn iou(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    let area = |c: &[f64; 4]| (c[2] - c[0]).max(0.0) * (c[3] - c[1]).max(0.0);
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// The detections of one image above `conf`, suppressed per class (IoU above `threshold`).
fn detections(task: &Task, rows: &[Vec<f64>]) -> Vec<Detection> {
    let Task::Detect { boxes, scores, class, xywh, conf, iou: threshold } = task else { return Vec::new() };
    let mut found: Vec<Detection> = rows
        .iter()
        .filter_map(|row| {
            let b = &row[boxes.0..boxes.1];
            let corners = if *xywh {
                [b[0] - b[2] / 2.0, b[1] - b[3] / 2.0, b[0] + b[2] / 2.0, b[1] + b[3] / 2.0]
            } else {
                [b[0], b[1], b[2], b[3]]
            };
            let end = scores.1.unwrap_or(row.len()).min(row.len());
            let s = &row[scores.0.min(end)..end];
            let (best, score) =
                s.iter().enumerate().fold((0, f64::NEG_INFINITY), |m, (k, &v)| if v > m.1 { (k, v) } else { m });
            let class = match class {
                Some(column) => row.get(*column).copied().unwrap_or(0.0).max(0.0) as usize,
                None => best,
            };
            (score > *conf).then_some(Detection { corners, score, class })
        })
        .collect();
    found.sort_by(|a, b| b.score.partial_cmp(&a.score).unwrap_or(std::cmp::Ordering::Equal));
    let mut kept: Vec<Detection> = Vec::new();
    for d in found {
        if !kept.iter().any(|k| k.class == d.class && iou(&k.corners, &d.corners) > *threshold) {
            kept.push(d);
        }
    }
    kept
}

fn detect(task: &Task, shape: &[usize], reference: &[f32], candidate: &[f32]) -> Result<AnswerCheck, String> {
    let Task::Detect { boxes, scores, class, iou: threshold, conf, .. } = task else { unreachable!() };
    if shape.len() < 3 {
        return Err(format!(
            "detect reads [images, boxes, fields] or [images, fields, boxes]; this output is {shape:?}"
        ));
    }
    let (a, b) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let needed = [boxes.1, scores.1.unwrap_or(scores.0 + 1), class.map_or(0, |c| c + 1)].into_iter().max().unwrap_or(0);
    // Fields on the axis that can hold them, the smaller where both can (YOLO [1, 84, 8400]; NMS
    // [1, 300, 6]).
    let fields_last = match (a >= needed, b >= needed) {
        (true, true) => b <= a,
        (false, true) => true,
        (true, false) => false,
        (false, false) => {
            return Err(format!("detect needs {needed} fields per box and neither of this output's last two axes has that many ({shape:?})"));
        }
    };
    let (count, fields) = if fields_last { (a, b) } else { (b, a) };
    let per_image = count * fields;
    let rows_of = |values: &[f32], image: usize| -> Vec<Vec<f64>> {
        let v = &values[image * per_image..(image + 1) * per_image];
        (0..count)
            .map(|i| {
                (0..fields).map(|f| if fields_last { v[i * fields + f] } else { v[f * count + i] } as f64).collect()
            })
            .collect()
    };
    let images = reference.len() / per_image.max(1);
    let (mut changed, mut lost, mut added, mut moved, mut kept, mut held_count) = (Vec::new(), 0, 0, 0f64, 0, 0);
    for image in 0..images {
        let (r, c) = (detections(task, &rows_of(reference, image)), detections(task, &rows_of(candidate, image)));
        held_count += r.len();
        let mut used = vec![false; c.len()];
        let mut image_lost = 0;
        for d in &r {
            let best = c
                .iter()
                .enumerate()
                .filter(|(k, e)| !used[*k] && e.class == d.class)
                .map(|(k, e)| (k, iou(&d.corners, &e.corners)))
                .filter(|(_, v)| *v >= *threshold)
                .max_by(|x, y| x.1.partial_cmp(&y.1).unwrap_or(std::cmp::Ordering::Equal));
            match best {
                Some((k, _)) => {
                    used[k] = true;
                    kept += 1;
                    let shift = d.corners.iter().zip(&c[k].corners).map(|(x, y)| (x - y).abs()).fold(0f64, f64::max);
                    moved = moved.max(shift);
                }
                None => image_lost += 1,
            }
        }
        let image_added = used.iter().filter(|u| !**u).count();
        lost += image_lost;
        added += image_added;
        if image_lost + image_added > 0 {
            changed.push(image);
        }
    }
    let moved = if kept > 0 { format!("; corners moved up to {moved:.3}") } else { String::new() };
    let detail = format!(
        "{held_count} detections above {conf} in the reference: {kept} matched (class and IoU >= {threshold}{moved}), {lost} lost, {added} added"
    );
    Ok(AnswerCheck { cases: images, changed, detail })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_parse_with_their_options_and_refuse_others() {
        assert_eq!(Task::parse("classify,topk=3").unwrap(), Task::Classify { topk: 3 });
        assert_eq!(Task::parse("ctc").unwrap(), Task::Ctc { blank: 0 });
        assert_eq!(
            Task::parse("detect,boxes=0:4,scores=4:5,class=5,format=xyxy,conf=0.5").unwrap(),
            Task::Detect { boxes: (0, 4), scores: (4, Some(5)), class: Some(5), xywh: false, conf: 0.5, iou: 0.5 }
        );
        assert!(Task::parse("classify,blank=1").unwrap_err().contains("unknown option 'blank'"));
        assert!(Task::parse("segment").unwrap_err().contains("unknown task 'segment'"));
        assert!(Task::parse("detect,boxes=0:3").unwrap_err().contains("four columns"));
        assert!(Task::parse("classify,topk=0").unwrap_err().contains("at least 1"));
        assert!(Task::parse("classify,topk=5,topk=3").unwrap_err().contains("'topk' given twice"));
        assert!(Task::parse("embedding,min_cosine=2").unwrap_err().contains("within [-1, 1]"));
        assert!(Task::parse("detect,conf=-1").unwrap_err().contains("within [0, 1]"));
        // Shapes a task cannot read are said, not judged.
        assert!(check(&Task::Mask { min_iou: 0.9 }, &[1, 1, 2, 2], &[0.0; 4], &[0.0; 4])
            .unwrap_err()
            .contains("one-channel map"));
        let detect = Task::parse("detect").unwrap();
        assert!(check(&detect, &[8, 10], &[0.0; 80], &[0.0; 80]).unwrap_err().contains("[images, boxes, fields]"));
    }

    #[test]
    fn a_classifier_whose_logits_moved_keeps_its_top1_and_a_near_tie_flips() {
        // Two cases of 3 classes: the first's logits all moved by 1e-2, its order kept; the
        // second's first two 1e-3 apart swap.
        let reference = [2.0, 1.0, 0.0, 1.0005, 0.9995, 0.0];
        let candidate = [2.01, 1.01, 0.01, 0.999, 1.0, 0.0];
        let c = check(&Task::Classify { topk: 2 }, &[2, 3], &reference, &candidate).unwrap();
        assert_eq!((c.cases, c.changed.clone()), (2, vec![1]));
        assert!(
            c.detail.contains(
                "top-1 class changed in 1 of 2 (smallest margin between the reference's first two: 1.000e-3)"
            ),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("top-2 set changed in 0"), "{}", c.detail);
    }

    #[test]
    fn a_ctc_decode_changes_with_one_step_flipped_by_a_small_error() {
        // 6 steps of 3 classes (blank 0): 1, near, 1, blank, 2, 2. The reference's step 1
        // favours the blank by 1e-3 (1, blank, 1: [1, 1, 2]); the candidate's tips it to class 1,
        // which merges with its neighbours: [1, 2]. Element-wise a 1e-3 change.
        let one = [0.0, 1.0, 0.0];
        let near = [0.5005, 0.4995, 0.0];
        let near_flipped = [0.4995, 0.5005, 0.0];
        let blank = [1.0, 0.0, 0.0];
        let two = [0.0, 0.0, 1.0];
        let seq = |middle: [f32; 3]| [one, middle, one, blank, two, two].concat();
        let (reference, candidate) = (seq(near), seq(near_flipped));
        let c = check(&Task::Ctc { blank: 0 }, &[1, 6, 3], &reference, &candidate).unwrap();
        assert_eq!(c.changed, vec![0]);
        assert!(c.detail.contains("edit distance 1 in all; sequence 0: 1 of its 3 symbols"), "{}", c.detail);
        assert!(check(&Task::Ctc { blank: 0 }, &[1, 6, 3], &reference, &reference).unwrap().held());
        assert_eq!(edit_distance(&[1, 2, 3], &[1, 3]), 1);
        assert_eq!(edit_distance(&[], &[4, 5]), 2);
    }

    #[test]
    fn the_first_ranked_class_is_ranked_s_first() {
        for row in
            [vec![0.5, 2.0, 2.0, -1.0], vec![f32::NAN, 1.0, 3.0], vec![f32::NAN, f32::NAN], vec![-0.0, 0.0], vec![1.0]]
        {
            assert_eq!(first_ranked(&row), ranked(&row)[0], "{row:?}");
        }
    }

    #[test]
    fn embeddings_are_judged_by_cosine() {
        let reference = [1.0, 0.0, 0.0, 1.0];
        let candidate = [1.0, 0.001, 0.0, -1.0];
        let c = check(&Task::Embedding { min_cosine: 0.99 }, &[2, 2], &reference, &candidate).unwrap();
        assert_eq!(c.changed, vec![1]);
        assert!(c.detail.contains("lowest -1.000000"), "{}", c.detail);
        // A vector with NaN has no cosine: changed, and said so.
        let nan = [1.0, 0.0, f32::NAN, 1.0];
        let c = check(&Task::Embedding { min_cosine: 0.99 }, &[2, 2], &reference, &nan).unwrap();
        assert_eq!(c.changed, vec![1]);
        assert!(
            c.detail.contains("cosine below 0.99 in 0 of 1 (lowest 1.000000); 1 of 2 vectors hold inf/NaN (no cosine)"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn a_mask_is_judged_by_the_pixels_whose_class_changed() {
        // One image, 2 classes, 4 pixels: class scores [c0 p0..p3, c1 p0..p3]; one pixel flips.
        let reference = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0];
        let candidate = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let c = check(&Task::Mask { min_iou: 0.9 }, &[1, 2, 2, 2], &reference, &candidate).unwrap();
        assert_eq!(c.changed, vec![0]);
        assert!(c.detail.starts_with("1 of 4 pixels changed class; lowest class IoU 0.5000"), "{}", c.detail);
    }

    /// A YOLO-style [1, 6, N] output (4 box fields, 2 classes): boxes hundreds of pixels, scores 0
    /// to 1. Every score dropping below the threshold is a tiny element-wise error beside the
    /// boxes, and every detection is lost.
    #[test]
    fn a_mixed_scale_detector_output_loses_its_detections_while_the_boxes_hold() {
        let n = 4;
        // Field-major: [cx; n], [cy; n], [w; n], [h; n], [score0; n], [score1; n].
        let mut reference = vec![100.0, 300.0, 500.0, 700.0];
        reference.extend([200.0; 4]);
        reference.extend([80.0; 4]);
        reference.extend([120.0; 4]);
        reference.extend([0.9, 0.0, 0.8, 0.1]);
        reference.extend([0.0, 0.7, 0.0, 0.05]);
        let mut candidate = reference.clone();
        for v in &mut candidate[4 * n..] {
            *v *= 0.2;
        }
        let task = Task::parse("detect").unwrap();
        let c = check(&task, &[1, 6, n], &reference, &candidate).unwrap();
        assert_eq!(c.changed, vec![0]);
        assert!(
            c.detail.contains("3 detections above 0.25 in the reference: 0 matched (class and IoU >= 0.5), 3 lost"),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("3 lost, 0 added"), "{}", c.detail);
        // Boxes moved by a pixel, scores kept: every detection matched.
        let mut moved = reference.clone();
        for v in &mut moved[..n] {
            *v += 1.0;
        }
        let c = check(&task, &[1, 6, n], &reference, &moved).unwrap();
        assert!(c.held() && c.detail.contains("3 matched") && c.detail.contains("moved up to 1.000"), "{}", c.detail);
    }

    /// An NMS output [1, K, 6] (x1, y1, x2, y2, score, class): slots reordered by a TopK change
    /// nothing that is detected.
    #[test]
    fn reordered_nms_slots_are_the_same_detections() {
        let reference =
            [10.0, 10.0, 50.0, 50.0, 0.9, 0.0, 60.0, 60.0, 90.0, 90.0, 0.8, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let candidate =
            [60.0, 60.0, 90.2, 90.0, 0.81, 2.0, 10.0, 10.0, 50.0, 50.1, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let task = Task::parse("detect,scores=4:5,class=5,format=xyxy").unwrap();
        let c = check(&task, &[1, 3, 6], &reference, &candidate).unwrap();
        assert!(c.held(), "{}", c.detail);
        assert!(c.detail.contains("2 detections above 0.25 in the reference: 2 matched"), "{}", c.detail);
    }
}
