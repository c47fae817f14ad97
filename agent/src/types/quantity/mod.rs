//! Kubernetes resource quantities (`"500m"`, `"128Mi"`, `"1e3"`), parsed exactly: the one
//! quantity module of the crate (`cm`, `eviction`, `config`, `volumes`, `node`, ... all use
//! it).
//!
//! Mirrors `k8s.io/apimachinery/pkg/api/resource.ParseQuantity`: the same grammar
//! (including its quirks: `"1."`, `".5"`, `"+"` and `"."` are accepted, the latter two as
//! zero, as is a bare suffix like `"Mi"`), the magnitude rounded *up* to nano units
//! (`1e-9`) as Go stores it, `BinarySI` values capped at `2^63-1`, and
//! [`ParsedQuantity::milli_value`] / [`ParsedQuantity::value`] rounding away from zero like
//! `MilliValue()` / `Value()`.
//!
//! Arithmetic is done on nano units in an `i128`, which holds every value Go can hold in a
//! `Quantity` after the cap, so comparisons and sums are exact (`"500m" == "0.5"`).
//!
//! Two representations, one parser:
//! - [`ParsedQuantity`]: the value alone. What resource math needs (requests, limits,
//!   allocatable, `QoS`, admission): two quantities that compare equal are interchangeable.
//! - [`Quantity`] ([`format`]): the value with Go's `resource.Format`, for code that prints
//!   quantities as `Quantity.String()` does (the eviction manager's messages and events).
//!   It wraps a [`ParsedQuantity`] parsed by [`parse`], so both see the same values; only
//!   printing differs.
//!
//! [`deserialize_text`] and [`deserialize_text_map`] read a quantity field of a config file
//! that YAML may give as a number (`podPidsLimit: 100`, `evictionHard: {...}`) as the text
//! Go's `Quantity.UnmarshalJSON` would see.

pub mod format;

pub use format::{Format, Quantity};

use std::fmt;

/// Errors from parsing a quantity; each names the offending string.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The string is empty (after trimming whitespace).
    #[error("quantity is empty")]
    Empty,
    /// The string does not match the quantity grammar or uses an unknown suffix.
    #[error("invalid quantity {value:?}: {reason}")]
    Format {
        /// The string as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The value is too large to be represented.
    #[error("quantity {value:?} is out of range")]
    OutOfRange {
        /// The string as given.
        value: String,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

const NANOS_PER_UNIT: i128 = 1_000_000_000;
const NANOS_PER_MILLI: i128 = 1_000_000;
/// Go caps `BinarySI` quantities (and only those) at `math.MaxInt64` units.
const MAX_NANOS: i128 = (i64::MAX as i128) * NANOS_PER_UNIT;

/// A parsed quantity: its exact value in nano units, as Go keeps it after parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct ParsedQuantity {
    nanos: i128,
}

impl ParsedQuantity {
    /// The zero quantity.
    pub const ZERO: Self = Self { nanos: 0 };

    /// A quantity of `milli` thousandths of a unit (e.g. milli-CPU).
    #[must_use]
    pub fn from_milli(milli: i64) -> Self {
        Self { nanos: i128::from(milli) * NANOS_PER_MILLI }
    }

    /// A quantity of `units` whole units (e.g. bytes).
    #[must_use]
    pub fn from_units(units: i64) -> Self {
        Self { nanos: i128::from(units) * NANOS_PER_UNIT }
    }

    /// The value in nano units.
    #[must_use]
    pub fn nanos(self) -> i128 {
        self.nanos
    }

    /// True when the quantity is exactly zero (Go's `IsZero`).
    #[must_use]
    pub fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// True when the quantity is greater than zero (Go's `Cmp(zero) == 1`).
    #[must_use]
    pub fn is_positive(self) -> bool {
        self.nanos > 0
    }

    /// Sum of two quantities (Go's `Add`), saturating far beyond any real resource.
    #[must_use]
    pub fn saturating_add(self, other: Self) -> Self {
        Self { nanos: self.nanos.saturating_add(other.nanos) }
    }

    /// Thousandths of a unit, rounded away from zero (Go's `MilliValue()`); `None` if it
    /// overflows i64 (where Go would silently wrap).
    #[must_use]
    pub fn milli_value(self) -> Option<i64> {
        i64::try_from(div_away_from_zero(self.nanos, NANOS_PER_MILLI)).ok()
    }

    /// Whole units, rounded away from zero (Go's `Value()`); `None` if it overflows i64.
    #[must_use]
    pub fn value(self) -> Option<i64> {
        i64::try_from(div_away_from_zero(self.nanos, NANOS_PER_UNIT)).ok()
    }

    /// [`Self::milli_value`], saturating at `i64::MAX` (only reachable with absurd input).
    #[must_use]
    pub fn milli_value_saturating(self) -> i64 {
        self.milli_value().unwrap_or(if self.nanos < 0 { i64::MIN } else { i64::MAX })
    }

    /// [`Self::value`], saturating at `i64::MAX` (only reachable with absurd input).
    #[must_use]
    pub fn value_saturating(self) -> i64 {
        self.value().unwrap_or(if self.nanos < 0 { i64::MIN } else { i64::MAX })
    }
}

impl fmt::Display for ParsedQuantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Canonical enough for logs: whole units when exact, else nano units.
        if self.nanos % NANOS_PER_UNIT == 0 {
            write!(f, "{}", self.nanos / NANOS_PER_UNIT)
        } else {
            write!(f, "{}n", self.nanos)
        }
    }
}

impl std::str::FromStr for ParsedQuantity {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        parse(s)
    }
}

/// Division rounding away from zero, as Go's `ScaledValue` does (`d` is positive).
fn div_away_from_zero(n: i128, d: i128) -> i128 {
    let magnitude = n.unsigned_abs().div_ceil(d.unsigned_abs());
    // Both fit: the magnitude is at most |n|.
    let magnitude = i128::try_from(magnitude).unwrap_or(i128::MAX);
    if n < 0 { -magnitude } else { magnitude }
}

/// The unit a suffix stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suffix {
    /// `m`, `k`, `M`, ... or none: 10^exp (Go's `DecimalSI`).
    DecimalSi(i64),
    /// `Ki`, `Mi`, ...: 2^exp, capped like Go's `BinarySI`.
    BinarySi(u32),
    /// `e3`, `E-2`: 10^exp, not capped (Go's `DecimalExponent`).
    DecimalExponent(i64),
}

fn suffix_of(value: &str, suffix: &str) -> Result<Suffix> {
    let decimal = |exp| Ok(Suffix::DecimalSi(exp));
    let binary = |exp| Ok(Suffix::BinarySi(exp));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let bad = || Error::Format { value: value.to_owned(), reason: "unknown suffix" };
            let exp = suffix.strip_prefix(['e', 'E']).filter(|rest| !rest.is_empty()).ok_or_else(bad)?;
            // Go parses the exponent with ParseInt and then narrows it to int32.
            let exp: i32 = exp.parse().map_err(|_| bad())?;
            Ok(Suffix::DecimalExponent(i64::from(exp)))
        }
    }
}

/// A byte count in canonical binary-SI form (`0`, `4Mi`, `1536`), as Go's
/// `resource.NewQuantity(n, BinarySI).String()`: the largest power-of-1024 suffix that
/// divides it exactly.
#[must_use]
pub fn binary_si(bytes: u64) -> String {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let (mut n, mut i) = (bytes, 0);
    while n != 0 && n.is_multiple_of(1024) && i < SUFFIXES.len() - 1 {
        n /= 1024;
        i += 1;
    }
    format!("{n}{}", SUFFIXES[i])
}

/// Parses a quantity string exactly as `resource.ParseQuantity` (after the whitespace trim
/// that `Quantity.UnmarshalJSON` does).
pub fn parse(input: &str) -> Result<ParsedQuantity> {
    let s = input.trim();
    if s.is_empty() {
        return Err(Error::Empty);
    }
    let format_err = |reason| Error::Format { value: input.to_owned(), reason };
    let bytes = s.as_bytes();
    let mut pos = 0;
    let mut negative = false;
    match bytes[0] {
        b'-' => {
            negative = true;
            pos = 1;
        }
        b'+' => pos = 1,
        _ => {}
    }
    let int_start = pos;
    while pos < bytes.len() && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    let int_digits = &s[int_start..pos];
    let mut frac_digits = "";
    if pos < bytes.len() && bytes[pos] == b'.' {
        pos += 1;
        let frac_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        frac_digits = &s[frac_start..pos];
    }
    let suffix = &s[pos..];
    // Go's scanner: suffix letters, then an optional sign, then digits to the end.
    let letters_end = suffix.find(|c: char| !"eEinumkKMGTP".contains(c)).unwrap_or(suffix.len());
    let mut rest = &suffix[letters_end..];
    rest = rest.strip_prefix(['+', '-']).unwrap_or(rest);
    if !rest.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format_err("unexpected character"));
    }
    let unit = suffix_of(input, suffix)?;
    let out_of_range = || Error::OutOfRange { value: input.to_owned() };
    let magnitude = magnitude_nanos(int_digits, frac_digits, unit).ok_or_else(out_of_range)?;
    let capped = match unit {
        Suffix::BinarySi(_) => magnitude.min(MAX_NANOS),
        Suffix::DecimalSi(_) | Suffix::DecimalExponent(_) => magnitude,
    };
    Ok(ParsedQuantity { nanos: if negative { -capped } else { capped } })
}

/// `ceil(|number| * unit * 10^9)`, or `None` when it does not fit an i128.
fn magnitude_nanos(int_digits: &str, frac_digits: &str, unit: Suffix) -> Option<i128> {
    // Significant digits as one integer N, with value = N * 10^exp10 * 2^exp2.
    let frac_trimmed = frac_digits.trim_end_matches('0');
    let digits = format!("{int_digits}{frac_trimmed}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    let mantissa: i128 = digits.parse().ok()?;
    let frac_len = i64::try_from(frac_trimmed.len()).ok()?;
    let (mut exp10, exp2) = match unit {
        Suffix::DecimalSi(e) | Suffix::DecimalExponent(e) => (e, 0),
        Suffix::BinarySi(e) => (0, e),
    };
    exp10 = exp10 - frac_len + 9;
    let numerator = mantissa.checked_mul(1_i128.checked_shl(exp2)?)?;
    if exp10 >= 0 {
        let scale = 10_i128.checked_pow(u32::try_from(exp10).ok()?)?;
        numerator.checked_mul(scale)
    } else {
        match 10_i128.checked_pow(u32::try_from(-exp10).ok()?) {
            Some(divisor) => Some(div_away_from_zero(numerator, divisor)),
            // The divisor exceeds any i128 numerator: a positive value below one nano,
            // which Go rounds up to one nano.
            None => Some(1),
        }
    }
}

/// Parses a CPU quantity into milli-CPU (`"500m"` → 500, `"2"` → 2000), rounding up.
pub fn parse_milli_cpu(value: &str) -> Result<i64> {
    parse(value)?.milli_value().ok_or_else(|| Error::OutOfRange { value: value.to_owned() })
}

/// Parses a memory quantity into bytes (`"128Mi"` → 134217728), rounding up.
pub fn parse_bytes(value: &str) -> Result<i64> {
    parse(value)?.value().ok_or_else(|| Error::OutOfRange { value: value.to_owned() })
}

/// A quantity as YAML/JSON may write it: text, or a bare number.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum RawText {
    Text(String),
    Int(i64),
    Float(f64),
}

impl From<RawText> for String {
    fn from(raw: RawText) -> Self {
        match raw {
            RawText::Text(text) => text,
            RawText::Int(n) => n.to_string(),
            RawText::Float(x) => x.to_string(),
        }
    }
}

/// `#[serde(deserialize_with)]` for a quantity kept as text: a string as given, a number
/// as its decimal text. Parsing (and its errors) is left to validation.
///
/// # Errors
/// When the value is neither a string nor a number.
pub fn deserialize_text<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    <RawText as serde::Deserialize>::deserialize(d).map(String::from)
}

/// [`deserialize_text`] for every value of a map (`evictionHard`, `kubeReserved`, ...).
///
/// # Errors
/// When a value is neither a string nor a number.
pub fn deserialize_text_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<std::collections::BTreeMap<String, String>, D::Error> {
    let raw = <std::collections::BTreeMap<String, RawText> as serde::Deserialize>::deserialize(d)?;
    Ok(raw.into_iter().map(|(k, v)| (k, v.into())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn milli(s: &str) -> i64 {
        parse_milli_cpu(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn bytes(s: &str) -> i64 {
        parse_bytes(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn cpu_forms() {
        assert_eq!(milli("500m"), 500);
        assert_eq!(milli("2"), 2000);
        assert_eq!(milli("0.5"), 500);
        assert_eq!(milli(".5"), 500);
        assert_eq!(milli("1."), 1000);
        assert_eq!(milli("100m"), 100);
        assert_eq!(milli("0"), 0);
        assert_eq!(milli("0m"), 0);
        assert_eq!(milli("1k"), 1_000_000);
        assert_eq!(milli("+1"), 1000);
        assert_eq!(milli("007"), 7000);
        assert_eq!(milli(" 250m "), 250);
    }

    #[test]
    fn cpu_rounds_up_like_milli_value() {
        assert_eq!(milli("0.0001"), 1);
        assert_eq!(milli("1.0001"), 1001);
        assert_eq!(milli("1500u"), 2);
        assert_eq!(milli("1n"), 1);
        assert_eq!(milli("1e-3"), 1);
        assert_eq!(milli("1e-30"), 1, "below a nano rounds up to a nano, then to 1m");
        assert_eq!(milli("1e-99999"), 1);
    }

    #[test]
    fn memory_forms() {
        assert_eq!(bytes("128Mi"), 128 * 1024 * 1024);
        assert_eq!(bytes("1G"), 1_000_000_000);
        assert_eq!(bytes("1e3"), 1000);
        assert_eq!(bytes("1E3"), 1000);
        assert_eq!(bytes("1e+3"), 1000);
        assert_eq!(bytes("129M"), 129_000_000);
        assert_eq!(bytes("123456789"), 123_456_789);
        assert_eq!(bytes("1Ki"), 1024);
        assert_eq!(bytes("1.5Gi"), 1_610_612_736);
        assert_eq!(bytes("0.5Ki"), 512);
        assert_eq!(bytes("1Ei"), 1 << 60);
        assert_eq!(bytes("1E"), 1_000_000_000_000_000_000);
        assert_eq!(bytes("1k"), 1000);
    }

    #[test]
    fn memory_rounds_up_like_value() {
        assert_eq!(bytes("100m"), 1);
        assert_eq!(bytes("1.0001k"), 1001);
        assert_eq!(bytes("0.1Ki"), 103, "102.4 rounds up");
        assert_eq!(bytes("1500m"), 2);
    }

    #[test]
    fn go_quirks_are_accepted() {
        // resource.ParseQuantity accepts these; so must we.
        assert_eq!(parse("+").unwrap(), ParsedQuantity::ZERO);
        assert_eq!(parse("-").unwrap(), ParsedQuantity::ZERO);
        assert_eq!(parse(".").unwrap(), ParsedQuantity::ZERO);
        assert_eq!(bytes("1.Mi"), 1 << 20);
        assert_eq!(parse("-0").unwrap(), ParsedQuantity::ZERO);
        // A bare suffix has an empty number, which Go reads as zero.
        assert_eq!(parse("Mi").unwrap(), ParsedQuantity::ZERO);
        assert_eq!(parse("m").unwrap(), ParsedQuantity::ZERO);
    }

    #[test]
    fn caps_like_go() {
        // BinarySI is capped at MaxInt64 units; other formats are not (Go then wraps on
        // Value(), we report the overflow).
        assert_eq!(bytes("16Ei"), i64::MAX);
        assert_eq!(bytes("8Ei"), i64::MAX);
        assert!(matches!(parse_bytes("10E"), Err(Error::OutOfRange { .. })));
        assert!(matches!(parse_bytes("1e19"), Err(Error::OutOfRange { .. })));
        assert!(matches!(parse_milli_cpu("16Ei"), Err(Error::OutOfRange { .. })));
        assert!(matches!(parse("1e99"), Err(Error::OutOfRange { .. })));
        assert_eq!(parse("0e99").unwrap(), ParsedQuantity::ZERO);
    }

    #[test]
    fn negative_values() {
        assert_eq!(milli("-500m"), -500);
        assert_eq!(bytes("-1Ki"), -1024);
        // Rounding is away from zero, like Go's ScaledValue.
        assert_eq!(bytes("-1.5"), -2);
        assert_eq!(milli("-0.0001"), -1);
    }

    #[test]
    fn exact_comparison() {
        assert_eq!(parse("500m").unwrap(), parse("0.5").unwrap());
        assert_eq!(parse("1Gi").unwrap(), parse("1024Mi").unwrap());
        assert_eq!(parse("1e3").unwrap(), parse("1k").unwrap());
        assert_ne!(parse("1.0001m").unwrap(), parse("1.0002m").unwrap());
        assert!(parse("1G").unwrap() < parse("1Gi").unwrap());
        let sum = parse("250m").unwrap().saturating_add(parse("0.75").unwrap());
        assert_eq!(sum, parse("1").unwrap());
    }

    #[test]
    fn errors_name_the_value() {
        assert_eq!(parse(""), Err(Error::Empty));
        assert_eq!(parse("  "), Err(Error::Empty));
        for bad in ["1K", "1 Mi", "abc", "1Mii", "1e", "1e3.5", "1x", "--1", "1.2.3", "1e+", "1-"] {
            let err = parse(bad).expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{bad}: {err}");
        }
        let err = parse_bytes("12Q").unwrap_err();
        assert_eq!(err.to_string(), "invalid quantity \"12Q\": unexpected character");
        let err = parse_bytes("1Ki3").unwrap_err();
        assert_eq!(err.to_string(), "invalid quantity \"1Ki3\": unknown suffix");
    }

    #[test]
    fn many_digits() {
        assert_eq!(bytes("0000000000000000000000000000000000000000001"), 1);
        assert_eq!(bytes("1.000000000000000000000000000000000000000000000"), 1);
        assert!(matches!(parse("1234567890123456789012345678901234567890"), Err(Error::OutOfRange { .. })));
        assert_eq!(bytes("12345678901234567890123456789e-20"), 123_456_790);
        assert_eq!(bytes("1234567890123456789012345678e-36"), 1);
    }

    #[test]
    fn display() {
        assert_eq!(parse("2").unwrap().to_string(), "2");
        assert_eq!(parse("500m").unwrap().to_string(), "500000000n");
    }
}
