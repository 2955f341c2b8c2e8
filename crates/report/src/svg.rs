//! Small SVG charts written directly: the browser lays out the text, so no font files are
//! needed to produce them (plotting crates measure text with fonts they must find first).

use std::fmt::Write;

pub use crate::escape::html as esc;

/// A point of a scatter chart. `y` may be inf (drawn at the top edge, as a triangle).
pub struct Point {
    pub x: f64,
    pub y: f64,
    pub class: &'static str,
    pub title: String,
}

pub struct LogChart<'a> {
    pub id: &'a str,
    pub width: f64,
    pub height: f64,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub x_max: f64,
    pub points: Vec<Point>,
    /// Points joined by a line (the blame chain), in x order.
    pub line: Vec<(f64, f64)>,
    /// Horizontal reference lines: (y, label).
    pub rules: Vec<(f64, String)>,
}

const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 45.0;

impl LogChart<'_> {
    pub fn render(&self) -> String {
        let finite: Vec<f64> = self
            .points
            .iter()
            .map(|p| p.y)
            .chain(self.rules.iter().map(|r| r.0))
            .filter(|y| y.is_finite() && *y > 0.0)
            .collect();
        let lo = finite.iter().cloned().fold(f64::INFINITY, f64::min).max(1e-12);
        let hi = finite.iter().cloned().fold(0.0, f64::max);
        let (lo_e, hi_e) = if lo > hi {
            (-8, 1)
        } else {
            (lo.log10().floor() as i32, (hi.log10().ceil() as i32).max(lo.log10().floor() as i32 + 1))
        };
        let (pw, ph) = (self.width - LEFT - RIGHT, self.height - TOP - BOTTOM);
        let x_of = |x: f64| LEFT + pw * if self.x_max > 0.0 { x / self.x_max } else { 0.0 };
        let y_of = |y: f64| {
            if !y.is_finite() {
                return TOP;
            }
            let v = y.max(10f64.powi(lo_e)).log10();
            TOP + ph * (1.0 - (v - lo_e as f64) / (hi_e - lo_e) as f64)
        };
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg id="{}" class="chart" viewBox="0 0 {} {}" width="{}" height="{}" role="img">"#,
            self.id, self.width, self.height, self.width, self.height
        );
        let _ = write!(s, r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>"##);
        let step = ((hi_e - lo_e) as f64 / 8.0).ceil().max(1.0) as i32;
        let mut e = lo_e;
        while e <= hi_e {
            let y = y_of(10f64.powi(e));
            let _ = write!(
                s,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{}" y="{:.1}" text-anchor="end" class="tick">1e{e}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0
            );
            e += step;
        }
        let xticks = 6;
        for i in 0..=xticks {
            let xv = self.x_max * i as f64 / xticks as f64;
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="tick">{}</text>"#,
                x_of(xv),
                TOP + ph + 16.0,
                xv.round()
            );
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="axis">{}</text>"#,
            LEFT + pw / 2.0,
            self.height - 6.0,
            esc(self.x_label)
        );
        let _ = write!(
            s,
            r#"<text transform="translate(14 {:.1}) rotate(-90)" text-anchor="middle" class="axis">{}</text>"#,
            TOP + ph / 2.0,
            esc(self.y_label)
        );
        for (y, label) in &self.rules {
            let yy = y_of(*y);
            let _ = write!(
                s,
                r##"<line x1="{LEFT}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#c62828" stroke-dasharray="6 4"/><text x="{}" y="{:.1}" text-anchor="end" class="rule">{}</text>"##,
                LEFT + pw,
                LEFT + pw - 4.0,
                yy - 4.0,
                esc(label)
            );
        }
        if self.line.len() > 1 {
            let pts: Vec<String> = self.line.iter().map(|&(x, y)| format!("{:.1},{:.1}", x_of(x), y_of(y))).collect();
            let _ = write!(
                s,
                r##"<polyline class="chain" points="{}" fill="none" stroke="#1565c0" stroke-width="2"/>"##,
                pts.join(" ")
            );
        }
        for p in &self.points {
            let (x, y) = (x_of(p.x), y_of(p.y));
            if p.y.is_finite() {
                let _ = write!(
                    s,
                    r#"<circle class="pt {}" cx="{x:.1}" cy="{y:.1}" r="3"><title>{}</title></circle>"#,
                    p.class,
                    esc(&p.title)
                );
            } else {
                let _ = write!(
                    s,
                    r#"<path class="pt {} nonfinite" d="M{:.1},{:.1} l4,7 l-8,0 z"><title>{} (inf/NaN)</title></path>"#,
                    p.class,
                    x,
                    y - 2.0,
                    esc(&p.title)
                );
            }
        }
        s.push_str("</svg>");
        s
    }
}

/// Two overlaid histograms (reference, candidate) on shared bins.
pub fn histogram(id: &str, edges: &[f64], reference: &[u64], candidate: &[u64], width: f64, height: f64) -> String {
    let (pw, ph) = (width - LEFT - RIGHT, height - TOP - BOTTOM);
    let max = reference.iter().chain(candidate).copied().max().unwrap_or(1).max(1) as f64;
    let n = reference.len().max(1) as f64;
    let bw = pw / n;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="{id}" class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">"#
    );
    let _ = write!(s, r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>"##);
    for (series, counts, class, offset) in [("reference", reference, "ref", 0.0), ("candidate", candidate, "cand", 0.5)]
    {
        for (i, &c) in counts.iter().enumerate() {
            let h = ph * c as f64 / max;
            let _ = write!(
                s,
                r#"<rect class="bar {class}" x="{:.1}" y="{:.1}" width="{:.1}" height="{h:.1}"><title>{series}: {c} in [{:.4e}, {:.4e})</title></rect>"#,
                LEFT + bw * (i as f64 + offset),
                TOP + ph - h,
                bw / 2.0,
                edges.get(i).copied().unwrap_or(0.0),
                edges.get(i + 1).copied().unwrap_or(0.0)
            );
        }
    }
    if let (Some(first), Some(last)) = (edges.first(), edges.last()) {
        let _ = write!(
            s,
            r#"<text x="{LEFT}" y="{:.1}" class="tick">{first:.4e}</text><text x="{:.1}" y="{:.1}" text-anchor="end" class="tick">{last:.4e}</text>"#,
            TOP + ph + 16.0,
            LEFT + pw,
            TOP + ph + 16.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="axis">value (blue: reference, orange: candidate); bar height: count, max {max}</text>"#,
        LEFT + pw / 2.0,
        height - 6.0
    );
    s.push_str("</svg>");
    s
}
