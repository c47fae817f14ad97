//! Registry credentials for image pulls: the kubelet's docker keyring (upstream
//! `pkg/credentialprovider` `keyring.go`, `config.go`, `provider.go` and
//! `pkg/credentialprovider/secrets`).
//!
//! Where credentials come from:
//! - the pod's `imagePullSecrets`: secrets of type `kubernetes.io/dockerconfigjson` (data
//!   key `.dockerconfigjson`, `{"auths": {<registry>: <entry>}}`) and the legacy
//!   `kubernetes.io/dockercfg` (data key `.dockercfg`, `{<registry>: <entry>}`). A secret
//!   of another type, or without its data key, is ignored, as upstream;
//! - node-level docker config files ([`NodeCredentials`]).
//!
//! An entry has `username`, `password`, `email` and `auth`; a non-empty `auth`
//! (`base64(username:password)`, padded or not) replaces `username` and `password`. As in
//! Go's `encoding/json`, field names match case-insensitively and unknown fields are
//! ignored. Upstream reads nothing else from an entry, so neither do we: `identitytoken`
//! and `registrytoken` are ignored, and the CRI `AuthConfig` carries only the username and
//! password.
//!
//! Registry keys are normalised as upstream's `BasicDockerKeyring.Add`: an `http://` or
//! `https://` scheme is dropped, a leading `/v1/` or `/v2/` of the path counts as no path,
//! and the key is `host[:port][/path]`. A lookup matches a key against the image's
//! repository as upstream's `URLsMatch`: same port, same number of dot-separated host
//! labels, each label a glob (`*.example.com`, `registry-?.example.com`), and the key's
//! path a string prefix of the repository's path (`example.com/team` matches
//! `example.com/team-b/app`, as upstream). Keys are tried in reverse lexical order, so the
//! longer of two overlapping keys (`quay.io/team` before `quay.io`) comes first, and every
//! match is returned: the caller tries each credential in turn until a pull succeeds.
//! When nothing matched and the image is on Docker Hub (`docker.io/...`, `index.docker.io`
//! or a name without a registry), the credentials filed under `index.docker.io` (e.g. the
//! docker CLI's `https://index.docker.io/v1/`) are used.
//!
//! One deliberate difference from upstream: a malformed pull secret (invalid JSON, bad
//! base64 in `auth`, `auth` without `:`) is skipped with a [`CredentialError`] that names
//! the secret and the field, instead of failing the whole pull; the other secrets still
//! count. A registry key that is not a valid address only drops that entry (as upstream,
//! which logs and ignores it).
//!
//! Secrets never leak: [`Credential`]'s `Debug` and `Display` redact the username and the
//! password, and no error message quotes a value from a secret (JSON errors are reported by
//! position only). The CRI `AuthConfig` built by [`Credential::auth_config`] is a generated
//! type whose `Debug` prints everything: never log it.

use crate::images::puller::{ImageNameError, ImageReference};
use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use base64::Engine as _;
use k8s_cri::v1::AuthConfig;
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Map, Value};

/// Secret type of a `~/.docker/config.json`-style pull secret.
pub const SECRET_TYPE_DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
/// Its data key.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// Secret type of a legacy `~/.dockercfg` pull secret.
pub const SECRET_TYPE_DOCKERCFG: &str = "kubernetes.io/dockercfg";
/// Its data key.
pub const DOCKERCFG_KEY: &str = ".dockercfg";

/// The key Docker Hub credentials are filed under once normalised (`https://index.docker.io/v1/`).
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";
/// How long node-level credential files are cached (upstream's `CachingDockerConfigProvider`).
pub const NODE_CREDENTIALS_LIFETIME: Duration = Duration::from_mins(5);

/// Where a credential was found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CredentialSource {
    /// An `imagePullSecret` of the pod.
    Secret { namespace: String, name: String },
    /// A node-level docker config file.
    File(PathBuf),
}

impl fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Secret { namespace, name } => write!(f, "imagePullSecret {namespace}/{name}"),
            Self::File(path) => write!(f, "docker config file {}", path.display()),
        }
    }
}

/// One set of registry credentials (upstream `AuthConfig` as the keyring fills it).
///
/// `Debug` and `Display` never show the username or the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    registry: String,
    source: CredentialSource,
    username: String,
    password: String,
    email: String,
}

impl Credential {
    /// The normalised registry key this credential is filed under (`quay.io/team`).
    #[must_use]
    pub fn registry(&self) -> &str {
        &self.registry
    }

    #[must_use]
    pub fn source(&self) -> &CredentialSource {
        &self.source
    }

    #[must_use]
    pub fn username(&self) -> &str {
        &self.username
    }

    #[must_use]
    pub fn password(&self) -> &str {
        &self.password
    }

    /// Deprecated docker field, kept because upstream keeps it; never sent to the runtime.
    #[must_use]
    pub fn email(&self) -> &str {
        &self.email
    }

    /// Whether the entry had neither a username nor a password (a pull with it is anonymous).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.username.is_empty() && self.password.is_empty()
    }

    /// The CRI `AuthConfig` for `PullImage`, filled as upstream's `kuberuntime` does
    /// (username and password; `auth`, `server_address` and the tokens stay empty).
    /// Its `Debug` prints the password: never log it.
    #[must_use]
    pub fn auth_config(&self) -> AuthConfig {
        AuthConfig { username: self.username.clone(), password: self.password.clone(), ..AuthConfig::default() }
    }
}

impl From<&Credential> for AuthConfig {
    fn from(c: &Credential) -> Self {
        c.auth_config()
    }
}

fn redacted(value: &str) -> &'static str {
    if value.is_empty() { "<empty>" } else { "<redacted>" }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("registry", &self.registry)
            .field("source", &self.source)
            .field("username", &format_args!("{}", redacted(&self.username)))
            .field("password", &format_args!("{}", redacted(&self.password)))
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "credentials for {} from {}", self.registry, self.source)
    }
}

/// What is wrong with a pull secret or a docker config file. No variant carries a value
/// read from the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// Not JSON at all (reported by position only: serde's messages may quote input).
    #[error("is not valid JSON ({category} error at line {line}, column {column})")]
    Json { category: &'static str, line: usize, column: usize },
    #[error("must be a JSON object")]
    NotObject,
    #[error("must be a string")]
    NotString,
    #[error("is not valid base64")]
    AuthBase64,
    #[error("must be base64(username:password) but the decoded value has no ':'")]
    AuthNoColon,
    #[error("decodes to bytes that are not UTF-8")]
    AuthNotUtf8,
    /// The registry key is not a valid address; only this entry is dropped.
    #[error("is not a valid registry address ({0}); entry ignored")]
    InvalidRegistry(String),
}

/// A malformed pull secret or docker config file, naming where and which field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {field} {problem}{}", if self.skips_source() { " (skipped)" } else { "" })]
pub struct CredentialError {
    /// The secret or file.
    pub origin: CredentialSource,
    /// The field, e.g. `.dockerconfigjson auths["quay.io"].auth`.
    pub field: String,
    pub problem: Problem,
}

impl CredentialError {
    /// Whether the whole secret or file was skipped (every problem but an invalid
    /// registry key, which drops only its entry).
    #[must_use]
    pub fn skips_source(&self) -> bool {
        !matches!(self.problem, Problem::InvalidRegistry(_))
    }
}

/// A docker config entry after parsing: what a registry key maps to.
#[derive(Default, Clone, PartialEq, Eq)]
struct Entry {
    username: String,
    password: String,
    email: String,
}

/// Parsed docker config: (registry key as written, its path in the document, entry), in
/// the document's key order.
type Entries = Vec<(String, String, Entry)>;

/// Where in a document a problem is, and what it is.
type ParseError = (String, Problem);

fn parse_json(bytes: &[u8]) -> Result<Value, Problem> {
    serde_json::from_slice(bytes).map_err(|e| Problem::Json {
        category: match e.classify() {
            serde_json::error::Category::Io => "I/O",
            serde_json::error::Category::Syntax => "syntax",
            serde_json::error::Category::Data => "data",
            serde_json::error::Category::Eof => "unexpected end of input",
        },
        line: e.line(),
        column: e.column(),
    })
}

/// A field of a JSON object the way Go's `encoding/json` finds it: the exact name, else
/// the first case-insensitive match.
fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).or_else(|| obj.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v))
}

/// A string field; absent and `null` are empty, as when Go decodes into a `string`.
fn string_field(obj: &Map<String, Value>, name: &str, at: &str) -> Result<String, ParseError> {
    match field(obj, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err((format!("{at}.{name}"), Problem::NotString)),
    }
}

/// Decodes an `auth` field: `base64(username:password)`, padded or not (upstream picks
/// the padded or the raw decoder by a trailing `=`; accepting both is the same). Line
/// breaks are ignored as Go's decoder ignores them, and so are non-zero trailing bits.
fn decode_auth(auth: &str) -> Result<(String, String), Problem> {
    const ENGINE: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let cleaned: String = auth.chars().filter(|c| *c != '\n' && *c != '\r').collect();
    let decoded = ENGINE.decode(cleaned.as_bytes()).map_err(|_| Problem::AuthBase64)?;
    let decoded = String::from_utf8(decoded).map_err(|_| Problem::AuthNotUtf8)?;
    let (user, pass) = decoded.split_once(':').ok_or(Problem::AuthNoColon)?;
    Ok((user.to_owned(), pass.to_owned()))
}

fn parse_entry(value: &Value, at: &str) -> Result<Entry, ParseError> {
    let obj = match value {
        // Go leaves the entry empty.
        Value::Null => return Ok(Entry::default()),
        Value::Object(obj) => obj,
        _ => return Err((at.to_owned(), Problem::NotObject)),
    };
    let mut entry = Entry {
        username: string_field(obj, "username", at)?,
        password: string_field(obj, "password", at)?,
        email: string_field(obj, "email", at)?,
    };
    let auth = string_field(obj, "auth", at)?;
    if !auth.is_empty() {
        let (user, pass) = decode_auth(&auth).map_err(|p| (format!("{at}.auth"), p))?;
        entry.username = user;
        entry.password = pass;
    }
    Ok(entry)
}

/// A `{<registry>: <entry>}` map (a `.dockercfg`, or `auths` of a config.json).
fn parse_entries(value: &Value, at: &str) -> Result<Entries, ParseError> {
    let obj = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Object(obj) => obj,
        _ => return Err((at.to_owned(), Problem::NotObject)),
    };
    obj.iter()
        .map(|(registry, v)| {
            let path = format!("{at}[{registry:?}]");
            let entry = parse_entry(v, &path)?;
            Ok((registry.clone(), path, entry))
        })
        .collect()
}

/// Parses a `.dockerconfigjson` / `config.json`: `{"auths": {...}}`. Other top-level
/// fields (`HttpHeaders`, `credsStore`, ...) are ignored.
fn parse_docker_config_json(bytes: &[u8]) -> Result<Entries, ParseError> {
    match parse_json(bytes).map_err(|p| (String::new(), p))? {
        Value::Null => Ok(Vec::new()),
        Value::Object(obj) => field(&obj, "auths").map_or(Ok(Vec::new()), |auths| parse_entries(auths, "auths")),
        _ => Err((String::new(), Problem::NotObject)),
    }
}

/// Parses a legacy `.dockercfg`: `{<registry>: <entry>}`.
fn parse_dockercfg(bytes: &[u8]) -> Result<Entries, ParseError> {
    let value = parse_json(bytes).map_err(|p| (String::new(), p))?;
    parse_entries(&value, "")
}

/// Which of the two docker config formats a document is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigFormat {
    /// `{"auths": {...}}`: `.dockerconfigjson` secrets, `~/.docker/config.json`.
    ConfigJson,
    /// `{...}`: `.dockercfg` secrets and files.
    Dockercfg,
}

impl ConfigFormat {
    fn parse(self, bytes: &[u8]) -> Result<Entries, ParseError> {
        match self {
            Self::ConfigJson => parse_docker_config_json(bytes),
            Self::Dockercfg => parse_dockercfg(bytes),
        }
    }
}

/// A field path as reported in errors: `<data key> <path in the document>`.
fn field_name(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (true, true) => "document".to_owned(),
        (true, false) => path.to_owned(),
        (false, true) => prefix.to_owned(),
        (false, false) => format!("{prefix} {path}"),
    }
}

// ---------------------------------------------------------------------------------------
// URLs the way upstream's keyring parses them (Go's `net/url` on "https://" + key).

/// The host (with port) and path of `https://<schemeless>` as Go's `url.Parse` splits
/// it. Errors are Go's: control characters, a bad port, a bad character in the host, a
/// bad percent-escape in the path.
fn parse_url(url: &str) -> Result<(String, String), String> {
    if url.chars().any(|c| c.is_ascii_control()) {
        return Err("control character".into());
    }
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")).unwrap_or(url);
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| (&rest[..i], &rest[i..]));
    // Userinfo (`user@`) is not part of the host.
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    validate_host(host)?;
    Ok((host.to_owned(), percent_decode(path)?))
}

fn validate_host(host: &str) -> Result<(), String> {
    let port = if let Some(bracketed) = host.strip_prefix('[') {
        let end = bracketed.find(']').ok_or("missing ']' in host")?;
        &bracketed[end + 1..]
    } else {
        host.rfind(':').map_or("", |i| &host[i..])
    };
    let port_ok = port.is_empty() || (port.starts_with(':') && port[1..].bytes().all(|b| b.is_ascii_digit()));
    if !port_ok {
        return Err(format!("invalid port {port:?} after host"));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || !c.is_ascii() || "-._~!$&'()*+,;=:[]<>\"".contains(c);
    if let Some(bad) = host.chars().find(|c| !allowed(*c)) {
        return Err(format!("invalid character {bad:?} in host name"));
    }
    Ok(())
}

fn percent_decode(path: &str) -> Result<String, String> {
    if !path.contains('%') {
        return Ok(path.to_owned());
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = path.get(i + 1..i + 3).filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
            let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or("invalid URL escape")?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "escape is not UTF-8".to_owned())
}

/// The keyring key of a registry as written in a docker config (upstream `Add`).
fn normalize_registry(registry: &str) -> Result<String, String> {
    let (host, path) = parse_url(registry)?;
    // Docker treats `/v1/` and `/v2/` as the registry itself.
    let path = if path.starts_with("/v1/") || path.starts_with("/v2/") { &path[3..] } else { &path[..] };
    Ok(if path.is_empty() || path == "/" { host } else { format!("{host}{path}") })
}

/// Go's `net.SplitHostPort`, falling back to (whole host, no port) on error as upstream's
/// `SplitURL` does.
fn split_host_port(host: &str) -> (&str, &str) {
    fn split(h: &str) -> Option<(&str, &str)> {
        let colon = h.rfind(':')?;
        let (name, port) = if let Some(inner) = h.strip_prefix('[') {
            let end = inner.find(']')?;
            // `]` (at `end + 1` in `h`) must be followed by the port's colon.
            if colon != end + 2 {
                return None;
            }
            (&inner[..end], &h[colon + 1..])
        } else {
            let name = &h[..colon];
            if name.contains(':') {
                return None;
            }
            (name, &h[colon + 1..])
        };
        let brackets = |s: &str| s.contains(['[', ']']);
        if brackets(port) || (!h.starts_with('[') && brackets(name)) {
            return None;
        }
        Some((name, port))
    }
    split(host).unwrap_or((host, ""))
}

/// Upstream `URLsMatch` on schemeless strings: `glob` is a keyring key, `target` an image
/// repository. Unparseable input or a malformed glob never matches.
#[must_use]
pub fn urls_match(glob: &str, target: &str) -> bool {
    let (Ok((glob_host, glob_path)), Ok((target_host, target_path))) = (parse_url(glob), parse_url(target)) else {
        return false;
    };
    let (glob_name, glob_port) = split_host_port(&glob_host);
    let (target_name, target_port) = split_host_port(&target_host);
    if glob_port != target_port || !target_path.starts_with(&glob_path) {
        return false;
    }
    let glob_labels: Vec<&str> = glob_name.split('.').collect();
    let target_labels: Vec<&str> = target_name.split('.').collect();
    glob_labels.len() == target_labels.len()
        && glob_labels.iter().zip(&target_labels).all(|(g, t)| Glob::compile(g).is_some_and(|g| g.matches(t)))
}

/// A pattern of Go's `path/filepath.Match`: `*`, `?`, `[...]` / `[^...]` classes with
/// ranges, `\` escapes. `*` and `?` never match `/`.
#[derive(Debug)]
struct Glob(Vec<Token>);

#[derive(Debug)]
enum Token {
    Star,
    AnyChar,
    Literal(char),
    Class { negated: bool, ranges: Vec<(char, char)> },
}

impl Glob {
    /// `None` for a malformed pattern (Go's `ErrBadPattern`).
    fn compile(pattern: &str) -> Option<Self> {
        let mut chars = pattern.chars().peekable();
        let mut tokens = Vec::new();
        while let Some(c) = chars.next() {
            tokens.push(match c {
                '*' => Token::Star,
                '?' => Token::AnyChar,
                '\\' => Token::Literal(chars.next()?),
                '[' => {
                    let negated = chars.next_if_eq(&'^').is_some();
                    let mut ranges = Vec::new();
                    loop {
                        if chars.peek() == Some(&']') && !ranges.is_empty() {
                            chars.next();
                            break;
                        }
                        let class_char = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| match chars.next()? {
                            '-' | ']' => None,
                            '\\' => chars.next(),
                            c => Some(c),
                        };
                        let lo = class_char(&mut chars)?;
                        let hi = if chars.next_if_eq(&'-').is_some() { class_char(&mut chars)? } else { lo };
                        if hi < lo {
                            return None;
                        }
                        ranges.push((lo, hi));
                    }
                    Token::Class { negated, ranges }
                }
                c => Token::Literal(c),
            });
        }
        Some(Self(tokens))
    }

    fn matches(&self, name: &str) -> bool {
        let name: Vec<char> = name.chars().collect();
        Self::match_from(&self.0, &name)
    }

    fn match_from(tokens: &[Token], name: &[char]) -> bool {
        let Some((first, rest)) = tokens.split_first() else {
            return name.is_empty();
        };
        match first {
            Token::Star => (0..=name.len())
                .take_while(|&i| i == 0 || name[i - 1] != '/')
                .any(|i| Self::match_from(rest, &name[i..])),
            Token::AnyChar => name.first().is_some_and(|c| *c != '/') && Self::match_from(rest, &name[1..]),
            Token::Literal(l) => name.first() == Some(l) && Self::match_from(rest, &name[1..]),
            Token::Class { negated, ranges } => {
                name.first().is_some_and(|c| *c != '/' && ranges.iter().any(|(lo, hi)| lo <= c && c <= hi) != *negated)
                    && Self::match_from(rest, &name[1..])
            }
        }
    }
}

/// Upstream `isDefaultRegistryMatch`: whether `image` is pulled from Docker Hub.
#[must_use]
pub fn is_default_registry_match(image: &str) -> bool {
    let mut parts = image.splitn(2, '/');
    let first = parts.next().unwrap_or_default();
    if first.is_empty() {
        return false;
    }
    if parts.next().is_none() {
        return true;
    }
    first == "docker.io" || first == "index.docker.io" || !first.contains(['.', ':'])
}

// ---------------------------------------------------------------------------------------
// The keyring.

/// Registry credentials indexed by normalised registry key (upstream `BasicDockerKeyring`).
#[derive(Debug, Default, Clone)]
pub struct Keyring {
    /// Key -> credentials in the order they were added. Iterated in reverse: longer
    /// (more specific) keys of the same prefix first.
    creds: BTreeMap<String, Vec<Credential>>,
}

impl Keyring {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.creds.is_empty()
    }

    /// Number of credentials (not keys).
    #[must_use]
    pub fn len(&self) -> usize {
        self.creds.values().map(Vec::len).sum()
    }

    /// Adds the entries of one parsed document; returns the entries whose registry key
    /// is not a valid address (they are dropped).
    fn add(&mut self, source: &CredentialSource, field_prefix: &str, entries: Entries) -> Vec<CredentialError> {
        let mut errors = Vec::new();
        for (registry, path, entry) in entries {
            match normalize_registry(&registry) {
                Ok(key) => self.creds.entry(key.clone()).or_default().push(Credential {
                    registry: key,
                    source: source.clone(),
                    username: entry.username,
                    password: entry.password,
                    email: entry.email,
                }),
                Err(reason) => errors.push(CredentialError {
                    origin: source.clone(),
                    field: field_name(field_prefix, &path),
                    problem: Problem::InvalidRegistry(reason),
                }),
            }
        }
        errors
    }

    /// Parses `bytes` in `format` and adds what it holds; a document that does not parse
    /// adds nothing and is reported.
    pub fn add_document(
        &mut self,
        source: &CredentialSource,
        field_prefix: &str,
        format: ConfigFormat,
        bytes: &[u8],
    ) -> Vec<CredentialError> {
        match format.parse(bytes) {
            Ok(entries) => self.add(source, field_prefix, entries),
            Err((path, problem)) => {
                vec![CredentialError { origin: source.clone(), field: field_name(field_prefix, &path), problem }]
            }
        }
    }

    /// The keyring of a pod's pull secrets (upstream `secrets.MakeDockerKeyring` without
    /// the union): secrets in the order given. Malformed secrets are skipped and reported.
    pub fn from_pull_secrets<'a>(secrets: impl IntoIterator<Item = &'a Secret>) -> (Self, Vec<CredentialError>) {
        let mut keyring = Self::new();
        let mut errors = Vec::new();
        for secret in secrets {
            let (format, key) = match secret.type_.as_deref() {
                Some(SECRET_TYPE_DOCKER_CONFIG_JSON) => (ConfigFormat::ConfigJson, DOCKER_CONFIG_JSON_KEY),
                Some(SECRET_TYPE_DOCKERCFG) => (ConfigFormat::Dockercfg, DOCKERCFG_KEY),
                _ => continue,
            };
            let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(key)).filter(|b| !b.0.is_empty()) else {
                continue;
            };
            let source = CredentialSource::Secret {
                namespace: secret.metadata.namespace.clone().unwrap_or_default(),
                name: secret.metadata.name.clone().unwrap_or_default(),
            };
            errors.extend(keyring.add_document(&source, key, format, &bytes.0));
        }
        (keyring, errors)
    }

    /// Credentials for `repository` (a normalised repository without tag or digest, e.g.
    /// `quay.io/team/app` or `docker.io/library/busybox`: see [`credentials_for_image`]),
    /// most specific key first (upstream `BasicDockerKeyring.Lookup`).
    #[must_use]
    pub fn lookup(&self, repository: &str) -> Vec<&Credential> {
        let found: Vec<&Credential> =
            self.creds.iter().rev().filter(|(key, _)| urls_match(key, repository)).flat_map(|(_, c)| c).collect();
        if found.is_empty() && is_default_registry_match(repository) {
            return self.creds.get(DEFAULT_REGISTRY_HOST).into_iter().flatten().collect();
        }
        found
    }
}

/// Every credential to try, in order, for pulling `image` (as written in the pod spec):
/// the keyrings' lookups concatenated (upstream `UnionDockerKeyring`: the pull secrets'
/// keyring first, then the node's) for the image's normalized repository
/// ([`ImageReference`]: `busybox:1.36` → `docker.io/library/busybox`). Empty means pull
/// without credentials.
pub fn credentials_for_image(image: &str, keyrings: &[&Keyring]) -> Result<Vec<Credential>, ImageNameError> {
    let repository = ImageReference::parse(image)?.repository;
    Ok(keyrings.iter().flat_map(|k| k.lookup(&repository)).cloned().collect())
}

// ---------------------------------------------------------------------------------------
// Node-level credentials.

/// Credentials from a docker config file on the node (upstream's default
/// `.dockercfg` provider), re-read at most every [`NODE_CREDENTIALS_LIFETIME`].
///
/// Searched in upstream's order, and the first file that exists and parses wins:
/// 1. `<root-dir>/config.json` (the kubelet's `--root-dir`, upstream's "preferred path"),
/// 2. `$HOME/.docker/config.json`,
/// 3. `/.docker/config.json`,
/// 4. then the legacy format: `<root-dir>/.dockercfg`, `$HOME/.dockercfg`, `/.dockercfg`.
///
/// Upstream also looks in the process's working directory; a daemon's working directory
/// is incidental (whatever its service manager chose), so we do not.
#[derive(Debug)]
pub struct NodeCredentials {
    search: Vec<(PathBuf, ConfigFormat)>,
    lifetime: Duration,
    cache: Mutex<Option<(Instant, Arc<Keyring>)>>,
}

impl NodeCredentials {
    /// The standard search for the agent with root dir `root_dir` and `$HOME`.
    #[must_use]
    pub fn new(root_dir: &Path) -> Self {
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
        Self::with_search(Self::search_paths(root_dir, home.as_deref()), NODE_CREDENTIALS_LIFETIME)
    }

    #[must_use]
    pub fn with_search(search: Vec<(PathBuf, ConfigFormat)>, lifetime: Duration) -> Self {
        Self { search, lifetime, cache: Mutex::new(None) }
    }

    /// The files looked at, in order (see the type's docs).
    #[must_use]
    pub fn search_paths(root_dir: &Path, home: Option<&Path>) -> Vec<(PathBuf, ConfigFormat)> {
        let root = Path::new("/");
        let mut dirs = vec![root_dir];
        dirs.extend(home);
        let mut paths: Vec<(PathBuf, ConfigFormat)> = Vec::new();
        let mut push = |p: PathBuf, f| {
            if !paths.iter().any(|(q, _)| *q == p) {
                paths.push((p, f));
            }
        };
        push(root_dir.join("config.json"), ConfigFormat::ConfigJson);
        if let Some(home) = home {
            push(home.join(".docker/config.json"), ConfigFormat::ConfigJson);
        }
        push(root.join(".docker/config.json"), ConfigFormat::ConfigJson);
        for dir in dirs.into_iter().chain([root]) {
            push(dir.join(".dockercfg"), ConfigFormat::Dockercfg);
        }
        paths
    }

    /// The current node keyring (cached for the lifetime).
    pub fn keyring(&self) -> Arc<Keyring> {
        self.keyring_at(Instant::now())
    }

    /// [`Self::keyring`] at a given time (tests).
    pub fn keyring_at(&self, now: Instant) -> Arc<Keyring> {
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((expires, keyring)) = cache.as_ref()
            && now < *expires
        {
            return Arc::clone(keyring);
        }
        let (keyring, found, errors) = Self::load(&self.search);
        for e in &errors {
            // Upstream logs these at V(4) and moves on to the next file.
            tracing::debug!(error = %e, "ignoring node docker config file");
        }
        if let Some(path) = &found {
            tracing::debug!(path = %path.display(), credentials = keyring.len(), "node registry credentials");
        } else {
            tracing::debug!("no node docker config file");
        }
        let keyring = Arc::new(keyring);
        *cache = Some((now + self.lifetime, Arc::clone(&keyring)));
        keyring
    }

    /// Reads the first file of `search` that exists and parses: the keyring, the file,
    /// and what was wrong with the files tried before it (or with dropped entries of it).
    pub fn load(search: &[(PathBuf, ConfigFormat)]) -> (Keyring, Option<PathBuf>, Vec<CredentialError>) {
        let mut errors = Vec::new();
        for (path, format) in search {
            let bytes = match std::fs::read(path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "cannot read docker config file");
                    continue;
                }
            };
            let source = CredentialSource::File(path.clone());
            let mut keyring = Keyring::new();
            let file_errors = keyring.add_document(&source, "", *format, &bytes);
            let skipped = file_errors.iter().any(CredentialError::skips_source);
            errors.extend(file_errors);
            if !skipped {
                return (keyring, Some(path.clone()), errors);
            }
        }
        (Keyring::new(), None, errors)
    }
}

#[cfg(test)]
mod tests;
