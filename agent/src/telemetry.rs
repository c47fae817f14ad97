//! Logging: a `tracing` subscriber whose verbosity follows the kubelet's `--v` (0–10)
//! unless `RUST_LOG` is set. OpenTelemetry export comes with the observability issue.

use tracing_subscriber::EnvFilter;

/// Maps klog verbosity to a filter: 0–1 info, 2–4 debug for swiftlet, 5+ trace.
#[must_use]
pub fn filter_for_verbosity(v: u8) -> String {
    match v {
        0 | 1 => "info".into(),
        2..=4 => "info,swiftlet=debug".into(),
        _ => "debug,swiftlet=trace".into(),
    }
}

/// Installs the global subscriber (once; later calls are no-ops).
pub fn init(verbosity: u8, json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter_for_verbosity(verbosity)));
    // Colours only for a terminal: log files and journald must not get escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

#[cfg(test)]
mod tests {
    #[test]
    fn verbosity_levels() {
        assert_eq!(super::filter_for_verbosity(0), "info");
        assert!(super::filter_for_verbosity(4).contains("swiftlet=debug"));
        assert!(super::filter_for_verbosity(9).contains("trace"));
    }
}
