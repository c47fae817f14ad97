//! TLS of the HTTPS API: the serving certificate (`tlsCertFile`/`tlsPrivateKeyFile`, or a
//! self-signed one in the cert dir as the kubelet makes), client certificate verification
//! against `authentication.x509.clientCAFile`, and the cipher suites / minimum version.
//!
//! The rustls configuration names the ring provider explicitly, so nothing here depends on
//! a process-wide default provider having been installed.

use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig, SupportedCipherSuite};

use super::{Error, Result};
use crate::config::tls_cipher_suite_id;

/// File name of the self-signed certificate in the cert dir (as upstream).
pub const SELF_SIGNED_CERT_FILE: &str = "kubelet.crt";
/// File name of the self-signed certificate's key in the cert dir (as upstream).
pub const SELF_SIGNED_KEY_FILE: &str = "kubelet.key";

/// Validity of a generated certificate: one year, as upstream.
const SELF_SIGNED_VALIDITY: time::Duration = time::Duration::days(365);

/// Where the serving certificate comes from and how clients are verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// `tlsCertFile` and `tlsPrivateKeyFile`; `None` means self-signed in `cert_dir`.
    pub cert_and_key: Option<(PathBuf, PathBuf)>,
    /// `--cert-dir`: where the self-signed certificate is kept.
    pub cert_dir: PathBuf,
    /// Names the self-signed certificate covers (the node name and the hostname);
    /// `localhost`, `127.0.0.1` and `::1` are always added.
    pub names: Vec<String>,
    /// `authentication.x509.clientCAFile`.
    pub client_ca_file: Option<PathBuf>,
    /// `tlsCipherSuites` (Go names); empty means the rustls defaults.
    pub cipher_suites: Vec<String>,
    /// `tlsMinVersion`: "", `VersionTLS12` or `VersionTLS13`.
    pub min_version: String,
}

/// Builds the rustls server configuration (writing a self-signed certificate if needed).
pub(crate) fn server_config(settings: &TlsSettings) -> Result<ServerConfig> {
    let provider = Arc::new(provider(settings)?);
    let (certs, key) = match &settings.cert_and_key {
        Some((cert, key)) => (read_certs(cert)?, read_key(key)?),
        None => self_signed(&settings.cert_dir, &settings.names, &provider)?,
    };
    let versions: &[&rustls::SupportedProtocolVersion] = if settings.min_version == "VersionTLS13" {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS12, &rustls::version::TLS13]
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| Error::Tls(format!("protocol versions: {e}")))?;
    let builder = match &settings.client_ca_file {
        Some(ca_file) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca_file)? {
                roots.add(cert).map_err(|e| Error::Tls(format!("clientCAFile {}: {e}", ca_file.display())))?;
            }
            // Requests without a certificate must still reach authentication (anonymous),
            // so a certificate is optional; one that is presented must verify.
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| Error::Tls(format!("clientCAFile {}: {e}", ca_file.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config =
        builder.with_single_cert(certs, key).map_err(|e| Error::Tls(format!("serving certificate: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The ring provider restricted to the configured TLS 1.2 suites (TLS 1.3 suites are
/// always on, as in Go).
fn provider(settings: &TlsSettings) -> Result<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    if settings.cipher_suites.is_empty() {
        return Ok(provider);
    }
    let mut wanted = Vec::new();
    for name in &settings.cipher_suites {
        let id = tls_cipher_suite_id(name)
            .ok_or_else(|| Error::Tls(format!("tlsCipherSuites: unsupported cipher suite {name:?}")))?;
        wanted.push(id);
    }
    provider.cipher_suites.retain(|suite| match suite {
        SupportedCipherSuite::Tls13(_) => true,
        SupportedCipherSuite::Tls12(_) => wanted.contains(&u16::from(suite.suite())),
    });
    Ok(provider)
}

/// The certificate and key in `cert_dir`, reused when still usable, else generated and
/// written there (as the kubelet does when `tlsCertFile` is not set).
fn self_signed(
    cert_dir: &Path,
    names: &[String],
    provider: &CryptoProvider,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let cert_path = cert_dir.join(SELF_SIGNED_CERT_FILE);
    let key_path = cert_dir.join(SELF_SIGNED_KEY_FILE);
    if cert_path.exists() && key_path.exists() {
        match reusable(&cert_path, &key_path, names, provider) {
            Ok(pair) => {
                tracing::info!(cert = %cert_path.display(), "using the existing self-signed serving certificate");
                return Ok(pair);
            }
            Err(reason) => tracing::warn!(
                cert = %cert_path.display(),
                %reason,
                "regenerating the self-signed serving certificate"
            ),
        }
    }
    let (cert_pem, key_pem) = generate_self_signed(names)?;
    fs::create_dir_all(cert_dir)
        .map_err(|source| Error::Io { what: format!("creating cert dir {}", cert_dir.display()), source })?;
    write_file(&key_path, key_pem.as_bytes(), 0o600)?;
    write_file(&cert_path, cert_pem.as_bytes(), 0o644)?;
    tracing::info!(cert = %cert_path.display(), "generated a self-signed serving certificate");
    Ok((read_certs(&cert_path)?, read_key(&key_path)?))
}

/// The pair at these paths if it parses, has not expired, covers every name and the key
/// belongs to the certificate; else why not.
fn reusable(
    cert_path: &Path,
    key_path: &Path,
    names: &[String],
    provider: &CryptoProvider,
) -> std::result::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let certs = read_certs(cert_path).map_err(|e| e.to_string())?;
    let key = read_key(key_path).map_err(|e| e.to_string())?;
    let (_, leaf) = x509_parser::parse_x509_certificate(&certs[0]).map_err(|e| e.to_string())?;
    if !leaf.validity().is_valid() {
        return Err("the certificate is expired or not yet valid".to_owned());
    }
    let covered = subject_alt_names(&leaf);
    if let Some(missing) = names.iter().find(|name| !covered.contains(name)) {
        return Err(format!("the certificate does not name {missing:?}"));
    }
    let signing_key = provider.key_provider.load_private_key(key.clone_key()).map_err(|e| e.to_string())?;
    CertifiedKey::new(certs.clone(), signing_key)
        .keys_match()
        .map_err(|e| format!("the key does not match the certificate: {e}"))?;
    Ok((certs, key))
}

/// The DNS names and IP addresses a certificate is valid for.
pub(crate) fn subject_alt_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            GeneralName::IPAddress(bytes) => ip_from_bytes(bytes),
            _ => None,
        })
        .collect()
}

fn ip_from_bytes(bytes: &[u8]) -> Option<String> {
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(ip.to_string())
}

/// A self-signed ECDSA P-256 serving certificate for `names`, `localhost`, `127.0.0.1` and `::1`,
/// valid for a year, as PEM (certificate, key).
fn generate_self_signed(names: &[String]) -> Result<(String, String)> {
    let rcgen_err = |e: rcgen::Error| Error::Tls(format!("generating a self-signed certificate: {e}"));
    let mut sans: Vec<String> = Vec::new();
    let defaults = ["localhost".to_owned(), Ipv4Addr::LOCALHOST.to_string(), Ipv6Addr::LOCALHOST.to_string()];
    for name in names.iter().chain(&defaults) {
        if !name.is_empty() && !sans.contains(name) {
            sans.push(name.clone());
        }
    }
    let mut params = rcgen::CertificateParams::new(sans).map_err(rcgen_err)?;
    let now = time::OffsetDateTime::now_utc();
    let primary = names.first().map_or("localhost", String::as_str);
    // Upstream names the certificate `<host>@<unix time>`, which tells generations apart.
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("{primary}@{}", now.unix_timestamp()));
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + SELF_SIGNED_VALIDITY;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature, rcgen::KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().map_err(rcgen_err)?;
    let cert = params.self_signed(&key).map_err(rcgen_err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes through a temporary file and a rename, so a crash never leaves half a key.
fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io_err = |source| Error::Io { what: format!("writing {}", path.display()), source };
    let tmp = path.with_extension("tmp");
    let mut file =
        fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp).map_err(io_err)?;
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(io_err)?;
    fs::rename(&tmp, path).map_err(io_err)
}

/// Every certificate of a PEM file (at least one).
pub(crate) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let what = || format!("reading certificates from {}", path.display());
    let pem = fs::read(path).map_err(|source| Error::Io { what: what(), source })?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<io::Result<Vec<_>>>()
        .map_err(|source| Error::Io { what: what(), source })?;
    if certs.is_empty() {
        return Err(Error::Tls(format!("{} contains no PEM certificate", path.display())));
    }
    Ok(certs)
}

/// The first private key of a PEM file.
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let what = || format!("reading the private key from {}", path.display());
    let pem = fs::read(path).map_err(|source| Error::Io { what: what(), source })?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|source| Error::Io { what: what(), source })?
        .ok_or_else(|| Error::Tls(format!("{} contains no PEM private key", path.display())))
}
