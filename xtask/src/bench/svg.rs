//! A line chart as a small SVG document, written by hand (no plotting crate: xtask stays
//! light). Enough for the density curves: one or more series of (x, y) points, linear
//! axes from 0 with a few round ticks, a legend.

use std::fmt::Write as _;

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// A round axis maximum at or above `max` (1, 2 or 5 times a power of ten) and its tick
/// step (a fifth of it).
pub fn nice_max(max: f64) -> (f64, f64) {
    if !max.is_finite() || max <= 0.0 {
        return (1.0, 0.2);
    }
    let power = 10f64.powf(max.log10().floor());
    let top = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|t| *t >= max * (1.0 - 1e-12))
        .unwrap_or(10.0 * power);
    (top, top / 5.0)
}

/// `x` for a tick label: no decimals from 10 up, else up to 3 significant digits.
fn tick(x: f64) -> String {
    if x == 0.0 {
        "0".to_owned()
    } else if x.abs() >= 10.0 {
        format!("{x:.0}")
    } else {
        let s = format!("{x:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The chart `title` of `series` with axis labels `x_label` and `y_label`.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (x_max, y_max) = all.fold((0.0f64, 0.0f64), |(xm, ym), (x, y)| (xm.max(*x), ym.max(*y)));
    let (x_top, x_step) = nice_max(x_max);
    let (y_top, y_step) = nice_max(y_max);
    let (w, h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let px = |x: f64| LEFT + x / x_top * w;
    let py = |y: f64| TOP + h - y / y_top * h;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ =
        writeln!(s, r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#, WIDTH / 2.0, escape(title));
    for i in 0..=5 {
        let (xv, yv) = (x_step * f64::from(i), y_step * f64::from(i));
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{t:.1}" x2="{x:.1}" y2="{b:.1}" stroke="#ddd"/><text x="{x:.1}" y="{ty:.1}" text-anchor="middle">{l}</text>"##,
            x = px(xv),
            t = TOP,
            b = TOP + h,
            ty = TOP + h + 16.0,
            l = tick(xv)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{l:.1}" y1="{y:.1}" x2="{r:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{tx:.1}" y="{ty:.1}" text-anchor="end">{v}</text>"##,
            l = LEFT,
            r = LEFT + w,
            y = py(yv),
            tx = LEFT - 6.0,
            ty = py(yv) + 4.0,
            v = tick(yv)
        );
    }
    let _ = writeln!(s, r##"<rect x="{LEFT}" y="{TOP}" width="{w}" height="{h}" fill="none" stroke="#444"/>"##);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + w / 2.0,
        HEIGHT - 12.0,
        escape(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
        TOP + h / 2.0,
        TOP + h / 2.0,
        escape(y_label)
    );
    for (i, series) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = series.points.iter().map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y))).collect();
        let _ =
            writeln!(s, r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#, points.join(" "));
        for (x, y) in &series.points {
            let _ = writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"/>"#, px(*x), py(*y));
        }
        let ly = TOP + 14.0 + 16.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            LEFT + 10.0,
            LEFT + 30.0,
            LEFT + 36.0,
            ly + 4.0,
            escape(&series.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_end_on_round_numbers() {
        assert_eq!(nice_max(0.0), (1.0, 0.2));
        assert_eq!(nice_max(7.0), (10.0, 2.0));
        assert_eq!(nice_max(500.0), (500.0, 100.0));
        assert_eq!(nice_max(501.0), (1000.0, 200.0));
        let (top, step) = nice_max(0.031);
        assert!((top - 0.05).abs() < 1e-12 && (step - 0.01).abs() < 1e-12);
        assert_eq!(tick(0.04), "0.04");
        assert_eq!(tick(250.0), "250");
    }

    #[test]
    fn a_chart_has_a_line_and_a_point_per_value_and_escapes_text() {
        let svg = line_chart(
            "RSS <MiB>",
            "pods",
            "MiB",
            &[
                Series { name: "swiftlet".into(), points: vec![(0.0, 0.0), (250.0, 40.0), (500.0, 60.0)] },
                Series { name: "kubelet & co".into(), points: vec![(250.0, 100.0)] },
            ],
        );
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("RSS &lt;MiB&gt;") && svg.contains("kubelet &amp; co"));
        // The x axis ends at 500, so the last point is at the plot's right edge.
        assert!(svg.contains(&format!("{:.1},", WIDTH - RIGHT)), "{svg}");
    }
}
