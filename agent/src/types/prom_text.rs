//! Writing the Prometheus text exposition format (0.0.4) as the Go client's text encoder
//! does: floats as Go's `strconv.FormatFloat(v, 'g', -1, 64)`, integers, escaped label
//! values and help texts. `metrics` (the `/metrics` families) and `stats` (the cAdvisor
//! and resource endpoints, written by hand for their sample timestamps) both use it
//! (upstream: `github.com/prometheus/common/expfmt`).

use std::fmt::Write as _;

/// Writes `v` as Go's `strconv.FormatFloat(v, 'g', -1, 64)` (the Go client's text
/// encoder), e.g. `0`, `1`, `0.5`, `5028.767409292`, `1.6576512e+07`, `1e-05`, `+Inf`.
///
/// Allocation-free: whole numbers below 2^53 (most counters and byte counts) are written
/// from their integer digits, whose trailing zeros stripped are exactly the shortest
/// digits; other values from Rust's shortest round-tripping `{:e}` in a stack buffer.
pub fn write_go_float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
        return;
    }
    if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
        return;
    }
    if v == 0.0 {
        out.push('0');
        return;
    }
    if v < 0.0 {
        out.push('-');
    }
    let abs = v.abs();
    if abs.fract() == 0.0 && abs < 9_007_199_254_740_992.0 {
        let mut buf = [0u8; 20];
        let digits = u64_digits(abs as u64, &mut buf);
        let exp = digits.len() as i32 - 1;
        write_digits(out, digits.trim_end_matches('0'), exp);
        return;
    }
    let mut buf = StackText::default();
    // `{:e}` of a finite f64 is at most 24 bytes (`-2.2250738585072014e-308`).
    let _ = write!(buf, "{abs:e}");
    let sci = buf.as_str();
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let mut digits = StackText::default();
    for c in mantissa.chars().filter(char::is_ascii_digit) {
        let _ = digits.write_char(c);
    }
    write_digits(out, digits.as_str(), exp);
}

/// Writes the shortest significant `digits` (no trailing zeros, at least one digit) of a
/// positive number with decimal exponent `exp` as Go's `'g'` format does: `%e` when the
/// exponent is < -4 or >= 6 (for the shortest precision), plain otherwise.
fn write_digits(out: &mut String, digits: &str, exp: i32) {
    if !(-4..6).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        let e = exp.unsigned_abs();
        if e < 10 {
            out.push('0');
        }
        let mut buf = [0u8; 20];
        out.push_str(u64_digits(u64::from(e), &mut buf));
    } else if exp >= 0 {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.push_str(digits);
            out.extend(std::iter::repeat_n('0', int_len - digits.len()));
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    } else {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', exp.unsigned_abs() as usize - 1));
        out.push_str(digits);
    }
}

/// The decimal digits of `n`, written at the end of `buf`.
fn u64_digits(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[i..]).unwrap_or_default()
}

/// Writes `n` in decimal (a sample's millisecond timestamp).
pub fn write_i64(out: &mut String, n: i64) {
    if n < 0 {
        out.push('-');
    }
    let mut buf = [0u8; 20];
    out.push_str(u64_digits(n.unsigned_abs(), &mut buf));
}

/// A short text built on the stack (a float's `{:e}` and its digits).
#[derive(Default)]
struct StackText {
    buf: [u8; 32],
    len: usize,
}

impl StackText {
    fn as_str(&self) -> &str {
        // Only whole `str`s and chars are written.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl std::fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Escapes a label value (`\`, `"`, newline), copying unescaped stretches whole.
pub fn escape_label(out: &mut String, v: &str) {
    let mut rest = v;
    while let Some(i) = rest.find(['\\', '"', '\n']) {
        out.push_str(&rest[..i]);
        out.push_str(match rest.as_bytes()[i] {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            _ => "\\n",
        });
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
}

/// Escapes a help text (`\`, newline).
pub fn escape_help(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}
