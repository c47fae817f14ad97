//! TLS of the HTTPS API: the serving certificate (`tlsCertFile`/`tlsPrivateKeyFile`, or a
//! self-signed one in the cert dir as the kubelet makes), client certificates checked
//! against `authentication.x509.clientCAFile`, and the cipher suites / minimum version.
//!
//! # Reloading
//! `tlsCertFile`/`tlsPrivateKeyFile` and `clientCAFile` are re-read when they change, as
//! upstream's dynamic certificate controllers do: each TLS handshake (serving pair) or each
//! request with a client certificate (CA bundle) compares the files' inode, size and mtime
//! with what was loaded, which costs a `stat` and catches in-place writes, renames and
//! Kubernetes' symlink swaps alike. A change that does not load (half-written files, a key
//! that does not match the certificate) is logged once and the previous material keeps
//! serving. The self-signed pair is made once at start and not watched (upstream neither).
//!
//! # Client certificates
//! As upstream (`ClientAuth: RequestClientCert` with the x509 authenticator behind it),
//! the handshake only asks for a client certificate and checks that the client holds its
//! key (the `CertificateVerify` signature); whether the chain leads to the client CA is
//! decided per request by [`ClientCa::verify`], in authentication. A certificate from
//! another CA therefore gets 401 like upstream rather than a failed handshake, and a
//! reloaded CA bundle applies to connections already open. The CA names hinted in the
//! handshake are those of the bundle at start (upstream: the same). X.509 v1 client
//! certificates, which webpki refuses, are checked by [`super::x509_v1`] in both places.
//! A failed handshake is logged with the peer's address and the TLS error.
//!
//! The rustls configuration names the ring provider explicitly, so nothing here depends on
//! a process-wide default provider having been installed.

use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::SystemTime;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme, SupportedCipherSuite,
};

use super::{Error, Result};
use crate::types::tls::tls_cipher_suite_id;

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
    /// Re-read when they change.
    pub cert_and_key: Option<(PathBuf, PathBuf)>,
    /// `--cert-dir`: where the self-signed certificate is kept.
    pub cert_dir: PathBuf,
    /// Names the self-signed certificate covers (the node name and the hostname);
    /// `localhost`, `127.0.0.1` and `::1` are always added.
    pub names: Vec<String>,
    /// `authentication.x509.clientCAFile`; re-read when it changes.
    pub client_ca_file: Option<PathBuf>,
    /// `tlsCipherSuites` (Go names); empty means the rustls defaults.
    pub cipher_suites: Vec<String>,
    /// `tlsMinVersion`: "", `VersionTLS12` or `VersionTLS13`.
    pub min_version: String,
    /// `serverTLSBootstrap`: the pair comes from the serving certificate manager through
    /// this slot, and wins over `cert_and_key` and the self-signed pair.
    pub bootstrap: Option<ServingSlot>,
}

/// The serving pair that `serverTLSBootstrap`'s certificate manager keeps current. Empty
/// until the first certificate is issued: handshakes fail meanwhile, as upstream's ("no
/// serving certificate available for the kubelet").
#[derive(Clone, Default)]
pub struct ServingSlot(Arc<RwLock<Option<Arc<CertifiedKey>>>>);

impl ServingSlot {
    /// Serves `certified` from the next handshake on (a [`crate::certificate::store::Pair`]'s,
    /// whose key was checked to be the certificate's when it was parsed).
    pub fn set(&self, certified: Arc<CertifiedKey>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(certified);
    }

    /// Whether a pair is being served.
    #[must_use]
    pub fn is_set(&self) -> bool {
        self.0.read().unwrap_or_else(PoisonError::into_inner).is_some()
    }
}

impl PartialEq for ServingSlot {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ServingSlot {}

impl std::fmt::Debug for ServingSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ServingSlot").field(&self.is_set()).finish()
    }
}

impl ResolvesServerCert for ServingSlot {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self.0.read().unwrap_or_else(PoisonError::into_inner).clone();
        if current.is_none() {
            tracing::warn!("TLS handshake refused: no serving certificate available for the kubelet yet");
        }
        current
    }
}

/// The rustls configuration of the HTTPS API and the client CA that authentication checks
/// client certificates against.
#[derive(Debug)]
pub(crate) struct Tls {
    pub config: ServerConfig,
    pub client_ca: Option<Arc<ClientCa>>,
}

/// Builds the rustls server configuration (writing a self-signed certificate if needed).
pub(crate) fn server_config(settings: &TlsSettings) -> Result<Tls> {
    let provider = Arc::new(provider(settings)?);
    let serving: Arc<dyn ResolvesServerCert> = if let Some(slot) = &settings.bootstrap {
        Arc::new(slot.clone())
    } else if let Some((cert, key)) = &settings.cert_and_key {
        let paths = vec![cert.clone(), key.clone()];
        let load_provider = provider.clone();
        Arc::new(ServingCertificate(Reloading::new("serving certificate", paths, move |paths| {
            certified_key(&paths[0], &paths[1], &load_provider)
        })?))
    } else {
        let (certs, key) = self_signed(&settings.cert_dir, &settings.names, &provider)?;
        let signing_key = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| Error::Tls(format!("self-signed serving key: {e}")))?;
        Arc::new(ServingCertificate(Reloading::fixed(CertifiedKey::new(certs, signing_key))))
    };
    let versions: &[&rustls::SupportedProtocolVersion] = if settings.min_version == "VersionTLS13" {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS12, &rustls::version::TLS13]
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| Error::Tls(format!("protocol versions: {e}")))?;
    let (builder, client_ca) = match &settings.client_ca_file {
        Some(ca_file) => {
            let client_ca = Arc::new(ClientCa::load(ca_file, provider.clone())?);
            let verifier = RequestClientCertificate {
                hints: client_ca.current().verifier.root_hint_subjects().to_vec(),
                algorithms: provider.signature_verification_algorithms,
            };
            (builder.with_client_cert_verifier(Arc::new(verifier)), Some(client_ca))
        }
        None => (builder.with_no_client_auth(), None),
    };
    let mut config = builder.with_cert_resolver(serving);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Tls { config, client_ca })
}

/// The pair in `cert_path`/`key_path`, checked to belong together.
fn certified_key(cert_path: &Path, key_path: &Path, provider: &CryptoProvider) -> Result<CertifiedKey> {
    let certs = read_certs(cert_path)?;
    let key = read_key(key_path)?;
    let signing_key =
        provider.key_provider.load_private_key(key).map_err(|e| Error::Tls(format!("{}: {e}", key_path.display())))?;
    let certified = CertifiedKey::new(certs, signing_key);
    certified
        .keys_match()
        .map_err(|e| Error::Tls(format!("{} does not match {}: {e}", key_path.display(), cert_path.display())))?;
    Ok(certified)
}

/// What identifies a version of a file: a rewrite in place changes the size or mtime, a
/// rename or symlink swap the inode.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl FileStamp {
    /// The stamp of `path` (following symlinks); `None` when it cannot be read.
    fn of(path: &Path) -> Option<Self> {
        let meta = fs::metadata(path).ok()?;
        Some(Self { dev: meta.dev(), ino: meta.ino(), len: meta.len(), modified: meta.modified().ok() })
    }
}

/// How a [`Reloading`] value is loaded from its files.
type LoadFn<T> = dyn Fn(&[PathBuf]) -> Result<T> + Send + Sync;

/// A value loaded from files and loaded again when they change (see the module docs).
struct Reloading<T> {
    what: &'static str,
    paths: Vec<PathBuf>,
    load: Box<LoadFn<T>>,
    state: RwLock<Loaded<T>>,
}

struct Loaded<T> {
    /// The files' stamps when `value` was loaded.
    stamps: Vec<Option<FileStamp>>,
    value: Arc<T>,
    /// The stamps of the last version that failed to load (logged once, not retried).
    failed: Option<Vec<Option<FileStamp>>>,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading").field("what", &self.what).field("paths", &self.paths).finish_non_exhaustive()
    }
}

impl<T> Reloading<T> {
    /// Loads `paths` now (an error here is fatal: there is nothing to fall back to).
    fn new(
        what: &'static str,
        paths: Vec<PathBuf>,
        load: impl Fn(&[PathBuf]) -> Result<T> + Send + Sync + 'static,
    ) -> Result<Self> {
        let stamps = paths.iter().map(|p| FileStamp::of(p)).collect();
        let value = Arc::new(load(&paths)?);
        Ok(Self { what, paths, load: Box::new(load), state: RwLock::new(Loaded { stamps, value, failed: None }) })
    }

    /// A value that never changes.
    fn fixed(value: T) -> Self {
        Self {
            what: "fixed",
            paths: Vec::new(),
            load: Box::new(|_| Err(Error::Tls("a fixed value is never reloaded".to_owned()))),
            state: RwLock::new(Loaded { stamps: Vec::new(), value: Arc::new(value), failed: None }),
        }
    }

    /// The current value, loaded again first if the files changed since.
    fn get(&self) -> Arc<T> {
        if self.paths.is_empty() {
            return self.state.read().unwrap_or_else(PoisonError::into_inner).value.clone();
        }
        let stamps: Vec<Option<FileStamp>> = self.paths.iter().map(|p| FileStamp::of(p)).collect();
        {
            let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
            if state.stamps == stamps || state.failed.as_ref() == Some(&stamps) {
                return state.value.clone();
            }
        }
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.stamps == stamps || state.failed.as_ref() == Some(&stamps) {
            return state.value.clone();
        }
        match (self.load)(&self.paths) {
            Ok(value) => {
                tracing::info!(what = self.what, files = ?self.paths, "reloaded after the files changed");
                *state = Loaded { stamps, value: Arc::new(value), failed: None };
            }
            Err(error) => {
                tracing::warn!(
                    what = self.what,
                    files = ?self.paths,
                    %error,
                    "the files changed but do not load; keeping the previous version"
                );
                state.failed = Some(stamps);
            }
        }
        state.value.clone()
    }
}

/// The serving certificate, re-read on change when it comes from files.
#[derive(Debug)]
struct ServingCertificate(Reloading<CertifiedKey>);

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get())
    }
}

/// `authentication.x509.clientCAFile`: the verifier of client certificate chains, re-read
/// when the file changes.
#[derive(Debug)]
pub(crate) struct ClientCa {
    bundle: Reloading<CaBundle>,
    algorithms: WebPkiSupportedAlgorithms,
}

/// One version of the client CA bundle.
struct CaBundle {
    /// webpki's verifier, for v3 certificates.
    verifier: Arc<dyn ClientCertVerifier>,
    /// The bundle's certificates, for v1 ones ([`super::x509_v1`]).
    roots: Vec<CertificateDer<'static>>,
}

impl ClientCa {
    fn load(path: &Path, provider: Arc<CryptoProvider>) -> Result<Self> {
        let algorithms = provider.signature_verification_algorithms;
        let bundle = Reloading::new("client CA bundle", vec![path.to_owned()], move |paths| {
            let ca_file = &paths[0];
            let certs = read_certs(ca_file)?;
            let mut roots = RootCertStore::empty();
            for cert in &certs {
                roots.add(cert.clone()).map_err(|e| Error::Tls(format!("clientCAFile {}: {e}", ca_file.display())))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated()
                .build()
                .map_err(|e| Error::Tls(format!("clientCAFile {}: {e}", ca_file.display())))?;
            Ok(CaBundle { verifier, roots: certs })
        })?;
        Ok(Self { bundle, algorithms })
    }

    fn current(&self) -> Arc<CaBundle> {
        self.bundle.get()
    }

    /// Whether the chain a client presented (leaf first, as sent) leads to the CA bundle
    /// and is valid now for client authentication; else why not.
    pub(crate) fn verify(&self, chain: &[Vec<u8>]) -> std::result::Result<(), String> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err("no client certificate".to_owned());
        };
        let intermediates: Vec<CertificateDer<'_>> =
            intermediates.iter().map(|c| CertificateDer::from(c.as_slice())).collect();
        let bundle = self.current();
        if super::x509_v1::is_v1(leaf) {
            return super::x509_v1::verify_chain(
                leaf,
                &intermediates,
                &bundle.roots,
                &self.algorithms,
                UnixTime::now(),
            )
            .map_err(|e| format!("verifying certificate: {e}"));
        }
        let leaf = CertificateDer::from(leaf.as_slice());
        bundle
            .verifier
            .verify_client_cert(&leaf, &intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(|e| format!("verifying certificate: {e}"))
    }
}

/// The handshake side of client certificates (see the module docs): asks for one, does not
/// require it, checks the client's signature with the certificate's key, and leaves the
/// chain to [`ClientCa::verify`].
#[derive(Debug)]
struct RequestClientCertificate {
    hints: Vec<DistinguishedName>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for RequestClientCertificate {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        // Deferred to authentication, which checks every request's chain (ClientCa::verify).
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        if super::x509_v1::is_v1(cert) {
            return super::x509_v1::verify_handshake_signature(message, cert, dss, &self.algorithms, false);
        }
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        if super::x509_v1::is_v1(cert) {
            return super::x509_v1::verify_handshake_signature(message, cert, dss, &self.algorithms, true);
        }
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
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
