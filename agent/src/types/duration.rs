//! Go `time.Duration` strings (`"1m0s"`, `"100ms"`, `"1h2m3.5s"`): the wire form of every
//! `metav1.Duration` in the `KubeletConfiguration` and of the duration flags.
//!
//! Parsing follows Go's `time.ParseDuration` and printing Go's `Duration.String()`, so a
//! value read from a kubelet config file prints back exactly as the upstream kubelet's
//! `/configz` shows it. Durations are signed (Go's are), so validation can name a negative
//! value instead of failing to parse it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NANOS_PER_MICRO: u128 = 1_000;
const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SEC: u128 = 1_000_000_000;
const NANOS_PER_MIN: u128 = 60 * NANOS_PER_SEC;
const NANOS_PER_HOUR: u128 = 60 * NANOS_PER_MIN;

/// A signed duration with nanosecond resolution, written as a Go duration string.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration {
    nanos: i64,
}

/// Why a string is not a Go duration. The message follows Go's wording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("time: {reason} {input:?}")]
pub struct ParseDurationError {
    reason: &'static str,
    input: String,
}

impl GoDuration {
    /// The zero duration (`"0s"`).
    pub const ZERO: Self = Self { nanos: 0 };

    /// A duration of `nanos` nanoseconds (negative allowed).
    #[must_use]
    pub const fn from_nanos(nanos: i64) -> Self {
        Self { nanos }
    }

    /// A duration of `millis` milliseconds.
    #[must_use]
    pub const fn from_millis(millis: i64) -> Self {
        Self { nanos: millis * 1_000_000 }
    }

    /// A duration of `secs` seconds.
    #[must_use]
    pub const fn from_secs(secs: i64) -> Self {
        Self { nanos: secs * 1_000_000_000 }
    }

    /// A duration of `mins` minutes.
    #[must_use]
    pub const fn from_mins(mins: i64) -> Self {
        Self::from_secs(mins * 60)
    }

    /// A duration of `hours` hours.
    #[must_use]
    pub const fn from_hours(hours: i64) -> Self {
        Self::from_secs(hours * 3600)
    }

    /// The signed length in nanoseconds.
    #[must_use]
    pub const fn as_nanos(self) -> i64 {
        self.nanos
    }

    /// True for the zero duration.
    #[must_use]
    pub const fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// True for durations below zero.
    #[must_use]
    pub const fn is_negative(self) -> bool {
        self.nanos < 0
    }

    /// The duration as a `std` duration; negative durations become zero (callers that must
    /// reject them do so in validation, before this is used).
    #[must_use]
    pub fn to_std(self) -> std::time::Duration {
        std::time::Duration::from_nanos(u64::try_from(self.nanos).unwrap_or(0))
    }

    /// Converts a `std` duration, saturating at Go's maximum (about 292 years).
    #[must_use]
    pub fn from_std(duration: std::time::Duration) -> Self {
        Self { nanos: i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX) }
    }
}

impl From<std::time::Duration> for GoDuration {
    fn from(duration: std::time::Duration) -> Self {
        Self::from_std(duration)
    }
}

impl FromStr for GoDuration {
    type Err = ParseDurationError;

    /// Parses like Go's `time.ParseDuration`: an optional sign, then one or more
    /// `<number><unit>` pairs, with units `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m`, `h`;
    /// `"0"` alone needs no unit.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseDurationError { reason, input: input.to_owned() };
        let (negative, mut rest) = match input.as_bytes().first() {
            Some(b'-') => (true, &input[1..]),
            Some(b'+') => (false, &input[1..]),
            _ => (false, input),
        };
        if rest == "0" {
            return Ok(Self::ZERO);
        }
        if rest.is_empty() {
            return Err(err("invalid duration"));
        }
        let mut total: u128 = 0;
        while !rest.is_empty() {
            let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            let (int_digits, after_int) = rest.split_at(int_len);
            let (frac_digits, after_number) = match after_int.strip_prefix('.') {
                Some(after_dot) => {
                    let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
                    after_dot.split_at(frac_len)
                }
                None => ("", after_int),
            };
            if int_digits.is_empty() && frac_digits.is_empty() {
                return Err(err("invalid duration"));
            }
            let unit_len = after_number.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(after_number.len());
            let (unit, after_unit) = after_number.split_at(unit_len);
            let unit_nanos = match unit {
                "" => return Err(err("missing unit in duration")),
                "ns" => 1,
                "us" | "\u{b5}s" | "\u{3bc}s" => NANOS_PER_MICRO,
                "ms" => NANOS_PER_MILLI,
                "s" => NANOS_PER_SEC,
                "m" => NANOS_PER_MIN,
                "h" => NANOS_PER_HOUR,
                _ => return Err(err("unknown unit in duration")),
            };
            let whole: u128 =
                if int_digits.is_empty() { 0 } else { int_digits.parse().map_err(|_| err("invalid duration"))? };
            // Go drops fraction digits beyond what an int64 can hold; 18 digits is already
            // finer than a nanosecond of any unit.
            let frac_digits = &frac_digits[..frac_digits.len().min(18)];
            let fraction = if frac_digits.is_empty() {
                0
            } else {
                let value: u128 = frac_digits.parse().map_err(|_| err("invalid duration"))?;
                value * unit_nanos / 10u128.pow(frac_digits.len() as u32)
            };
            total = whole
                .checked_mul(unit_nanos)
                .and_then(|n| n.checked_add(fraction))
                .and_then(|n| n.checked_add(total))
                .ok_or_else(|| err("invalid duration"))?;
            if total > i64::MAX as u128 + u128::from(negative) {
                return Err(err("invalid duration"));
            }
            rest = after_unit;
        }
        let nanos = if negative {
            // i64::MIN has no positive twin, hence the detour through i128.
            i64::try_from(-(total as i128)).map_err(|_| err("invalid duration"))?
        } else {
            i64::try_from(total).map_err(|_| err("invalid duration"))?
        };
        Ok(Self { nanos })
    }
}

impl fmt::Display for GoDuration {
    /// Prints like Go's `Duration.String()`: `"0s"`, `"1.5ms"`, `"1m0s"`, `"1h2m3.5s"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0s");
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let u = u128::from(self.nanos.unsigned_abs());
        if u < NANOS_PER_SEC {
            let (scale, unit) = if u < NANOS_PER_MICRO {
                (1, "ns")
            } else if u < NANOS_PER_MILLI {
                (NANOS_PER_MICRO, "\u{b5}s")
            } else {
                (NANOS_PER_MILLI, "ms")
            };
            return write!(f, "{sign}{}{unit}", with_fraction(u, scale));
        }
        let secs = u / NANOS_PER_SEC;
        let seconds = with_fraction(u % NANOS_PER_MIN, NANOS_PER_SEC);
        let (hours, minutes) = (secs / 3600, secs / 60 % 60);
        if hours > 0 {
            write!(f, "{sign}{hours}h{minutes}m{seconds}s")
        } else if minutes > 0 {
            write!(f, "{sign}{minutes}m{seconds}s")
        } else {
            write!(f, "{sign}{seconds}s")
        }
    }
}

/// `value / scale` as a decimal with the trailing zeros of the fraction dropped.
fn with_fraction(value: u128, scale: u128) -> String {
    let whole = value / scale;
    let frac = value % scale;
    if frac == 0 {
        return whole.to_string();
    }
    let width = scale.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A duration that may also be written as a number of nanoseconds, as
/// `logging.flushFrequency` (component-base's `TimeOrMetaDuration`) allows. It prints as a
/// duration string.
pub(crate) mod string_or_nanos {
    use super::GoDuration;
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Nanos(i64),
        Text(String),
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<GoDuration, D::Error> {
        match Raw::deserialize(deserializer)? {
            Raw::Nanos(nanos) => Ok(GoDuration::from_nanos(nanos)),
            Raw::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> GoDuration {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_go_duration_strings() {
        assert_eq!(parse("0"), GoDuration::ZERO);
        assert_eq!(parse("0s"), GoDuration::ZERO);
        assert_eq!(parse("1m"), GoDuration::from_mins(1));
        assert_eq!(parse("1m0s"), GoDuration::from_mins(1));
        assert_eq!(parse("20s"), GoDuration::from_secs(20));
        assert_eq!(parse("100ms"), GoDuration::from_millis(100));
        assert_eq!(parse("4h"), GoDuration::from_hours(4));
        assert_eq!(parse("1h2m3.5s"), GoDuration::from_millis(3_723_500));
        assert_eq!(parse("1.5h"), GoDuration::from_mins(90));
        assert_eq!(parse(".5s"), GoDuration::from_millis(500));
        assert_eq!(parse("5.s"), GoDuration::from_secs(5));
        assert_eq!(parse("+3s"), GoDuration::from_secs(3));
        assert_eq!(parse("-1m30s"), GoDuration::from_secs(-90));
        assert_eq!(parse("1us"), GoDuration::from_nanos(1_000));
        assert_eq!(parse("1\u{b5}s"), GoDuration::from_nanos(1_000));
        assert_eq!(parse("1\u{3bc}s"), GoDuration::from_nanos(1_000));
        assert_eq!(parse("7ns"), GoDuration::from_nanos(7));
        assert_eq!(parse("1.000000001s"), GoDuration::from_nanos(1_000_000_001));
        assert_eq!(parse("2562047h47m16.854775807s"), GoDuration::from_nanos(i64::MAX));
        assert_eq!(parse("-2562047h47m16.854775808s"), GoDuration::from_nanos(i64::MIN));
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in [
            "",
            "-",
            "s",
            "1",
            "10",
            ".s",
            "1x",
            "1.2.3s",
            "1m1",
            "1 s",
            "2562047h47m16.854775808s",
            "9999999999999999999h",
        ] {
            assert!(bad.parse::<GoDuration>().is_err(), "{bad:?} should not parse");
        }
        let err = "1".parse::<GoDuration>().unwrap_err();
        assert_eq!(err.to_string(), r#"time: missing unit in duration "1""#);
        let err = "3d".parse::<GoDuration>().unwrap_err();
        assert_eq!(err.to_string(), r#"time: unknown unit in duration "3d""#);
    }

    #[test]
    fn prints_like_go() {
        let cases = [
            (GoDuration::ZERO, "0s"),
            (GoDuration::from_nanos(1), "1ns"),
            (GoDuration::from_nanos(1_100), "1.1\u{b5}s"),
            (GoDuration::from_millis(100), "100ms"),
            (GoDuration::from_nanos(2_200_000), "2.2ms"),
            (GoDuration::from_secs(20), "20s"),
            (GoDuration::from_millis(1_500), "1.5s"),
            (GoDuration::from_mins(1), "1m0s"),
            (GoDuration::from_mins(5), "5m0s"),
            (GoDuration::from_hours(4), "4h0m0s"),
            (GoDuration::from_millis(3_723_500), "1h2m3.5s"),
            (GoDuration::from_secs(-90), "-1m30s"),
            (GoDuration::from_nanos(i64::MAX), "2562047h47m16.854775807s"),
            (GoDuration::from_nanos(i64::MIN), "-2562047h47m16.854775808s"),
        ];
        for (duration, text) in cases {
            assert_eq!(duration.to_string(), text);
            assert_eq!(parse(text), duration, "round trip of {text}");
        }
    }

    #[test]
    fn serde_uses_the_string_form() {
        let json = serde_json::to_string(&GoDuration::from_mins(2)).unwrap();
        assert_eq!(json, r#""2m0s""#);
        let back: GoDuration = serde_json::from_str(r#""1h""#).unwrap();
        assert_eq!(back, GoDuration::from_hours(1));
        let err = serde_json::from_str::<GoDuration>("60").unwrap_err();
        assert!(err.to_string().contains("expected a string"), "{err}");
    }

    #[test]
    fn converts_to_std() {
        assert_eq!(GoDuration::from_millis(1500).to_std(), std::time::Duration::from_millis(1500));
        assert_eq!(GoDuration::from_secs(-1).to_std(), std::time::Duration::ZERO);
        assert_eq!(GoDuration::from_std(std::time::Duration::from_secs(3)), GoDuration::from_secs(3));
    }
}
