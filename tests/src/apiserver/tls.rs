//! The cluster CA and TLS: a throw-away CA that signs the serving certificate (for
//! `localhost` and `127.0.0.1`), the client certificates tests ask for, and the
//! certificates the CSR signer issues. The kubeconfig carries the CA, so the client
//! verifies the server as it would a real cluster's.
//!
//! Client certificates are the x509 authenticator's (`apiserver/pkg/authentication/
//! request/x509`): the handshake asks for one (hinting the CA) but does not require it,
//! and takes what the client sends once the client has proven it holds the key. Each
//! request is then authenticated by verifying the chain to the CA, for `clientAuth`, at
//! the time of the request, as the real server does: a certificate that does not verify
//! is a 401, not a failed handshake.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rcgen::{PublicKeyData as _, SigningKey as _};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};

/// The cluster CA: its certificate, the key that signs, and the client-certificate
/// verifier built on it.
#[derive(Debug)]
pub(crate) struct ClusterCa {
    pub pem: String,
    der: CertificateDer<'static>,
    key: rcgen::KeyPair,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    verifier: Arc<dyn ClientCertVerifier>,
}

/// What a certificate is issued for.
pub(crate) struct Leaf<'a> {
    /// The subject, a DER `Name`.
    pub subject: &'a [u8],
    /// The subject's public key, a DER `SubjectPublicKeyInfo`.
    pub spki: &'a [u8],
    pub sans: Vec<rcgen::SanType>,
    pub key_usages: Vec<rcgen::KeyUsagePurpose>,
    pub extended_key_usages: Vec<rcgen::ExtendedKeyUsagePurpose>,
    /// Validity, Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
}

/// A client certificate that verified: who it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CertUser {
    /// The subject's common name.
    pub common_name: String,
    /// The subject's organizations, in order.
    pub organizations: Vec<String>,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Sets rcgen's validity from Unix seconds (without naming the `time` crate).
fn set_validity(params: &mut rcgen::CertificateParams, not_before: i64, not_after: i64) {
    let at = |s: i64| {
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        if s >= 0 {
            epoch + std::time::Duration::from_secs(s as u64)
        } else {
            epoch - std::time::Duration::from_secs(s.unsigned_abs())
        }
    };
    params.not_before = at(not_before);
    params.not_after = at(not_after);
}

impl ClusterCa {
    pub(crate) fn generate() -> Result<Self, String> {
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, "swiftlet-test-apiserver-ca");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).map_err(err)?;
        let signing = rcgen::KeyPair::from_pem(&key.serialize_pem()).map_err(err)?;
        let der = cert.der().clone();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der.clone()).map_err(err)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .allow_unauthenticated()
            .build()
            .map_err(err)?;
        Ok(Self { pem: cert.pem(), der, key: signing, issuer: rcgen::Issuer::new(params, key), verifier })
    }

    /// The TLS configuration of the server: a serving certificate for `localhost` and
    /// `127.0.0.1`, and optional client certificates.
    pub(crate) fn server_config(&self) -> Result<Arc<ServerConfig>, String> {
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).map_err(err)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).map_err(err)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(err)?
            .with_client_cert_verifier(Arc::new(RequestClientCert(self.verifier.clone())))
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec()), self.der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .map_err(err)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Authenticates a client's certificate chain now (`x509.Verifier` of the real
    /// authenticator): chains to the CA, valid now, for client auth.
    pub(crate) fn authenticate(&self, chain: &[CertificateDer<'static>]) -> Result<CertUser, String> {
        let (leaf, intermediates) = chain.split_first().ok_or("no client certificate")?;
        self.verifier.verify_client_cert(leaf, intermediates, UnixTime::now()).map_err(err)?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(err)?;
        let subject = cert.subject();
        let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| a.as_str().unwrap_or_default().to_string();
        Ok(CertUser {
            // The last one wins, as in Go's `pkix.Name`.
            common_name: subject.iter_common_name().last().map(text).unwrap_or_default(),
            organizations: subject.iter_organization().map(text).collect(),
        })
    }

    /// Issues a certificate signed by the CA.
    pub(crate) fn issue(&self, leaf: &Leaf<'_>) -> Result<Vec<u8>, String> {
        let mut params = rcgen::CertificateParams::default();
        let mut serial: [u8; 16] = rand::random();
        serial[0] &= 0x7f;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        params.subject_alt_names.clone_from(&leaf.sans);
        params.key_usages.clone_from(&leaf.key_usages);
        params.extended_key_usages.clone_from(&leaf.extended_key_usages);
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, leaf.not_before, leaf.not_after);
        // rcgen keeps one value per attribute type and needs the key's algorithm: it
        // builds the certificate, and the subject and public key are set in the DER
        // before it is signed again.
        let template = params.signed_by(&self.key, &self.issuer).map_err(err)?;
        self.resign(template.der(), leaf.subject, leaf.spki).ok_or_else(|| "malformed certificate template".into())
    }

    fn resign(&self, cert: &[u8], subject: &[u8], spki: &[u8]) -> Option<Vec<u8>> {
        let parts = der::children(der::content(cert)?)?;
        let tbs = der::children(der::content(parts.first()?)?)?;
        // version [0], serial, signature, issuer, validity, subject, subjectPublicKeyInfo, ...
        let first = usize::from(tbs.first()?.first() == Some(&0xa0));
        let mut body = Vec::new();
        for (i, t) in tbs.iter().enumerate() {
            body.extend_from_slice(match i.checked_sub(first) {
                Some(4) => subject,
                Some(5) => spki,
                _ => t,
            });
        }
        let tbs = der::tlv(0x30, &body);
        let mut sig = vec![0u8];
        sig.extend(self.key.sign(&tbs).ok()?);
        let mut out = tbs;
        out.extend_from_slice(parts.get(1)?);
        out.extend(der::tlv(0x03, &sig));
        Some(der::tlv(0x30, &out))
    }

    /// A new key and a certificate for it (client auth), as PEM.
    pub(crate) fn issue_client(
        &self,
        cn: &str,
        orgs: &[&str],
        not_before: i64,
        not_after: i64,
    ) -> Result<(String, String), String> {
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let subject = der::name(cn, orgs);
        let spki = key.subject_public_key_info();
        let cert = self.issue(&Leaf {
            subject: &subject,
            spki: &spki,
            sans: Vec::new(),
            key_usages: vec![rcgen::KeyUsagePurpose::DigitalSignature, rcgen::KeyUsagePurpose::KeyEncipherment],
            extended_key_usages: vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth],
            not_before,
            not_after,
        })?;
        Ok((pem("CERTIFICATE", &cert), key.serialize_pem()))
    }
}

/// PEM of one DER block.
pub(crate) fn pem(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// Asks for a client certificate without requiring one, and leaves the chain to the
/// per-request authentication (the handshake only checks the proof of possession).
#[derive(Debug)]
struct RequestClientCert(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Go's handshake fails only for a certificate it cannot parse.
        ParsedCertificate::try_from(end_entity)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Just enough DER to take a certificate apart and put it together again.
mod der {
    /// (header length, content length) of the TLV at the start of `b`.
    fn header(b: &[u8]) -> Option<(usize, usize)> {
        let l0 = *b.get(1)?;
        if l0 < 0x80 {
            return Some((2, usize::from(l0)));
        }
        let n = usize::from(l0 & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | usize::from(*b.get(2 + i)?);
        }
        Some((2 + n, len))
    }

    /// The content of the TLV `b`.
    pub(super) fn content(b: &[u8]) -> Option<&[u8]> {
        let (h, l) = header(b)?;
        b.get(h..h + l)
    }

    /// The TLVs one after the other in `content`.
    pub(super) fn children(mut content: &[u8]) -> Option<Vec<&[u8]>> {
        let mut out = Vec::new();
        while !content.is_empty() {
            let (h, l) = header(content)?;
            out.push(content.get(..h + l)?);
            content = &content[h + l..];
        }
        Some(out)
    }

    pub(super) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let n = content.len();
        if n < 0x80 {
            out.push(n as u8);
        } else {
            let bytes = n.to_be_bytes();
            let skip = bytes.iter().take_while(|b| **b == 0).count();
            out.push(0x80 | (bytes.len() - skip) as u8);
            out.extend_from_slice(&bytes[skip..]);
        }
        out.extend_from_slice(content);
        out
    }

    /// A `Name` with the organizations and the common name (Go's RDN order), each a
    /// `UTF8String` in its own RDN.
    pub(super) fn name(cn: &str, orgs: &[&str]) -> Vec<u8> {
        let rdn = |oid: &[u8], v: &str| tlv(0x31, &tlv(0x30, &[tlv(0x06, oid), tlv(0x0c, v.as_bytes())].concat()));
        let mut rdns: Vec<u8> = orgs.iter().flat_map(|o| rdn(&[0x55, 4, 10], o)).collect();
        if !cn.is_empty() {
            rdns.extend(rdn(&[0x55, 4, 3], cn));
        }
        tlv(0x30, &rdns)
    }
}
