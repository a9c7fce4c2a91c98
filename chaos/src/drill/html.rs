//! A drill's report as one self-contained HTML page: the verdict, the parameters and
//! figures as tables, and inline SVG plots of the `plots` field (verdict counts over time,
//! the callers' error rate, each distribution as a CDF, the drill's events as marks).
//! No script, no external resource: the page opens anywhere, offline.
//!
//! Rendered from the report's JSON alone, so `waymark-drill report DIR` rebuilds it.

use std::fmt::Write as _;

use serde_json::Value;

use super::report::{Distribution, Event, Plots, RateSample, StateSample};

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 28.0;
const TOP: f64 = 12.0;

/// The colours of the verdict series, in drawing order.
const VERDICT_COLOURS: [(&str, &str); 7] = [
    ("eligible", "#2e7d32"),
    ("degraded", "#f9a825"),
    ("unknown", "#6d6d6d"),
    ("ineligible", "#c62828"),
    ("quarantined", "#8e24aa"),
    ("draining", "#1565c0"),
    ("withdrawn", "#000000"),
];

/// The page for one report.
pub fn render(report: &Value) -> String {
    let drill = report["drill"].as_str().unwrap_or("drill");
    let pass = report["verdict"]["pass"].as_bool();
    let plots: Plots = serde_json::from_value(report["plots"].clone()).unwrap_or_default();
    let mut page = String::new();
    let _ = write!(
        page,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>waymark drill: {}</title>\
         <style>body{{font:14px/1.4 system-ui,sans-serif;margin:24px;max-width:960px}}\
         table{{border-collapse:collapse;margin:8px 0}}td,th{{border:1px solid #ccc;padding:2px 8px;\
         text-align:left;vertical-align:top}}.pass{{color:#2e7d32}}.fail{{color:#c62828}}\
         svg{{background:#fafafa;border:1px solid #ddd;margin:6px 0}}code{{font-size:12px}}\
         </style></head><body>",
        esc(drill)
    );
    let verdict = match pass {
        Some(true) => "<span class=\"pass\">PASS</span>".to_owned(),
        Some(false) => "<span class=\"fail\">FAIL</span>".to_owned(),
        None => "no verdict".to_owned(),
    };
    let _ = write!(
        page,
        "<h1>drill <code>{}</code>: {verdict}</h1>",
        esc(drill)
    );
    if let Some(failures) = report["verdict"]["failures"].as_array()
        && !failures.is_empty()
    {
        page.push_str("<ul>");
        for f in failures {
            let _ = write!(page, "<li class=\"fail\">{}</li>", esc(&plain(f)));
        }
        page.push_str("</ul>");
    }
    let end = end_ms(&plots);
    if !plots.states.is_empty() {
        page.push_str("<h2>Instances by verdict</h2>");
        page.push_str(&states_svg(&plots.states, &plots.events, end));
    }
    if !plots.errors.is_empty() {
        page.push_str("<h2>Callers' error rate (per second)</h2>");
        page.push_str(&errors_svg(&plots.errors, &plots.events, end));
    }
    for d in &plots.distributions {
        let _ = write!(
            page,
            "<h2>{} ({} values, CDF)</h2>",
            esc(&d.name),
            d.values.len()
        );
        page.push_str(&cdf_svg(d));
    }
    if !plots.events.is_empty() {
        page.push_str("<h2>Events</h2><table><tr><th>#</th><th>t (s)</th><th>what</th></tr>");
        for (i, e) in plots.events.iter().enumerate() {
            let _ = write!(
                page,
                "<tr><td>{}</td><td>{:.1}</td><td>{}</td></tr>",
                i + 1,
                e.t_ms as f64 / 1000.0,
                esc(&e.what)
            );
        }
        page.push_str("</table>");
    }
    page.push_str("<h2>Figures</h2>");
    if let Some(obj) = report.as_object() {
        page.push_str("<table>");
        for (k, v) in obj {
            if k == "plots" || k == "drill" {
                continue;
            }
            let _ = write!(page, "<tr><th>{}</th><td>{}</td></tr>", esc(k), table(v));
        }
        page.push_str("</table>");
    }
    page.push_str("</body></html>\n");
    page
}

/// A JSON value as nested tables (objects) or text.
fn table(v: &Value) -> String {
    match v {
        Value::Object(m) if !m.is_empty() => {
            let mut s = String::from("<table>");
            for (k, v) in m {
                let _ = write!(s, "<tr><th>{}</th><td>{}</td></tr>", esc(k), table(v));
            }
            s.push_str("</table>");
            s
        }
        Value::Array(a) if a.len() > 20 => format!("<code>[{} values]</code>", a.len()),
        other => format!("<code>{}</code>", esc(&plain(other))),
    }
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn end_ms(p: &Plots) -> u64 {
    let s = p.states.last().map_or(0, |s| s.t_ms);
    let e = p.errors.last().map_or(0, |s| s.t_ms + 1_000);
    let v = p.events.last().map_or(0, |e| e.t_ms);
    s.max(e).max(v).max(1)
}

/// An SVG frame with axes; `x` and `y` map data to pixels.
struct Frame {
    x_max: f64,
    y_max: f64,
}

impl Frame {
    /// A frame whose axes end at round numbers at or above the data's maxima.
    fn new(x_max: f64, y_max: f64) -> Self {
        Self {
            x_max: nice_ceil(x_max),
            y_max: nice_ceil(y_max),
        }
    }

    fn x(&self, v: f64) -> f64 {
        LEFT + (v / self.x_max) * (WIDTH - LEFT - 10.0)
    }
    fn y(&self, v: f64) -> f64 {
        HEIGHT - BOTTOM - (v / self.y_max) * (HEIGHT - BOTTOM - TOP)
    }
    fn open(&self, x_label: &str, y_label: &str) -> String {
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
             font-size=\"11\">"
        );
        let (x0, y0) = (self.x(0.0), self.y(0.0));
        let _ = write!(
            s,
            "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{}\" y2=\"{y0}\" stroke=\"#999\"/>\
             <line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{TOP}\" stroke=\"#999\"/>",
            WIDTH - 10.0
        );
        for i in 0..=4 {
            let xv = self.x_max * f64::from(i) / 4.0;
            let yv = self.y_max * f64::from(i) / 4.0;
            let _ = write!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                self.x(xv),
                HEIGHT - BOTTOM + 14.0,
                short(xv),
                LEFT - 4.0,
                self.y(yv) + 4.0,
                short(yv)
            );
        }
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\
             <text x=\"4\" y=\"{TOP}\">{}</text>",
            WIDTH - 10.0,
            HEIGHT - 2.0,
            esc(x_label),
            esc(y_label)
        );
        s
    }
    fn events(&self, events: &[Event], scale: f64) -> String {
        let mut s = String::new();
        for (i, e) in events.iter().enumerate() {
            let x = self.x(e.t_ms as f64 / scale);
            // Numbered as in the events table below the plots.
            let _ = write!(
                s,
                "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#1565c0\" \
                 stroke-dasharray=\"3,3\"><title>{}</title></line>\
                 <text x=\"{:.1}\" y=\"{}\" fill=\"#1565c0\" font-size=\"9\">{}</text>",
                self.y(0.0),
                esc(&e.what),
                x + 2.0,
                TOP + 8.0,
                i + 1
            );
        }
        s
    }
}

/// A round number at or above `v`: the smallest of a few multiples of a power of ten.
fn nice_ceil(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 1.2, 1.6, 2.0, 2.4, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|c| *c >= v * 0.999_999)
        .unwrap_or(10.0 * mag)
}

/// A tick label: whole numbers as such, fractions with up to four decimals, trailing
/// zeros dropped (0.025, not 0.03).
fn short(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        return format!("{v:.0}");
    }
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn polyline(points: &[(f64, f64)], colour: &str, name: &str) -> String {
    let mut s = String::from("<polyline fill=\"none\" stroke-width=\"1.5\" points=\"");
    for (x, y) in points {
        let _ = write!(s, "{x:.1},{y:.1} ");
    }
    let _ = write!(
        s,
        "\" stroke=\"{colour}\"><title>{}</title></polyline>",
        esc(name)
    );
    s
}

fn states_svg(states: &[StateSample], events: &[Event], end_ms: u64) -> String {
    let y_max = states
        .iter()
        .flat_map(|s| s.counts.values())
        .copied()
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.1;
    let f = Frame::new(end_ms as f64 / 1000.0, y_max);
    let mut s = f.open("run time (s)", "instances");
    s.push_str(&f.events(events, 1000.0));
    let mut legend = String::new();
    for (i, (verdict, colour)) in VERDICT_COLOURS.iter().enumerate() {
        if !states.iter().any(|s| s.counts.contains_key(*verdict)) {
            continue;
        }
        // A step line; a gap in sampling (the authority down) breaks the line.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        let mut prev_t: Option<u64> = None;
        for sample in states {
            if prev_t.is_some_and(|p| sample.t_ms > p + 2_000) {
                runs.push(Vec::new());
            }
            let n = sample.counts.get(*verdict).copied().unwrap_or(0) as f64;
            let run = runs.last_mut().expect("one run at least");
            let x = f.x(sample.t_ms as f64 / 1000.0);
            if let Some(&(_, py)) = run.last() {
                run.push((x, py));
            }
            run.push((x, f.y(n)));
            prev_t = Some(sample.t_ms);
        }
        for run in runs.iter().filter(|r| !r.is_empty()) {
            s.push_str(&polyline(run, colour, verdict));
        }
        let _ = write!(
            legend,
            "<text x=\"{}\" y=\"{}\" fill=\"{colour}\">{verdict}</text>",
            WIDTH - 110.0,
            TOP + 12.0 * (i as f64 + 1.0)
        );
    }
    s.push_str(&legend);
    s.push_str("</svg>");
    s
}

fn errors_svg(errors: &[RateSample], events: &[Event], end_ms: u64) -> String {
    let rates: Vec<(f64, f64)> = errors
        .iter()
        .map(|b| {
            let r = if b.requests == 0 {
                0.0
            } else {
                b.errors as f64 / b.requests as f64
            };
            (b.t_ms as f64 / 1000.0, r)
        })
        .collect();
    let y_max = rates.iter().map(|r| r.1).fold(0.05_f64, f64::max).min(1.0);
    let f = Frame::new(end_ms as f64 / 1000.0, y_max);
    let mut s = f.open("run time (s)", "error rate");
    s.push_str(&f.events(events, 1000.0));
    let points: Vec<(f64, f64)> = rates.iter().map(|(t, r)| (f.x(*t), f.y(*r))).collect();
    s.push_str(&polyline(&points, "#c62828", "error rate"));
    // Seconds with no request at all are marked: the callers were not even sending.
    for b in errors.iter().filter(|b| b.requests == 0) {
        let x = f.x(b.t_ms as f64 / 1000.0);
        let _ = write!(
            s,
            "<circle cx=\"{x:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"#000\"><title>no request</title></circle>",
            f.y(0.0)
        );
    }
    s.push_str("</svg>");
    s
}

fn cdf_svg(d: &Distribution) -> String {
    let mut v = d.values.clone();
    v.sort_by(f64::total_cmp);
    let x_max = v.last().copied().unwrap_or(1.0).max(f64::MIN_POSITIVE);
    let f = Frame::new(x_max, 1.0);
    let mut s = f.open(&d.unit, "share ≤ x");
    let n = v.len() as f64;
    let mut points = Vec::with_capacity(v.len() * 2 + 1);
    points.push((f.x(0.0), f.y(0.0)));
    for (i, x) in v.iter().enumerate() {
        points.push((f.x(*x), f.y(i as f64 / n)));
        points.push((f.x(*x), f.y((i + 1) as f64 / n)));
    }
    s.push_str(&polyline(&points, "#1565c0", &d.name));
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_report_renders_its_verdict_plots_and_escapes_text() {
        let report = json!({
            "drill": "outage",
            "verdict": {"pass": false, "failures": ["error rate <b>rose</b>"]},
            "params": {"seed": 7},
            "plots": {
                "states": [{"t_ms": 0, "counts": {"eligible": 3}},
                           {"t_ms": 500, "counts": {"eligible": 2, "unknown": 1}}],
                "errors": [{"t_ms": 0, "requests": 10, "errors": 1}],
                "distributions": [{"name": "propagation", "unit": "ms", "values": [3.0, 1.0]}],
                "events": [{"t_ms": 200, "what": "authority SIGKILLed"}]
            }
        });
        let page = render(&report);
        assert!(page.contains("FAIL"));
        assert!(page.contains("error rate &lt;b&gt;rose&lt;/b&gt;"));
        assert!(!page.contains("<b>rose"));
        assert_eq!(page.matches("<svg").count(), 3);
        assert!(page.contains("authority SIGKILLed"));
        assert!(page.contains(">unknown</text>"));
        assert!(!page.contains("<script"));
    }

    #[test]
    fn axes_end_at_round_numbers() {
        assert_eq!(nice_ceil(4.4), 5.0);
        assert_eq!(nice_ceil(23.3), 24.0);
        assert_eq!(nice_ceil(3_720.0), 4_000.0);
        assert_eq!(nice_ceil(0.47), 0.5);
        assert_eq!(nice_ceil(1.0), 1.0);
        assert_eq!(nice_ceil(0.0), 1.0);
        assert_eq!(short(0.025), "0.025");
        assert_eq!(short(1.25), "1.25");
        assert_eq!(short(3.0), "3");
        assert_eq!(short(1_250.4), "1250");
    }

    #[test]
    fn a_report_without_plots_still_renders() {
        let page = render(&json!({"drill": "x", "verdict": {"pass": true, "failures": []}}));
        assert!(page.contains("PASS"));
        assert!(!page.contains("<svg"));
    }
}
