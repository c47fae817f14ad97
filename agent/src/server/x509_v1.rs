//! X.509 v1 client certificates, as `openssl x509 -req` makes them without an extension
//! file. webpki, which rustls checks certificates with, refuses any certificate below v3
//! (`UnsupportedCertVersion`), so such a client's handshake used to fail; Go's
//! `crypto/x509`, and so the upstream kubelet, accepts a v1 leaf. Here a v1 *leaf* is
//! verified on its own terms, with the signature algorithms of the same rustls provider
//! (none with SHA-1), and v3 certificates go through webpki as before:
//!
//! - in the handshake, the client's `CertificateVerify` signature is checked with the
//!   leaf's public key, as rustls does for any certificate, without parsing it as v3;
//! - per request ([`verify_chain`]), the leaf must be valid now and signed directly by a
//!   certificate of `clientCAFile` whose subject is the leaf's issuer. That CA must be
//!   valid now, be a CA (`basicConstraints` `cA`), may sign certificates (`keyUsage`
//!   `keyCertSign`, when it has one) and have no name constraints (they could not be
//!   checked against a v1 leaf here). No intermediates: a v1 certificate has no extension
//!   to vouch for a chain, and a v1 intermediate is refused by Go too.
//!
//! A v1 leaf has no extended key usage, which Go takes as any usage: it authenticates as a
//! client, as upstream's x509 authenticator lets it.

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, SignatureVerificationAlgorithm, SubjectPublicKeyInfoDer, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, PeerMisbehaved};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::ParsedExtension;

/// A DER element: its tag, its contents, the whole element, and what follows it.
type Element<'a> = (u8, &'a [u8], &'a [u8], &'a [u8]);

/// The DER element at the start of `input`.
fn element(input: &[u8]) -> Option<Element<'_>> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    let header = input.len() - rest.len();
    Some((tag, &rest[..len], &input[..header + len], &rest[len..]))
}

/// The parts of a certificate that its signature covers and is made of.
struct Signed<'a> {
    /// The whole `tbsCertificate` element: the signed data.
    tbs: &'a [u8],
    /// The contents of `signatureAlgorithm`.
    algorithm: &'a [u8],
    signature: &'a [u8],
    /// No `version` field: v1 (DER leaves the default out).
    v1: bool,
}

fn signed(cert: &[u8]) -> Option<Signed<'_>> {
    let (0x30, body, _, []) = element(cert)? else { return None };
    let (0x30, tbs_body, tbs, rest) = element(body)? else { return None };
    let (0x30, algorithm, _, rest) = element(rest)? else { return None };
    let (0x03, bits, _, []) = element(rest)? else { return None };
    let (0, signature) = bits.split_first()? else { return None };
    Some(Signed { tbs, algorithm, signature, v1: tbs_body.first() != Some(&0xa0) })
}

/// The contents of a `SubjectPublicKeyInfo`'s algorithm, and the key.
fn public_key(spki: &[u8]) -> Option<(&[u8], &[u8])> {
    let (0x30, body, _, []) = element(spki)? else { return None };
    let (0x30, algorithm, _, rest) = element(body)? else { return None };
    let (0x03, bits, _, []) = element(rest)? else { return None };
    let (0, key) = bits.split_first()? else { return None };
    Some((algorithm, key))
}

/// Whether `signature` over `message` verifies with the key of `spki` under one of
/// `algorithms` (one for that kind of key and, when given, that signature algorithm).
fn verifies(
    algorithms: &[&'static dyn SignatureVerificationAlgorithm],
    signature_algorithm: Option<&[u8]>,
    spki: &[u8],
    message: &[u8],
    signature: &[u8],
) -> bool {
    let Some((key_algorithm, key)) = public_key(spki) else { return false };
    algorithms.iter().any(|a| {
        a.public_key_alg_id().as_ref() == key_algorithm
            && signature_algorithm.is_none_or(|s| a.signature_alg_id().as_ref() == s)
            && a.verify_signature(key, message, signature).is_ok()
    })
}

/// Whether `cert` is an X.509 v1 certificate.
#[must_use]
pub(crate) fn is_v1(cert: &[u8]) -> bool {
    signed(cert).is_some_and(|s| s.v1)
}

/// Checks the client's handshake signature with the key of the v1 certificate `cert`
/// (rustls' `verify_tls12_signature` / `verify_tls13_signature`, which would refuse to
/// parse it).
pub(crate) fn verify_handshake_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algorithms: &WebPkiSupportedAlgorithms,
    tls13: bool,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert).map_err(|_| rustls::Error::from(CertificateError::BadEncoding))?;
    let spki = parsed.public_key().raw;
    if tls13 {
        // rustls' own check for a bare key: the TLS 1.3 schemes only.
        return rustls::crypto::verify_tls13_signature_with_raw_key(
            message,
            &SubjectPublicKeyInfoDer::from(spki),
            dss,
            algorithms,
        );
    }
    let candidates = algorithms
        .mapping
        .iter()
        .find_map(|(scheme, algs)| (*scheme == dss.scheme).then_some(*algs))
        .ok_or(PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme)?;
    if verifies(candidates, None, spki, message, dss.signature()) {
        Ok(HandshakeSignatureValid::assertion())
    } else {
        Err(CertificateError::BadSignature.into())
    }
}

/// Whether `t` is within the certificate's validity period.
fn valid_at(cert: &X509Certificate<'_>, now: UnixTime) -> bool {
    let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    cert.validity().not_before.timestamp() <= now && now <= cert.validity().not_after.timestamp()
}

/// Why `ca` may not have signed a v1 client certificate, if it may not.
fn unfit_issuer(ca: &X509Certificate<'_>, now: UnixTime) -> Option<&'static str> {
    if !valid_at(ca, now) {
        return Some("the CA certificate is not valid now");
    }
    if !ca.basic_constraints().ok().flatten().is_some_and(|bc| bc.value.ca) {
        return Some("the CA certificate is not a CA (basicConstraints)");
    }
    if ca.key_usage().ok().flatten().is_some_and(|ku| !ku.value.key_cert_sign()) {
        return Some("the CA certificate may not sign certificates (keyUsage)");
    }
    if ca.extensions().iter().any(|e| matches!(e.parsed_extension(), ParsedExtension::NameConstraints(_))) {
        return Some("the CA certificate has name constraints, which a v1 certificate cannot be checked against");
    }
    None
}

/// Verifies the v1 client certificate `leaf` (sent with `intermediates`) against the
/// certificates of the client CA bundle, `roots` (see the module docs).
pub(crate) fn verify_chain(
    leaf: &[u8],
    intermediates: &[CertificateDer<'_>],
    roots: &[CertificateDer<'static>],
    algorithms: &WebPkiSupportedAlgorithms,
    now: UnixTime,
) -> Result<(), String> {
    let signed = signed(leaf).filter(|s| s.v1).ok_or("not an X.509 v1 certificate")?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|e| format!("bad certificate: {e}"))?;
    if !intermediates.is_empty() {
        return Err("a v1 client certificate must be signed by a certificate of the client CA bundle itself".into());
    }
    if cert.signature_algorithm != cert.tbs_certificate.signature {
        return Err("the certificate's two signature algorithms differ".into());
    }
    if !valid_at(&cert, now) {
        return Err("the certificate has expired or is not yet valid".into());
    }
    let mut refused = None;
    for root in roots {
        let Ok((_, ca)) = x509_parser::parse_x509_certificate(root) else { continue };
        if ca.subject().as_raw() != cert.issuer().as_raw() {
            continue;
        }
        if let Some(why) = unfit_issuer(&ca, now) {
            refused = Some(why);
            continue;
        }
        if verifies(algorithms.all, Some(signed.algorithm), ca.public_key().raw, signed.tbs, signed.signature) {
            return Ok(());
        }
    }
    Err(match refused {
        Some(why) => format!("v1 certificate: {why}"),
        None => "v1 certificate: not signed by a certificate of the client CA bundle".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_elements_short_and_long_lengths() {
        let short = [0x04, 0x02, 0xaa, 0xbb, 0xff];
        assert_eq!(element(&short), Some((0x04, &short[2..4], &short[..4], &short[4..])));
        let mut long = vec![0x04, 0x81, 0x80];
        long.extend([7; 0x80]);
        let (tag, contents, whole, rest) = element(&long).unwrap();
        assert_eq!((tag, contents.len(), whole.len(), rest.len()), (0x04, 0x80, 0x83, 0));
        assert_eq!(element(&[0x04, 0x03, 0x00]), None, "truncated");
        assert_eq!(element(&[0x04, 0x80]), None, "indefinite length is not DER");
    }

    #[test]
    fn a_v3_certificate_is_not_v1() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["x".to_owned()]).unwrap().self_signed(&key).unwrap();
        assert!(signed(cert.der()).is_some());
        assert!(!is_v1(cert.der()));
        let algorithms = rustls::crypto::ring::default_provider().signature_verification_algorithms;
        let refused = verify_chain(cert.der(), &[], &[], &algorithms, UnixTime::now()).unwrap_err();
        assert_eq!(refused, "not an X.509 v1 certificate");
    }
}
