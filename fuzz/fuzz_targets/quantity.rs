//! Resource quantities (`types::quantity`, what pod specs, `evictionHard`, `systemReserved`
//! and friends are read with), the eviction manager's printed quantities
//! (`types::quantity::Quantity`), the conversions to bytes and milli-CPU, and Go durations (the
//! other unit-bearing strings of the configuration and the flags).
//!
//! The input is one string. Besides never panicking, these must hold:
//! - `parse(q.to_string()) == q`, exactly (the log form is whole or nano units);
//! - `value()` is `milli_value()` rounded away from zero once more, and `parse_bytes` /
//!   `parse_milli_cpu` agree with them;
//! - the eviction manager's canonical form (Go's `Quantity.String()`) parses back to the
//!   same value and prints the same again;
//! - `binary_si(n)` parses back to `n` bytes;
//! - a Go duration prints back to a string that parses to the same duration.

#![no_main]

use libfuzzer_sys::fuzz_target;
use swiftlet::config::GoDuration;
use swiftlet::types::quantity::{self, Quantity};

fuzz_target!(|data: &[u8]| {
    if data.len() >= 8 {
        let n = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
        binary_si_round_trip(n);
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    quantity_properties(text);
    duration_round_trip(text);
});

fn quantity_properties(text: &str) {
    let parsed = quantity::parse(text);
    let eviction = Quantity::parse(text);
    assert_eq!(parsed.is_ok(), eviction.is_ok(), "{text:?}: the two parsers disagree");
    let Ok(q) = parsed else {
        // The error names the input; rendering it must not panic.
        let _ = parsed.map_err(|e| e.to_string());
        return;
    };

    let shown = q.to_string();
    assert_eq!(quantity::parse(&shown), Ok(q), "{text:?} shown as {shown:?}");

    let (milli, units) = (q.milli_value(), q.value());
    if let (Some(milli), Some(units)) = (milli, units) {
        let again = i64::try_from(i128::from(milli).unsigned_abs().div_ceil(1000)).expect("fits");
        assert_eq!(units, if milli < 0 { -again } else { again }, "{text:?}: value vs milli_value");
    }
    assert_eq!(quantity::parse_bytes(text).ok(), units, "{text:?}: parse_bytes");
    assert_eq!(quantity::parse_milli_cpu(text).ok(), milli, "{text:?}: parse_milli_cpu");

    let e = eviction.expect("checked above");
    assert_eq!(e.value(), q, "{text:?}: the eviction quantity's value");
    let canonical = e.to_string();
    let back = Quantity::parse(&canonical).unwrap_or_else(|err| panic!("{text:?} printed as {canonical:?}: {err}"));
    assert_eq!(back.value(), q, "{text:?} printed as {canonical:?}");
    // As Go's, the canonical form may change format once: "62.5Ki" (binary SI, 64000)
    // prints "64000", which parses as decimal SI and prints "64k". From there it is stable.
    let second = back.to_string();
    let third = Quantity::parse(&second).unwrap_or_else(|err| panic!("{text:?} printed as {second:?}: {err}"));
    assert_eq!(third.value(), q, "{text:?} printed as {second:?}");
    assert_eq!(third.to_string(), second, "{text:?}: the canonical form is not stable");
}

fn binary_si_round_trip(n: u64) {
    let text = quantity::binary_si(n);
    match i64::try_from(n) {
        Ok(bytes) => assert_eq!(quantity::parse_bytes(&text), Ok(bytes), "{n} as {text:?}"),
        // Past i64 the BinarySI cap applies, as in Go.
        Err(_) => assert!(quantity::parse(&text).is_ok(), "{n} as {text:?}"),
    }
}

fn duration_round_trip(text: &str) {
    let Ok(d) = text.parse::<GoDuration>() else { return };
    let shown = d.to_string();
    assert_eq!(shown.parse::<GoDuration>(), Ok(d), "{text:?} shown as {shown:?}");
}
