//! Go's text for the values that appear in probe and hook messages (`%q` strings, `%v`
//! durations and string slices, `net` errors), so events read as upstream's; the
//! downward API's `%q` values use [`quote`] too.

use std::fmt::Write as _;
use std::io;
use std::time::Duration;

/// Go's `strconv.Quote` (`%q`): double quotes, C-style escapes for control characters,
/// `\u`/`\U` escapes for other non-printable characters.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            ' ' => out.push(' '),
            c if !c.is_control() && !c.is_whitespace() => out.push(c),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x1_0000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

/// Go's `%v` of a `[]string`: `[a b c]`.
pub(crate) fn string_slice(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// Go's `time.Duration.String()`: `1s`, `1.5s`, `2m0s`, `1h0m0s`, `300ms`, `0s`.
pub(crate) fn duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", fraction(nanos, 1_000_000));
    }
    let total_secs = d.as_secs();
    let (hours, minutes, secs) = (total_secs / 3600, total_secs / 60 % 60, total_secs % 60);
    let secs = fraction(u128::from(secs) * 1_000_000_000 + u128::from(d.subsec_nanos()), 1_000_000_000);
    if hours > 0 {
        format!("{hours}h{minutes}m{secs}s")
    } else if minutes > 0 {
        format!("{minutes}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

/// `value / unit` with the fraction's trailing zeros dropped.
fn fraction(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let rest = value % unit;
    if rest == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{rest:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Go's text for a socket error (`connection refused`, `i/o timeout`, ...): the OS message
/// in Go's lower-case wording, without Rust's `(os error N)`.
pub(crate) fn io_error(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        io::ErrorKind::ConnectionReset => "connection reset by peer".into(),
        io::ErrorKind::TimedOut => "i/o timeout".into(),
        io::ErrorKind::HostUnreachable => "no route to host".into(),
        io::ErrorKind::NetworkUnreachable => "network is unreachable".into(),
        io::ErrorKind::AddrNotAvailable => "cannot assign requested address".into(),
        io::ErrorKind::UnexpectedEof => "EOF".into(),
        _ => {
            let text = e.to_string();
            let text = text.split(" (os error").next().unwrap_or_default();
            let mut chars = text.chars();
            match chars.next() {
                Some(first) => first.to_lowercase().chain(chars).collect(),
                None => String::new(),
            }
        }
    }
}

/// Go's `strconv.Atoi`, with its error text.
pub(crate) fn atoi(s: &str) -> Result<i64, String> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("strconv.Atoi: parsing {}: invalid syntax", quote(s)));
    }
    s.parse::<i64>().map_err(|_| format!("strconv.Atoi: parsing {}: value out of range", quote(s)))
}

/// Go's `net.JoinHostPort`: brackets around a host with a colon (IPv6).
pub(crate) fn join_host_port(host: &str, port: impl std::fmt::Display) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_like_go() {
        assert_eq!(quote("a \"b\"\n\t\\"), r#""a \"b\"\n\t\\""#);
        assert_eq!(quote("\u{0}x\u{7f}"), r#""\x00x\x7f""#);
        assert_eq!(quote("é\u{a0}"), "\"é\\u00a0\"");
    }

    #[test]
    fn durations_like_go() {
        assert_eq!(duration(Duration::ZERO), "0s");
        assert_eq!(duration(Duration::from_secs(1)), "1s");
        assert_eq!(duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(duration(Duration::from_mins(2)), "2m0s");
        assert_eq!(duration(Duration::from_hours(1)), "1h0m0s");
        assert_eq!(duration(Duration::from_millis(300)), "300ms");
        assert_eq!(duration(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(duration(Duration::from_nanos(1500)), "1.5µs");
        assert_eq!(duration(Duration::from_nanos(15)), "15ns");
    }

    #[test]
    fn atoi_like_go() {
        assert_eq!(atoi("8080"), Ok(8080));
        assert_eq!(atoi("+1"), Ok(1));
        assert_eq!(atoi("-1"), Ok(-1));
        assert_eq!(atoi("http").unwrap_err(), r#"strconv.Atoi: parsing "http": invalid syntax"#);
        assert_eq!(atoi("").unwrap_err(), r#"strconv.Atoi: parsing "": invalid syntax"#);
        assert!(atoi("99999999999999999999").unwrap_err().ends_with("value out of range"));
    }

    #[test]
    fn io_errors_like_go() {
        assert_eq!(io_error(&io::Error::from(io::ErrorKind::ConnectionRefused)), "connection refused");
        assert_eq!(io_error(&io::Error::from_raw_os_error(libc::EACCES)), "permission denied");
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(string_slice(&["sh".into(), "-c".into(), "exit 1".into()]), "[sh -c exit 1]");
    }
}
