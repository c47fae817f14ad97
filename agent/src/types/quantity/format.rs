//! Quantities with their print format, as the eviction manager compares and prints them:
//! an exact value (nano units, [`ParsedQuantity`]) with Go's `resource.Format`, so that
//! messages print `100Mi`, `50Mi`, `1500M` or `0` exactly as `Quantity.String()` does.
//!
//! Formats follow `resource.ParseQuantity` (the suffix decides: `Ki`.. is `BinarySI`, `e3`
//! is `DecimalExponent`, anything else `DecimalSI`) and `resource.NewQuantity(v, f)`.
//! [`fmt::Display`] is Go's `CanonicalizeBytes`: a `BinarySI` value below 1024 in
//! magnitude, or not a whole number, is printed as `DecimalSI`; `BinarySI` divides by 1024
//! while exact; decimal formats strip factors of ten and round the exponent down to a
//! multiple of three.

use std::cmp::Ordering;
use std::fmt;

use super::{Error, NANOS_PER_UNIT, ParsedQuantity};

/// Go's `resource.Format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// `Ki`, `Mi`, ... (bytes).
    BinarySi,
    /// `m`, `k`, `M`, ... or none.
    DecimalSi,
    /// `e3`, `E-2`.
    DecimalExponent,
}

/// A quantity with its print format.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    value: ParsedQuantity,
    format: Format,
}

impl PartialEq for Quantity {
    /// Go's `Cmp(..) == 0`: the format does not matter.
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.value.cmp(&other.value)
    }
}

impl Quantity {
    /// Zero, printed `0`.
    pub const ZERO: Self = Self { value: ParsedQuantity::ZERO, format: Format::DecimalSi };

    /// `resource.NewQuantity(value, format)`.
    #[must_use]
    pub fn new(value: i64, format: Format) -> Self {
        Self { value: ParsedQuantity::from_units(value), format }
    }

    /// Bytes (`BinarySI`).
    #[must_use]
    pub fn bytes(value: u64) -> Self {
        Self::new(i64::try_from(value).unwrap_or(i64::MAX), Format::BinarySi)
    }

    /// A count (inodes, processes: `DecimalSI`).
    #[must_use]
    pub fn count(value: u64) -> Self {
        Self::new(i64::try_from(value).unwrap_or(i64::MAX), Format::DecimalSi)
    }

    /// `resource.ParseQuantity`.
    ///
    /// # Errors
    /// When `text` is not a quantity.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let value = super::parse(text)?;
        Ok(Self { value, format: format_of(text.trim()) })
    }

    /// The exact value.
    #[must_use]
    pub fn value(self) -> ParsedQuantity {
        self.value
    }

    /// Whole units rounded away from zero, saturating (Go's `Value()`).
    #[must_use]
    pub fn units(self) -> i64 {
        self.value.value_saturating()
    }

    /// The print format.
    #[must_use]
    pub fn format(self) -> Format {
        self.format
    }

    /// `Sign() < 0`.
    #[must_use]
    pub fn is_negative(self) -> bool {
        self.value.nanos() < 0
    }

    /// `IsZero()`.
    #[must_use]
    pub fn is_zero(self) -> bool {
        self.value.is_zero()
    }
}

impl std::ops::Add for Quantity {
    type Output = Self;

    /// Go's `Add`: the left side keeps its format.
    fn add(self, other: Self) -> Self {
        Self { value: from_nanos(self.value.nanos().saturating_add(other.value.nanos())), format: self.format }
    }
}

impl std::ops::Sub for Quantity {
    type Output = Self;

    /// Go's `Sub`: the left side keeps its format.
    fn sub(self, other: Self) -> Self {
        Self { value: from_nanos(self.value.nanos().saturating_sub(other.value.nanos())), format: self.format }
    }
}

/// A [`ParsedQuantity`] of exactly `nanos`: sums and differences are exact, as Go's
/// `Add` and `Sub` are. (While this type lived in `eviction/`, it rebuilt the value from
/// whole units and milli units and rounded a finer fraction up to a milli unit; every
/// quantity the eviction manager handles has milli precision, where both give the same
/// value: see the `sums_are_exact` test.)
fn from_nanos(nanos: i128) -> ParsedQuantity {
    ParsedQuantity { nanos }
}

/// The format `ParseQuantity` gives a string.
fn format_of(text: &str) -> Format {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let number_len = unsigned.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(unsigned.len());
    match &unsigned[number_len..] {
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => Format::BinarySi,
        "" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => Format::DecimalSi,
        _ => Format::DecimalExponent,
    }
}

fn decimal_suffix(exponent: i32, format: Format) -> Option<String> {
    if format == Format::DecimalExponent {
        return Some(if exponent == 0 { String::new() } else { format!("e{exponent}") });
    }
    let suffix = match exponent {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        _ => return None,
    };
    Some(suffix.to_owned())
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.value.nanos();
        if nanos == 0 {
            return f.write_str("0");
        }
        let whole = nanos % NANOS_PER_UNIT == 0;
        let small = nanos.abs() < 1024 * NANOS_PER_UNIT;
        if self.format == Format::BinarySi && whole && !small {
            let mut units = nanos / NANOS_PER_UNIT;
            let mut exponent = 0;
            while units % 1024 == 0 && exponent < 6 {
                units /= 1024;
                exponent += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exponent];
            return write!(f, "{units}{suffix}");
        }
        let format = if self.format == Format::DecimalExponent { Format::DecimalExponent } else { Format::DecimalSi };
        let mut mantissa = nanos;
        let mut exponent: i32 = -9;
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        match exponent.rem_euclid(3) {
            1 => {
                mantissa *= 10;
                exponent -= 1;
            }
            2 => {
                mantissa *= 100;
                exponent -= 2;
            }
            _ => {}
        }
        match decimal_suffix(exponent, format) {
            Some(suffix) => write!(f, "{mantissa}{suffix}"),
            None => write!(f, "{mantissa}e{exponent}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(text: &str) -> String {
        Quantity::parse(text).unwrap().to_string()
    }

    #[test]
    fn prints_as_go_quantity_string() {
        assert_eq!(show("100Mi"), "100Mi");
        assert_eq!(show("1024Mi"), "1Gi");
        assert_eq!(show("0.5Gi"), "512Mi");
        assert_eq!(show("1.5G"), "1500M");
        assert_eq!(show("1000M"), "1G");
        assert_eq!(show("100"), "100");
        assert_eq!(show("0"), "0");
        assert_eq!(show("500m"), "500m");
        assert_eq!(show("1e3"), "1e3");
        assert_eq!(show("512Ki"), "512Ki");
        assert_eq!(show("0.5Ki"), "512");
        assert_eq!(Quantity::bytes(200 << 20).to_string(), "200Mi");
        assert_eq!(Quantity::bytes(1536).to_string(), "1536");
        assert_eq!(Quantity::bytes(1000).to_string(), "1k");
        assert_eq!(Quantity::bytes(52_428_801).to_string(), "52428801");
        assert_eq!(Quantity::count(1_000_000).to_string(), "1M");
        assert_eq!(Quantity::count(123_456).to_string(), "123456");
        assert_eq!((Quantity::bytes(3 << 20) - Quantity::bytes(1 << 20)).to_string(), "2Mi");
    }

    #[test]
    fn compares_exactly() {
        assert_eq!(Quantity::parse("1Gi").unwrap(), Quantity::bytes(1 << 30));
        assert!(Quantity::parse("1G").unwrap() < Quantity::bytes(1 << 30));
        assert!((Quantity::bytes(5) - Quantity::bytes(6)).is_negative());
    }

    #[test]
    fn sums_are_exact() {
        // Milli precision, as every eviction quantity has: as before the move.
        let sum = Quantity::parse("1500m").unwrap() + Quantity::parse("0.25").unwrap();
        assert_eq!(sum.value(), ParsedQuantity::from_milli(1750));
        assert_eq!(sum.to_string(), "1750m");
        let diff = Quantity::bytes(1 << 30) - Quantity::parse("100Mi").unwrap();
        assert_eq!(diff.value(), ParsedQuantity::from_units((1 << 30) - (100 << 20)));
        assert_eq!(diff.to_string(), "924Mi");
        // Finer fractions stay exact, as in Go (no rounding up to a milli unit).
        let fine = Quantity::parse("1n").unwrap() + Quantity::parse("2n").unwrap();
        assert_eq!(fine.value().nanos(), 3);
        assert_eq!(fine.to_string(), "3n");
        assert_eq!((Quantity::ZERO - Quantity::parse("1n").unwrap()).value().nanos(), -1);
    }
}
