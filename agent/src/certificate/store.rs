//! Certificate/key pairs on disk: `<prefix>-<time>.pem` files and the
//! `<prefix>-current.pem` symlink (upstream's `certificate.FileStore`).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::{Error, Result};

/// A certificate chain with its key, both as PEM (re-encoded: only the certificates in
/// `cert_pem`, only the key in `key_pem`) and as rustls serves them, and what the agent
/// reads from the leaf.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// The leaf's subject common name.
    pub common_name: String,
    /// The leaf's subject organizations.
    pub organizations: Vec<String>,
    /// The leaf's DNS names and IP addresses (subject alternative names).
    pub names: Vec<String>,
    /// The chain with its signing key (checked to be the leaf's), ready to serve.
    pub certified: Arc<CertifiedKey>,
}

/// Pairs are equal when their PEM is: every other field is read from it.
impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cert_pem == other.cert_pem && self.key_pem == other.key_pem
    }
}

impl Eq for Pair {}

impl Pair {
    /// Parses a chain and its key, checking that the key is the leaf's.
    pub fn parse(cert_pem: &str, key_pem: &str, origin: &Path) -> Result<Self> {
        let bad = |message: String| Error::BadPair { path: origin.display().to_string(), message };
        let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert_pem.as_bytes())
            .collect::<std::io::Result<_>>()
            .map_err(|e| bad(format!("reading the certificates: {e}")))?;
        let Some(leaf_der) = certs.first() else {
            return Err(bad("no PEM certificate".into()));
        };
        let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key_pem.as_bytes())
            .map_err(|e| bad(format!("reading the private key: {e}")))?
            .ok_or_else(|| bad("no PEM private key".into()))?;
        let (label, key_der) = match &key {
            PrivateKeyDer::Pkcs1(k) => ("RSA PRIVATE KEY", k.secret_pkcs1_der()),
            PrivateKeyDer::Sec1(k) => ("EC PRIVATE KEY", k.secret_sec1_der()),
            PrivateKeyDer::Pkcs8(k) => ("PRIVATE KEY", k.secret_pkcs8_der()),
            _ => return Err(bad("unsupported private key type".into())),
        };
        let key_pem = pem_block(label, key_der);
        let cert_pem: String = certs.iter().map(|c| pem_block("CERTIFICATE", c)).collect();
        let provider = rustls::crypto::ring::default_provider();
        let signing = provider.key_provider.load_private_key(key).map_err(|e| bad(format!("the private key: {e}")))?;
        let certified = CertifiedKey::new(certs.clone(), signing);
        certified.keys_match().map_err(|e| bad(format!("the key does not belong to the certificate: {e}")))?;
        let (_, leaf) =
            x509_parser::parse_x509_certificate(leaf_der).map_err(|e| bad(format!("parsing the certificate: {e}")))?;
        let time = |t: x509_parser::time::ASN1Time| {
            let secs = t.timestamp();
            if secs >= 0 {
                SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
            } else {
                SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
            }
        };
        let subject = leaf.subject();
        let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| attr.as_str().ok().map(str::to_owned);
        Ok(Self {
            cert_pem,
            key_pem,
            not_before: time(leaf.validity().not_before),
            not_after: time(leaf.validity().not_after),
            common_name: subject.iter_common_name().find_map(text).unwrap_or_default(),
            organizations: subject.iter_organization().filter_map(text).collect(),
            names: crate::server::tls::subject_alt_names(&leaf),
            certified: Arc::new(certified),
        })
    }

    /// The pair as one PEM file: certificates, then the key (as upstream stores it).
    #[must_use]
    pub fn to_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.key_pem)
    }

    /// Whether the certificate is past its `notAfter` at `now`.
    #[must_use]
    pub fn expired_at(&self, now: SystemTime) -> bool {
        now > self.not_after
    }

    /// Seconds from `now` to `notAfter` (negative once expired).
    #[must_use]
    pub fn ttl_secs(&self, now: SystemTime) -> f64 {
        match self.not_after.duration_since(now) {
            Ok(left) => left.as_secs_f64(),
            Err(past) => -past.duration().as_secs_f64(),
        }
    }
}

/// One PEM block of `der` under `label`, in 64-character lines.
fn pem_block(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    let _ = writeln!(out, "-----END {label}-----");
    out
}

/// Reads a combined PEM file (certificates and key in one) as a pair.
pub fn read_combined(path: &Path) -> Result<Pair> {
    let pem =
        fs::read_to_string(path).map_err(|source| Error::Io { what: format!("reading {}", path.display()), source })?;
    Pair::parse(&pem, &pem, path)
}

/// Pairs named `<prefix>-…` in `dir`, with files of a kubeconfig to fall back on.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
    prefix: String,
    fallback: Option<(PathBuf, PathBuf)>,
}

impl FileStore {
    /// The store of `prefix` (`kubelet-client`) in `dir`; `fallback` is the certificate
    /// and key files used while no current pair exists.
    #[must_use]
    pub fn new(dir: &Path, prefix: &str, fallback: Option<(PathBuf, PathBuf)>) -> Self {
        Self { dir: dir.to_path_buf(), prefix: prefix.to_owned(), fallback }
    }

    /// `<dir>/<prefix>-current.pem`.
    #[must_use]
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    /// The current pair: the `-current.pem` link's, else the fallback files', else `None`.
    /// A file that exists but does not load is an error naming it.
    pub fn current(&self) -> Result<Option<Pair>> {
        let current = self.current_path();
        if current.exists() {
            return read_combined(&current).map(Some);
        }
        match &self.fallback {
            Some((cert, key)) if cert.exists() && key.exists() => {
                let read = |p: &Path| {
                    fs::read_to_string(p)
                        .map_err(|source| Error::Io { what: format!("reading {}", p.display()), source })
                };
                Pair::parse(&read(cert)?, &read(key)?, cert).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Stores a new pair as `<prefix>-<time>.pem` and points `-current.pem` at it. The
    /// pair is checked first: a certificate that is not the key's is refused, and the
    /// current pair stays.
    pub fn update(&self, cert_pem: &str, key_pem: &str) -> Result<Pair> {
        let name = format!("{}-{}.pem", self.prefix, jiff::Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S"));
        let path = self.dir.join(&name);
        let pair = Pair::parse(cert_pem, key_pem, &path)?;
        let io = |what: String| move |source| Error::Io { what, source };
        write_private(&path, pair.to_pem().as_bytes())?;
        // A new link beside the current one, renamed over it: the swap is atomic.
        let updated = self.dir.join(format!("{}-updated.pem", self.prefix));
        let _ = fs::remove_file(&updated);
        std::os::unix::fs::symlink(&path, &updated).map_err(io(format!("linking {}", updated.display())))?;
        let current = self.current_path();
        fs::rename(&updated, &current).map_err(io(format!("replacing {}", current.display())))?;
        Ok(pair)
    }
}

/// Writes a file readable by its owner only, through a temporary file and a rename
/// ([`crate::cm::checkpoint::write_atomic`], which makes the directory too).
pub(crate) fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    crate::cm::checkpoint::write_atomic(path, contents)
        .map_err(|source| Error::Io { what: format!("writing {}", path.display()), source })
}

#[cfg(test)]
pub(crate) use tests::pair_pem;

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed pair valid from `from` to `until` (seconds from now).
    pub(crate) fn pair_pem(cn: &str, from: i64, until: i64) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "system:nodes");
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::seconds(from);
        params.not_after = now + time::Duration::seconds(until);
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    #[test]
    fn update_links_current_to_the_newest_pair_and_current_reads_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path(), "kubelet-client", None);
        assert_eq!(store.current().unwrap(), None);
        let (cert, key) = pair_pem("system:node:n1", -60, 3600);
        let stored = store.update(&cert, &key).unwrap();
        assert_eq!(stored.common_name, "system:node:n1");
        assert_eq!(stored.organizations, vec!["system:nodes".to_owned()]);
        let current = store.current().unwrap().unwrap();
        assert_eq!(current, Pair::parse(&current.to_pem(), &current.to_pem(), dir.path()).unwrap());
        assert_eq!(current.cert_pem.trim(), cert.trim());
        let target = fs::read_link(store.current_path()).unwrap();
        assert!(target.file_name().unwrap().to_str().unwrap().starts_with("kubelet-client-2"), "{target:?}");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&target).unwrap().permissions()) & 0o777,
            0o600
        );
        assert!(!current.expired_at(SystemTime::now()));
        assert!(current.ttl_secs(SystemTime::now()) > 3500.0);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_and_the_current_pair_stays() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path(), "kubelet-client", None);
        let (cert, key) = pair_pem("system:node:n1", -60, 3600);
        store.update(&cert, &key).unwrap();
        let (other_cert, _) = pair_pem("system:node:n1", -60, 3600);
        let err = store.update(&other_cert, &key).unwrap_err();
        assert!(err.to_string().contains("does not belong to the certificate"), "{err}");
        assert_eq!(store.current().unwrap().unwrap().cert_pem.trim(), cert.trim());
    }

    #[test]
    fn without_a_current_pair_the_fallback_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair_pem("system:node:n2", -60, 60);
        fs::write(dir.path().join("c.pem"), &cert).unwrap();
        fs::write(dir.path().join("k.pem"), &key).unwrap();
        let store =
            FileStore::new(dir.path(), "kubelet-client", Some((dir.path().join("c.pem"), dir.path().join("k.pem"))));
        assert_eq!(store.current().unwrap().unwrap().common_name, "system:node:n2");
        fs::write(dir.path().join("k.pem"), "garbage").unwrap();
        let err = store.current().unwrap_err();
        assert!(err.to_string().contains("c.pem") && err.to_string().contains("no PEM private key"), "{err}");
    }

    #[test]
    fn an_expired_pair_says_so() {
        let (cert, key) = pair_pem("system:node:n3", -7200, -3600);
        let pair = Pair::parse(&cert, &key, Path::new("x")).unwrap();
        assert!(pair.expired_at(SystemTime::now()));
        assert!(pair.ttl_secs(SystemTime::now()) < -3500.0);
    }
}
