//! Small SVG charts (no plotting dependency needed): TTFT CDFs, one line per arm, and
//! stacked time-series panels for the controller's timeline.

const W: f64 = 760.0;
const H: f64 = 420.0;
const L: f64 = 64.0;
const R: f64 = 210.0;
const T: f64 = 36.0;
const B: f64 = 48.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `series`: (arm name, TTFT samples in seconds). The x axis ends at the largest p99.
/// The opening of a chart: the svg element, a white background and the centred title.
fn open(height: f64, title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
        (L + W - R) / 2.0,
        esc(title)
    )
}

pub fn ttft_cdf(title: &str, series: &[(String, Vec<f64>)]) -> String {
    let mut sorted: Vec<(String, Vec<f64>)> = series
        .iter()
        .map(|(n, v)| {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            (n.clone(), v)
        })
        .collect();
    sorted.retain(|(_, v)| !v.is_empty());
    let xmax = sorted
        .iter()
        .map(|(_, v)| v[((v.len() as f64 * 0.99) as usize).min(v.len() - 1)])
        .fold(1.0f64, f64::max);
    let xmax = nice_ceiling(xmax);
    let px = |x: f64| L + (x / xmax).min(1.0) * (W - L - R);
    let py = |y: f64| H - B - y * (H - T - B);
    let mut s = open(H, title);
    for i in 0..=5 {
        let x = xmax * i as f64 / 5.0;
        let y = i as f64 / 5.0;
        s += &format!(
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/><text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
            px(x),
            py(0.0),
            py(1.0),
            py(0.0) + 16.0,
            trim(x)
        );
        s += &format!(
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4}\" text-anchor=\"end\">{5:.1}</text>\n",
            px(0.0),
            py(y),
            px(xmax),
            px(0.0) - 6.0,
            py(y) + 4.0,
            y
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">TTFT (s)</text>\n<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">share of requests</text>\n",
        (L + W - R) / 2.0,
        H - 10.0,
        (T + H - B) / 2.0,
        (T + H - B) / 2.0
    );
    for (i, (name, v)) in sorted.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let n = v.len();
        let step = (n / 600).max(1);
        let mut pts = String::new();
        for (k, x) in v.iter().enumerate().step_by(step) {
            pts += &format!("{:.1},{:.1} ", px(*x), py((k + 1) as f64 / n as f64));
        }
        pts += &format!("{:.1},{:.1}", px(v[n - 1]), py(1.0));
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{pts}\"/>\n"
        );
        s += &legend_entry(i, color, name);
    }
    s += "</svg>\n";
    s
}

/// One panel of a stacked line chart: a y label and named series of (x, y) points; a
/// `None` y breaks the line.
pub struct Panel {
    pub y_label: String,
    pub series: Vec<Series>,
}

/// A named line: (x, y) points, `None` where there is no value.
pub type Series = (String, Vec<(f64, Option<f64>)>);

const PANEL_H: f64 = 170.0;
const PANEL_GAP: f64 = 30.0;

/// Panels stacked over one shared x axis (simulated time), one colour per series name,
/// the legend once at the top right.
pub fn stacked(title: &str, x_label: &str, panels: &[Panel]) -> String {
    let xmax = panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|(_, v)| v.iter().map(|&(x, _)| x)))
        .fold(1.0f64, f64::max);
    let (xtick, xticks) = axis_ticks(xmax);
    let xmax = xtick * xticks as f64;
    let height = T + panels.len() as f64 * (PANEL_H + PANEL_GAP) + B;
    let px = |x: f64| L + (x / xmax).clamp(0.0, 1.0) * (W - L - R);
    let mut s = open(height, title);
    let mut names: Vec<&str> = Vec::new();
    for p in panels {
        for (n, _) in &p.series {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
    }
    for (k, p) in panels.iter().enumerate() {
        let top = T + k as f64 * (PANEL_H + PANEL_GAP);
        let bottom = top + PANEL_H;
        let ymax = y_range(p);
        let py = |y: f64| bottom - (y / ymax).clamp(0.0, 1.0) * PANEL_H;
        for i in 0..=4 {
            let y = ymax * i as f64 / 4.0;
            s += &format!(
                "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4}\" text-anchor=\"end\">{5}</text>\n",
                px(0.0),
                py(y),
                px(xmax),
                px(0.0) - 6.0,
                py(y) + 4.0,
                trim(y)
            );
        }
        let clipped = p
            .series
            .iter()
            .any(|(_, v)| v.iter().any(|&(_, y)| y.is_some_and(|y| y > ymax)));
        s += &format!(
            "<text x=\"16\" y=\"{0}\" transform=\"rotate(-90 16 {0})\" text-anchor=\"middle\">{1}{2}</text>\n",
            (top + bottom) / 2.0,
            esc(&p.y_label),
            if clipped { " (clipped)" } else { "" }
        );
        for i in 0..=xticks {
            let x = xtick * i as f64;
            s += &format!(
                "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/>\n",
                px(x),
                top,
                bottom
            );
            if k + 1 == panels.len() {
                s += &format!(
                    "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                    px(x),
                    bottom + 16.0,
                    trim(x)
                );
            }
        }
        for (name, v) in &p.series {
            let i = names.iter().position(|n| n == name).unwrap_or(0);
            let color = COLORS[i % COLORS.len()];
            let mut run = String::new();
            let flush = |run: &mut String, s: &mut String| {
                if !run.is_empty() {
                    *s += &format!(
                        "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
                        run.trim_end()
                    );
                    run.clear();
                }
            };
            for &(x, y) in v {
                match y {
                    Some(y) => run.push_str(&format!("{:.1},{:.1} ", px(x), py(y))),
                    None => flush(&mut run, &mut s),
                }
            }
            flush(&mut run, &mut s);
        }
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
        (L + W - R) / 2.0,
        height - 10.0,
        esc(x_label)
    );
    for (i, name) in names.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        s += &legend_entry(i, color, name);
    }
    s += "</svg>\n";
    s
}

/// The panel's y range: up to the largest value, unless a few spikes dwarf the rest (largest
/// above 3× the 95th percentile): then 1.5× that percentile, and the spikes are clipped.
fn y_range(p: &Panel) -> f64 {
    let mut ys: Vec<f64> = p
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().filter_map(|&(_, y)| y))
        .filter(|y| y.is_finite())
        .collect();
    if ys.is_empty() {
        return 1.0;
    }
    ys.sort_by(f64::total_cmp);
    let max = ys[ys.len() - 1];
    let p95 = ys[(ys.len() * 95 / 100).min(ys.len() - 1)];
    let top = if p95 > 0.0 && max > 3.0 * p95 {
        1.5 * p95
    } else {
        max
    };
    if top > 0.0 {
        nice_ceiling(top)
    } else {
        1.0
    }
}

/// The `i`-th line of the legend at the top right.
fn legend_entry(i: usize, color: &str, name: &str) -> String {
    let ly = T + 14.0 + 18.0 * i as f64;
    format!(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{color}\" stroke-width=\"3\"/><text x=\"{3}\" y=\"{4}\">{5}</text>\n",
        W - R + 12.0,
        ly,
        W - R + 32.0,
        W - R + 38.0,
        ly + 4.0,
        esc(name)
    )
}

fn nice_ceiling(x: f64) -> f64 {
    let mag = 10f64.powf(x.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= x {
            return m * mag;
        }
    }
    10.0 * mag
}

/// The x axis's tick step (1, 2 or 5 × 10ⁿ, four to ten ticks) and tick count, the last
/// tick at or just past `x`: a run of 15,200 s ends at 16,000 rather than 20,000.
fn axis_ticks(x: f64) -> (f64, u32) {
    let mag = 10f64.powf((x / 4.0).log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|step| (x / step).ceil() <= 10.0)
        .unwrap_or(10.0 * mag);
    (step, ((x / step).ceil() as u32).max(1))
}

fn trim(x: f64) -> String {
    let s = format!("{x:.1}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    #[test]
    fn svg_has_one_line_and_legend_per_arm() {
        let s = super::ttft_cdf(
            "t",
            &[
                ("a".into(), vec![1.0, 2.0, 3.0]),
                ("b<x>".into(), vec![2.0, 4.0]),
            ],
        );
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("b&lt;x&gt;"));
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn stacked_panels_break_lines_at_missing_values_and_share_one_legend() {
        let p = |label: &str| super::Panel {
            y_label: label.into(),
            series: vec![
                (
                    "a".into(),
                    vec![
                        (0.0, Some(1.0)),
                        (1.0, None),
                        (2.0, Some(3.0)),
                        (3.0, Some(2.0)),
                    ],
                ),
                ("b".into(), vec![(0.0, Some(2.0)), (3.0, Some(1.0))]),
            ],
        };
        let s = super::stacked("t", "time (s)", &[p("x"), p("y")]);
        // Per panel: series a in two pieces (the gap), b in one.
        assert_eq!(s.matches("<polyline").count(), 6);
        assert_eq!(
            s.matches("stroke-width=\"3\"").count(),
            2,
            "one legend entry per series"
        );
    }
}
