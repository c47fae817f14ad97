//! The image manager: making sure a container's image is on the node before the container
//! is created (upstream `pkg/kubelet/images`: `imageManager.EnsureImageExists`, the serial
//! and parallel pullers, `throttledImageService`, and the keyring loop of
//! `kubeGenericRuntimeManager.PullImage`).
//!
//! [`ImageManager::ensure_image_exists`] does what upstream does, with its events and
//! waiting reasons:
//! 1. The image gets the default tag when it has neither tag nor digest (`busybox` is
//!    pulled as `busybox:latest`); a name that does not parse is `InvalidImageName`.
//! 2. The pull policy ([`PullPolicy::of`]; when the field is absent, the API server's
//!    defaulting: tag `latest`, or no tag and no digest, is `Always`, anything else
//!    `IfNotPresent`). `IfNotPresent` and `Never` ask the runtime first (`ImageStatus`):
//!    a present image is used as is (`Pulled`, "already present on machine"); an absent
//!    one with `Never` is `ErrImageNeverPull`.
//! 3. Per (pod, image) back-off: 10 s after a failed pull, doubling up to 5 min
//!    (`flowcontrol.Backoff` as the kubelet makes it for images, without jitter). The
//!    failing attempt is `ErrImagePull`; attempts while backing off are
//!    `ImagePullBackOff` without a pull. An entry is forgotten once it has not been
//!    updated for twice the maximum (10 min); as upstream, a success does not reset it.
//! 4. The pull: one queue and one worker when `serializeImagePulls` (upstream
//!    `serialImagePuller`, queue of 10), else each pull at once, at most
//!    `maxParallelImagePulls` at a time. A token bucket of `registryPullQPS` /
//!    `registryBurst` (0 QPS: no limit) is asked when a pull starts; without a token the
//!    pull fails at once with "pull QPS exceeded", as upstream's `throttledImageService`.
//!    The candidate credentials are tried in order; the first success wins, and when all
//!    fail the error is upstream's aggregate of every attempt's error. No credentials:
//!    one anonymous pull.
//! 5. `kubelet_image_pull_duration_seconds` observes the time from `Pulling` to the end of
//!    the pull, queue wait included; the `Pulled` event names both times.
//!
//! Runtime errors read as the Go CRI client prints them (`rpc error: code = NotFound desc
//! = ...`; the code is dropped for `Unknown`, as upstream's client does for pulls), so
//! events and waiting messages look like a kubelet's. Credentials are never logged.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ImageVolumeSource, ObjectReference, Pod};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tracing::Instrument as _;

use super::metrics::{ImageMetrics, ImageSizeLabels, image_size_bucket};
use crate::container::{RuntimeService, api};
use crate::events::{EventRecorder, EventType, container_ref, pod_ref};
use crate::pod_startup::PodStartupTracker;

/// Waiting reasons of image errors (upstream `images/types.go` and `cri-api/pkg/errors`).
pub mod reasons {
    /// A pull failed.
    pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
    /// A pull is not attempted: the last one failed and its back-off is running.
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    /// The image is absent and the pull policy is `Never`.
    pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    /// The image name does not parse.
    pub const INVALID_IMAGE_NAME: &str = "InvalidImageName";
    /// `ImageStatus` failed.
    pub const IMAGE_INSPECT_ERROR: &str = "ImageInspectError";
    /// The runtime said the registry is unavailable.
    pub const REGISTRY_UNAVAILABLE: &str = "RegistryUnavailable";
    /// The runtime said the image's signature did not validate.
    pub const SIGNATURE_VALIDATION_FAILED: &str = "SignatureValidationFailed";
}

/// Event reasons of the image manager (upstream `pkg/kubelet/events`).
pub mod events {
    pub const PULLING_IMAGE: &str = "Pulling";
    pub const PULLED_IMAGE: &str = "Pulled";
    pub const FAILED_TO_PULL_IMAGE: &str = "Failed";
    pub const FAILED_TO_INSPECT_IMAGE: &str = "InspectFailed";
    pub const ERR_IMAGE_NEVER_PULL_POLICY: &str = "ErrImageNeverPull";
    pub const BACK_OFF_PULL_IMAGE: &str = "BackOff";
}

/// First delay after a failed pull (upstream `backOffPeriod`).
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// Longest delay between pulls (upstream `MaxContainerBackOff`, `MaxImageBackOff`).
pub const BACKOFF_MAX: Duration = Duration::from_mins(5);
/// Pull requests the serial puller queues before callers wait (`maxImagePullRequests`).
pub const MAX_QUEUED_PULLS: usize = 10;
/// When a caller should try again after an error that has no back-off of its own: the
/// pod worker's retry period after a failed sync upstream (`workerBackOffPeriod`).
const RETRY_WITHOUT_BACKOFF: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// Image references

/// Why an image reference does not parse, with the messages of the Go libraries the
/// kubelet uses (`github.com/distribution/reference`, `go-digest`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("invalid reference format")]
    InvalidFormat,
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    RepositoryNotLowercase(String),
    #[error("repository name must be lowercase")]
    NameContainsUppercase,
    #[error("repository name must not be more than 255 characters")]
    NameTooLong,
    #[error("invalid repository name ({0}), cannot specify 64-byte hexadecimal strings")]
    Identifier(String),
    #[error("invalid checksum digest format")]
    DigestFormat,
    #[error("invalid checksum digest length")]
    DigestLength,
    #[error("unsupported digest algorithm")]
    DigestUnsupported,
}

/// An image name that does not parse (upstream `parsers.ParseImageName`'s error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("couldn't parse image name {image:?}: {source}")]
pub struct ImageNameError {
    pub image: String,
    #[source]
    pub source: ReferenceError,
}

/// A parsed image reference, normalized as `ParseNormalizedNamed` does: `busybox` is
/// `docker.io/library/busybox`, `localhost:5000/app:v1` keeps its registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReference {
    /// The normalized repository (`docker.io/library/busybox`): the name a keyring looks
    /// credentials up by (upstream `repoToPull`).
    pub repository: String,
    /// The tag as written, if any.
    pub tag: Option<String>,
    /// The digest (`sha256:<hex>`), if any.
    pub digest: Option<String>,
}

/// Longest repository path (`RepositoryNameTotalLengthMax`).
const MAX_REPOSITORY_PATH: usize = 255;

impl ImageReference {
    /// Parses `image` as the kubelet does (`ParseNormalizedNamed`).
    pub fn parse(image: &str) -> Result<Self, ImageNameError> {
        parse_normalized(image).map_err(|source| ImageNameError { image: image.to_string(), source })
    }

    /// The tag the image is pulled by: the written one, else `latest` when there is no
    /// digest either (upstream `ParseImageName`).
    #[must_use]
    pub fn effective_tag(&self) -> Option<&str> {
        match (&self.tag, &self.digest) {
            (Some(t), _) => Some(t),
            (None, None) => Some("latest"),
            (None, Some(_)) => None,
        }
    }
}

fn parse_normalized(s: &str) -> Result<ImageReference, ReferenceError> {
    if s.len() == 64 && s.bytes().all(|b| matches!(b, b'a'..=b'f' | b'0'..=b'9')) {
        return Err(ReferenceError::Identifier(s.to_string()));
    }
    let (domain, remainder) = split_docker_domain(s);
    let remote = remainder.split(':').next().unwrap_or_default();
    if remote.to_lowercase() != remote {
        return Err(ReferenceError::RepositoryNotLowercase(remote.to_string()));
    }
    parse_reference(&format!("{domain}/{remainder}"))
}

/// Upstream `splitDockerDomain`: the registry part of a familiar name, defaulting to
/// Docker Hub, whose single-component names live under `library/`.
fn split_docker_domain(name: &str) -> (String, String) {
    const DEFAULT_DOMAIN: &str = "docker.io";
    let (domain, remote) = match name.split_once('/') {
        None => return (DEFAULT_DOMAIN.to_string(), format!("library/{name}")),
        Some(("index.docker.io", rest)) => (DEFAULT_DOMAIN, rest),
        Some((first, rest)) if first == "localhost" || first.contains(['.', ':']) || first.to_lowercase() != first => {
            (first, rest)
        }
        Some(_) => (DEFAULT_DOMAIN, name),
    };
    let remote = if domain == DEFAULT_DOMAIN && !remote.contains('/') {
        format!("library/{remote}")
    } else {
        remote.to_string()
    };
    (domain.to_string(), remote)
}

/// Upstream `reference.Parse` of a string with a domain.
fn parse_reference(s: &str) -> Result<ImageReference, ReferenceError> {
    let Some((name, path, tag, digest)) = split_reference(s) else {
        let lower = s.to_lowercase();
        if lower != s && split_reference(&lower).is_some() {
            return Err(ReferenceError::NameContainsUppercase);
        }
        return Err(ReferenceError::InvalidFormat);
    };
    if path.len() > MAX_REPOSITORY_PATH {
        return Err(ReferenceError::NameTooLong);
    }
    if let Some(d) = digest {
        validate_digest(d)?;
    }
    Ok(ImageReference {
        repository: name.to_string(),
        tag: tag.map(str::to_string),
        digest: digest.map(str::to_string),
    })
}

/// The grammar of `ReferenceRegexp`: (name, repository path, tag, digest) when `s` is a
/// syntactically valid reference.
fn split_reference(s: &str) -> Option<(&str, &str, Option<&str>, Option<&str>)> {
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    if digest.is_some_and(|d| !is_digest_syntax(d)) {
        return None;
    }
    // A ':' after the last '/' starts the tag; one before it is a registry port.
    let (name, tag) = match rest.rfind(':') {
        Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if tag.is_some_and(|t| !is_tag(t)) {
        return None;
    }
    let path = name_path(name)?;
    Some((name, path, tag, digest))
}

/// The repository path of a valid name (`anchoredNameRegexp`: an optional
/// `domain[:port]/` then path components), or `None`.
fn name_path(name: &str) -> Option<&str> {
    if let Some((domain, path)) = name.split_once('/')
        && is_domain_and_port(domain)
        && is_remote_name(path)
    {
        return Some(path);
    }
    is_remote_name(name).then_some(name)
}

fn is_remote_name(s: &str) -> bool {
    s.split('/').all(is_path_component)
}

/// `alpha-numeric [separator alpha-numeric]*`: lowercase runs joined by `.`, `_`, `__` or
/// dashes.
fn is_path_component(c: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(matches!(sep, "." | "_" | "__") || sep.bytes().all(|b| b == b'-')) {
            return false;
        }
    }
    true
}

/// `host [':' port]`, the host a domain name or a bracketed IPv6 address.
fn is_domain_and_port(s: &str) -> bool {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else { return false };
        if v6.is_empty() || !v6.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
            return false;
        }
        match after {
            "" => return true,
            _ => (None, after.strip_prefix(':')),
        }
    } else {
        match s.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(s), None),
        }
    };
    if let Some(h) = host
        && !h.split('.').all(is_domain_component)
    {
        return false;
    }
    match port {
        None => host.is_some(),
        Some(p) => !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()),
    }
}

fn is_domain_component(c: &str) -> bool {
    let b = c.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&x| x.is_ascii_alphanumeric() || x == b'-')
}

/// `[\w][\w.-]{0,127}`.
fn is_tag(t: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let b = t.as_bytes();
    !b.is_empty() && b.len() <= 128 && word(b[0]) && b.iter().all(|&x| word(x) || x == b'.' || x == b'-')
}

/// `algorithm ':' hex{32,}` with algorithm components `[A-Za-z][A-Za-z0-9]*` joined by
/// one of `-_+.`.
fn is_digest_syntax(d: &str) -> bool {
    let Some((algorithm, hex)) = d.split_once(':') else { return false };
    let component_ok = |c: &str| {
        let b = c.as_bytes();
        !b.is_empty() && b[0].is_ascii_alphabetic() && b.iter().all(u8::is_ascii_alphanumeric)
    };
    algorithm.split(['-', '_', '+', '.']).all(component_ok)
        && hex.len() >= 32
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `go-digest`'s `Digest.Validate` for the algorithms the kubelet registers.
fn validate_digest(d: &str) -> Result<(), ReferenceError> {
    let (algorithm, encoded) = d.split_once(':').ok_or(ReferenceError::DigestFormat)?;
    let hex_len = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => {
            // DigestRegexpAnchored: lowercase algorithm components.
            let lower = algorithm.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b));
            return Err(if lower { ReferenceError::DigestUnsupported } else { ReferenceError::DigestFormat });
        }
    };
    if encoded.len() != hex_len {
        return Err(ReferenceError::DigestLength);
    }
    if !encoded.bytes().all(|b| matches!(b, b'a'..=b'f' | b'0'..=b'9')) {
        return Err(ReferenceError::DigestFormat);
    }
    Ok(())
}

/// `image` with the `latest` tag when it has neither tag nor digest (upstream
/// `applyDefaultImageTag`).
pub fn apply_default_image_tag(image: &str) -> Result<String, ImageNameError> {
    let r = ImageReference::parse(image)?;
    Ok(if r.tag.is_none() && r.digest.is_none() { format!("{image}:latest") } else { image.to_string() })
}

// ---------------------------------------------------------------------------------------
// Pull policy

/// A container's `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The policy of `container`: its field, or the API server's default when absent
    /// ([`default_pull_policy`]). An unknown value pulls every time: upstream's
    /// presence check knows only `IfNotPresent` and `Never`.
    #[must_use]
    pub fn of(container: &Container) -> Self {
        Self::parse(container.image_pull_policy.as_deref(), container.image.as_deref().unwrap_or_default())
    }

    /// A pull policy field of `image` (a container's or an image volume's).
    #[must_use]
    pub fn parse(field: Option<&str>, image: &str) -> Self {
        match field {
            None | Some("") => default_pull_policy(image),
            Some("IfNotPresent") => Self::IfNotPresent,
            Some("Never") => Self::Never,
            Some(_) => Self::Always,
        }
    }

    /// The API name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// The API server's default pull policy for `image` (`SetDefaults_Container`): `Always`
/// when the tag is `latest`, written or implied (no tag and no digest); otherwise, digests
/// and names that do not parse included, `IfNotPresent`.
#[must_use]
pub fn default_pull_policy(image: &str) -> PullPolicy {
    match ImageReference::parse(image) {
        Ok(r) if r.effective_tag() == Some("latest") => PullPolicy::Always,
        _ => PullPolicy::IfNotPresent,
    }
}

// ---------------------------------------------------------------------------------------
// Go formatting

/// A duration as Go's `time.Duration.String` prints it (`313ms`, `1.661s`, `2m0.5s`).
#[must_use]
pub fn go_duration(d: Duration) -> String {
    fn fraction(value: u128, digits: u32) -> String {
        let scale = 10u128.pow(digits);
        let (whole, frac) = (value / scale, value % scale);
        if frac == 0 {
            return whole.to_string();
        }
        let frac = format!("{frac:0width$}", width = digits as usize);
        format!("{whole}.{}", frac.trim_end_matches('0'))
    }
    let nanos = d.as_nanos();
    match nanos {
        0 => "0s".to_string(),
        1..1_000 => format!("{nanos}ns"),
        1_000..1_000_000 => format!("{}µs", fraction(nanos, 3)),
        1_000_000..1_000_000_000 => format!("{}ms", fraction(nanos, 6)),
        _ => {
            let secs = nanos / 1_000_000_000;
            let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
            let seconds = fraction(s * 1_000_000_000 + nanos % 1_000_000_000, 9);
            let mut out = String::new();
            if h > 0 {
                let _ = write!(out, "{h}h{m}m");
            } else if m > 0 {
                let _ = write!(out, "{m}m");
            }
            let _ = write!(out, "{seconds}s");
            out
        }
    }
}

/// Errors as apimachinery's `NewAggregate(...).Error()` joins them: one message alone,
/// several as `[a, b]`, duplicates once.
#[must_use]
pub fn aggregate_errors(errors: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [one] => (*one).to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// A runtime error as the Go CRI client's error prints: `rpc error: code = NotFound desc =
/// ...`. `strip_unknown` drops the code of `Unknown` errors, as the client does for
/// `PullImage`.
#[must_use]
pub fn go_error_text(e: &crate::container::Error, strip_unknown: bool) -> String {
    match e {
        crate::container::Error::Rpc { status, .. } if strip_unknown && status.code() == tonic::Code::Unknown => {
            status.message().to_string()
        }
        other => other.go_text(),
    }
}

/// Upstream `evalCRIPullErr`: the waiting reason and message of a failed pull.
fn eval_pull_error(image: &str, error: &str) -> (&'static str, String) {
    for (reason, what) in [
        (reasons::REGISTRY_UNAVAILABLE, "the registry is unavailable"),
        (reasons::SIGNATURE_VALIDATION_FAILED, "the signature validation failed"),
    ] {
        if let Some(rest) = error.strip_prefix(reason) {
            return (reason, format!("image pull failed for {image} because {what}{rest}"));
        }
    }
    (reasons::ERR_IMAGE_PULL, error.to_string())
}

// ---------------------------------------------------------------------------------------
// Back-off and throttling

/// Per-key pull back-off (`flowcontrol.Backoff` without jitter), on tokio's clock.
#[derive(Debug)]
struct PullBackoff {
    initial: Duration,
    max: Duration,
    /// key → (current delay, last update).
    entries: HashMap<String, (Duration, Instant)>,
}

impl PullBackoff {
    fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max, entries: HashMap::new() }
    }

    fn expired(&self, now: Instant, last_update: Instant) -> bool {
        now.saturating_duration_since(last_update) > self.max * 2
    }

    /// `IsInBackOffSinceUpdate`: the time left when `key` is backing off at `now`.
    fn remaining(&self, key: &str, now: Instant) -> Option<Duration> {
        let &(delay, last) = self.entries.get(key)?;
        if self.expired(now, last) {
            return None;
        }
        delay.checked_sub(now.saturating_duration_since(last)).filter(|d| !d.is_zero())
    }

    /// `Next`: records a failure at `now`; returns the new delay.
    fn next(&mut self, key: &str, now: Instant) -> Duration {
        let delay = match self.entries.get(key) {
            Some(&(delay, last)) if !self.expired(now, last) => (delay * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(key.to_string(), (delay, now));
        delay
    }

    /// `GC`: drops entries not updated for twice the maximum.
    fn gc(&mut self, now: Instant) {
        let max = self.max;
        self.entries.retain(|_, (_, last)| now.saturating_duration_since(*last) <= max * 2);
    }
}

/// `flowcontrol.NewTokenBucketRateLimiter(qps, burst).TryAccept()` (`x/time/rate`): full
/// at start, refilled at `qps` tokens a second up to `burst`.
#[derive(Debug)]
struct PullThrottle {
    qps: f64,
    burst: f64,
    /// (tokens, when they were counted).
    state: Mutex<(f64, Instant)>,
}

impl PullThrottle {
    /// `None` when `qps` is 0 (no limit).
    fn new(qps: i32, burst: i32) -> Option<Self> {
        (qps > 0).then(|| {
            let burst = f64::from(burst.max(0));
            Self { qps: f64::from(qps), burst, state: Mutex::new((burst, Instant::now())) }
        })
    }

    fn try_accept(&self) -> bool {
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        let tokens = (s.0 + now.saturating_duration_since(s.1).as_secs_f64() * self.qps).min(self.burst);
        *s = (tokens, now);
        if tokens >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

// ---------------------------------------------------------------------------------------
// Pullers

/// A successful pull.
#[derive(Debug)]
struct Pulled {
    image_ref: String,
    /// `ImageStatus` after the pull (best effort: `None` when the runtime did not answer).
    status: Option<api::Image>,
}

impl Pulled {
    /// The pulled image's size; 0 when unknown.
    fn size(&self) -> u64 {
        self.status.as_ref().map_or(0, |i| i.size)
    }
}

/// An image that is on the node, ready to create containers from: what
/// [`ImageManager::ensure_image_exists`] hands back.
#[derive(Debug, Clone, PartialEq)]
pub struct EnsuredImage {
    /// The reference to create the container with (the image id).
    pub image_ref: String,
    /// The runtime's `ImageStatus` for it when one was already at hand (the presence check,
    /// or the one after the pull), so the container start need not ask again for the
    /// image's user; `None` when the runtime gave none.
    pub status: Option<api::Image>,
}

/// What a puller hands back: the pull's outcome and how long the pull itself took (queue
/// wait excluded).
#[derive(Debug)]
struct PullOutcome {
    result: Result<Pulled, String>,
    duration: Duration,
}

/// Pulls through CRI behind the QPS limit, trying each credential in turn.
#[derive(Debug)]
struct PullService {
    rt: Arc<dyn RuntimeService>,
    throttle: Option<PullThrottle>,
}

impl PullService {
    async fn pull(
        &self,
        image: &str,
        credentials: Vec<api::AuthConfig>,
        sandbox: Option<api::PodSandboxConfig>,
    ) -> Result<Pulled, String> {
        if let Some(t) = &self.throttle
            && !t.try_accept()
        {
            return Err("pull QPS exceeded".to_string());
        }
        let image_ref = if credentials.is_empty() {
            tracing::debug!(image, "pulling image without credentials");
            self.pull_once(image, None, sandbox).await?
        } else {
            let attempts = credentials.len();
            let mut errors = Vec::with_capacity(attempts);
            let mut pulled = None;
            for (i, auth) in credentials.into_iter().enumerate() {
                match self.pull_once(image, Some(auth), sandbox.clone()).await {
                    Ok(r) => {
                        pulled = Some(r);
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(image, attempt = i + 1, attempts, error = %e, "pull with credentials failed");
                        errors.push(e);
                    }
                }
            }
            pulled.ok_or_else(|| aggregate_errors(&errors))?
        };
        let status = self.rt.image_status(image).await.ok().flatten();
        Ok(Pulled { image_ref, status })
    }

    async fn pull_once(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox: Option<api::PodSandboxConfig>,
    ) -> Result<String, String> {
        match self.rt.pull_image(image, auth, sandbox).await {
            Ok(r) if r.is_empty() => Err(format!("imageRef of image {image:?} is not set")),
            Ok(r) => Ok(r),
            Err(e) => Err(go_error_text(&e, true)),
        }
    }

    async fn timed(
        &self,
        image: &str,
        credentials: Vec<api::AuthConfig>,
        sandbox: Option<api::PodSandboxConfig>,
    ) -> PullOutcome {
        let start = Instant::now();
        let result = self.pull(image, credentials, sandbox).await;
        PullOutcome { result, duration: start.elapsed() }
    }
}

/// One queued pull of the serial puller.
struct PullRequest {
    image: String,
    credentials: Vec<api::AuthConfig>,
    sandbox: Option<api::PodSandboxConfig>,
    done: oneshot::Sender<PullOutcome>,
}

impl std::fmt::Debug for PullRequest {
    // Without the credentials: nothing may print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullRequest")
            .field("image", &self.image)
            .field("credentials", &self.credentials.len())
            .finish_non_exhaustive()
    }
}

/// How pulls are scheduled.
#[derive(Debug)]
enum Puller {
    /// One worker pulls the queued requests in order (upstream `serialImagePuller`).
    Serial(mpsc::Sender<PullRequest>),
    /// Each pull starts at once, at most `tokens` at a time (`parallelImagePuller`).
    Parallel { service: Arc<PullService>, tokens: Option<Arc<Semaphore>> },
}

impl Puller {
    fn new(service: PullService, cfg: &PullerConfig) -> Self {
        let service = Arc::new(service);
        if cfg.serialize_image_pulls {
            let (tx, mut rx) = mpsc::channel::<PullRequest>(MAX_QUEUED_PULLS);
            // Ends when the manager (the only sender) is dropped. A pull whose caller went
            // away still completes, as upstream's worker does.
            tokio::spawn(
                async move {
                    while let Some(req) = rx.recv().await {
                        let outcome = service.timed(&req.image, req.credentials, req.sandbox).await;
                        let _ = req.done.send(outcome);
                    }
                }
                .instrument(tracing::info_span!("image_puller")),
            );
            Self::Serial(tx)
        } else {
            let tokens = cfg.max_parallel_image_pulls.filter(|n| *n >= 1).map(|n| Arc::new(Semaphore::new(n as usize)));
            Self::Parallel { service, tokens }
        }
    }

    async fn pull(
        &self,
        image: String,
        credentials: Vec<api::AuthConfig>,
        sandbox: Option<api::PodSandboxConfig>,
    ) -> PullOutcome {
        let (done, rx) = oneshot::channel();
        match self {
            Self::Serial(queue) => {
                let req = PullRequest { image, credentials, sandbox, done };
                if queue.send(req).await.is_err() {
                    return PullOutcome { result: Err("image puller stopped".into()), duration: Duration::ZERO };
                }
            }
            Self::Parallel { service, tokens } => {
                let (service, tokens) = (service.clone(), tokens.clone());
                tokio::spawn(
                    async move {
                        let _permit = match tokens {
                            Some(t) => Some(t.acquire_owned().await.expect("the pull semaphore is never closed")),
                            None => None,
                        };
                        let _ = done.send(service.timed(&image, credentials, sandbox).await);
                    }
                    .in_current_span(),
                );
            }
        }
        rx.await
            .unwrap_or_else(|_| PullOutcome { result: Err("image puller stopped".into()), duration: Duration::ZERO })
    }
}

// ---------------------------------------------------------------------------------------
// The image manager

/// Settings of the image manager, as `settings::image_puller` takes them from the
/// `KubeletConfiguration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullerConfig {
    /// Pull one image at a time (`serializeImagePulls`). Default: true.
    pub serialize_image_pulls: bool,
    /// Most pulls at once when not serialized (`maxParallelImagePulls`); `None`: no
    /// limit. Default: `None`.
    pub max_parallel_image_pulls: Option<i32>,
    /// Pulls started per second (`registryPullQPS`); 0: no limit. Default: 5.
    pub registry_pull_qps: i32,
    /// Pulls that may start at once above the QPS (`registryBurst`). Default: 10.
    pub registry_burst: i32,
}

impl Default for PullerConfig {
    fn default() -> Self {
        Self { serialize_image_pulls: true, max_parallel_image_pulls: None, registry_pull_qps: 5, registry_burst: 10 }
    }
}

/// Why a container's image is not there: the container's waiting reason and message, and
/// when to try again (`None`: not before the pod changes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct PullError {
    /// One of [`reasons`].
    pub reason: &'static str,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl PullError {
    fn new(reason: &'static str, message: String, retry_after: Option<Duration>) -> Self {
        Self { reason, message, retry_after }
    }
}

/// Makes sure containers' images are on the node (see the module docs).
#[derive(Debug)]
pub struct ImageManager {
    rt: Arc<dyn RuntimeService>,
    puller: Puller,
    backoff: Mutex<PullBackoff>,
    /// The last failed pull's `reason: message` per back-off key (upstream
    /// `prevPullErrMsg`): the `ImagePullBackOff` status message carries it.
    prev_pull_error: Mutex<HashMap<String, String>>,
    metrics: Arc<ImageMetrics>,
    recorder: Option<Arc<dyn EventRecorder>>,
    startup: Option<Arc<PodStartupTracker>>,
}

impl ImageManager {
    /// An image manager pulling through `rt` as `cfg` says. Must be called within a Tokio
    /// runtime (the serial puller's worker is spawned here).
    #[must_use]
    pub fn new(rt: Arc<dyn RuntimeService>, cfg: PullerConfig, metrics: Arc<ImageMetrics>) -> Self {
        let service =
            PullService { rt: rt.clone(), throttle: PullThrottle::new(cfg.registry_pull_qps, cfg.registry_burst) };
        Self {
            rt,
            puller: Puller::new(service, &cfg),
            backoff: Mutex::new(PullBackoff::new(BACKOFF_INITIAL, BACKOFF_MAX)),
            prev_pull_error: Mutex::default(),
            metrics,
            recorder: None,
            startup: None,
        }
    }

    /// Records the pull events (`Pulling`, `Pulled`, `Failed`, `BackOff`, ...) on the
    /// container, as upstream.
    #[must_use]
    pub fn with_recorder(mut self, recorder: Arc<dyn EventRecorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Tells the pod start latency tracker when pulls start and end (the SLI excludes them).
    #[must_use]
    pub fn with_startup_tracker(mut self, tracker: Arc<PodStartupTracker>) -> Self {
        self.startup = Some(tracker);
        self
    }

    fn event(&self, target: &ObjectReference, type_: EventType, reason: &str, message: String) {
        if let Some(r) = &self.recorder {
            r.record(target.clone(), type_, reason, message);
        }
    }

    /// Makes sure `container`'s image is on the node, pulling it as its pull policy says;
    /// returns the image reference to create the container with (the image id) and the
    /// image's status when it was read on the way.
    ///
    /// `credentials` are the candidate registry credentials for the image (the keyring's
    /// answer for it, pull secrets first), tried in order; empty means an anonymous pull.
    /// `sandbox_config` goes to the runtime with the pull, as upstream.
    pub async fn ensure_image_exists(
        &self,
        pod: &Pod,
        container: &Container,
        credentials: Vec<api::AuthConfig>,
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<EnsuredImage, PullError> {
        let requested = container.image.as_deref().unwrap_or_default();
        let target = container_ref(pod, &container.name);
        self.ensure(pod, &target, requested, PullPolicy::of(container), credentials, sandbox_config).await
    }

    /// [`Self::ensure_image_exists`] for an image volume (upstream `getImageVolumes`): its
    /// `reference` with its `pullPolicy` (the API server's default when absent, as for a
    /// container), the events on the pod itself.
    pub async fn ensure_volume_image(
        &self,
        pod: &Pod,
        volume: &ImageVolumeSource,
        credentials: Vec<api::AuthConfig>,
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<EnsuredImage, PullError> {
        let requested = volume.reference.as_deref().unwrap_or_default();
        let policy = PullPolicy::parse(volume.pull_policy.as_deref(), requested);
        self.ensure(pod, &pod_ref(pod), requested, policy, credentials, sandbox_config).await
    }

    /// Upstream `EnsureImageExists`: `requested` for `pod`, pull events on `target`.
    async fn ensure(
        &self,
        pod: &Pod,
        target: &ObjectReference,
        requested: &str,
        policy: PullPolicy,
        credentials: Vec<api::AuthConfig>,
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<EnsuredImage, PullError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let image = match apply_default_image_tag(requested) {
            Ok(i) => i,
            Err(e) => {
                let msg = format!("Failed to apply default image tag {requested:?}: {e}");
                self.event(target, EventType::Warning, events::FAILED_TO_INSPECT_IMAGE, msg.clone());
                return Err(PullError::new(reasons::INVALID_IMAGE_NAME, msg, None));
            }
        };
        if policy != PullPolicy::Always {
            let present = match self.rt.image_status(&image).await {
                Ok(i) => i.filter(|i| !i.id.is_empty()),
                Err(e) => {
                    let msg = format!("Failed to inspect image {requested:?}: {}", go_error_text(&e, false));
                    self.event(target, EventType::Warning, events::FAILED_TO_INSPECT_IMAGE, msg.clone());
                    return Err(PullError::new(reasons::IMAGE_INSPECT_ERROR, msg, Some(RETRY_WITHOUT_BACKOFF)));
                }
            };
            if let Some(status) = present {
                // Upstream's message when its pull manager finds the pod may use the image
                // (KubeletEnsureSecretPulledImages, on by default): swiftlet does not
                // re-verify credentials for present images (see the README's limitations).
                let msg =
                    format!("Container image {requested:?} already present on machine and can be accessed by the pod");
                self.event(target, EventType::Normal, events::PULLED_IMAGE, msg);
                // Another pod may have pulled it while this one was waiting for its pull.
                if let Some(t) = &self.startup {
                    t.image_finished_pulling(uid);
                }
                return Ok(EnsuredImage { image_ref: status.id.clone(), status: Some(status) });
            }
            if policy == PullPolicy::Never {
                let msg = format!("Container image {requested:?} is not present with pull policy of Never");
                self.event(target, EventType::Warning, events::ERR_IMAGE_NEVER_PULL_POLICY, msg.clone());
                return Err(PullError::new(reasons::ERR_IMAGE_NEVER_PULL, msg, Some(RETRY_WITHOUT_BACKOFF)));
            }
        }

        let key = format!("{uid}_{requested}");
        let remaining = self.backoff.lock().unwrap().remaining(&key, Instant::now());
        if let Some(remaining) = remaining {
            let msg = format!("Back-off pulling image {requested:?}");
            self.event(target, EventType::Normal, events::BACK_OFF_PULL_IMAGE, msg.clone());
            // The status says why (the event does not), as upstream.
            let msg = match self.prev_pull_error.lock().unwrap().get(&key) {
                Some(prev) => format!("{msg}: {prev}"),
                None => msg,
            };
            return Err(PullError::new(reasons::IMAGE_PULL_BACK_OFF, msg, Some(remaining)));
        }
        self.prev_pull_error.lock().unwrap().remove(&key);
        if let Some(t) = &self.startup {
            t.image_started_pulling(uid);
        }
        tracing::info!(pod = %pod_name(pod), image = requested, policy = policy.as_str(), "pulling image");
        self.event(target, EventType::Normal, events::PULLING_IMAGE, format!("Pulling image {requested:?}"));
        let start = Instant::now();
        let outcome = self.puller.pull(image, credentials, sandbox_config.cloned()).await;
        match outcome.result {
            Err(error) => {
                tracing::warn!(pod = %pod_name(pod), image = requested, %error, "image pull failed");
                self.event(
                    target,
                    EventType::Warning,
                    events::FAILED_TO_PULL_IMAGE,
                    format!("Failed to pull image {requested:?}: {error}"),
                );
                let delay = self.backoff.lock().unwrap().next(&key, Instant::now());
                let (reason, msg) = eval_pull_error(requested, &error);
                self.prev_pull_error.lock().unwrap().insert(key, format!("{reason}: {msg}"));
                Err(PullError::new(reason, msg, Some(delay)))
            }
            Ok(pulled) => {
                if let Some(t) = &self.startup {
                    t.image_finished_pulling(uid);
                }
                let total = truncate_to_millis(start.elapsed());
                self.event(
                    target,
                    EventType::Normal,
                    events::PULLED_IMAGE,
                    format!(
                        "Successfully pulled image {requested:?} in {} ({} including waiting). Image size: {} bytes.",
                        go_duration(truncate_to_millis(outcome.duration)),
                        go_duration(total),
                        pulled.size()
                    ),
                );
                self.metrics
                    .image_pull_duration
                    .get_or_create(&ImageSizeLabels { image_size_in_bytes: image_size_bucket(pulled.size()).into() })
                    .observe(total.as_secs_f64());
                self.backoff.lock().unwrap().gc(Instant::now());
                Ok(EnsuredImage { image_ref: pulled.image_ref, status: pulled.status })
            }
        }
    }

    /// Forgets the pull back-off of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        let prefix = format!("{uid}_");
        self.backoff.lock().unwrap().entries.retain(|k, _| !k.starts_with(&prefix));
        self.prev_pull_error.lock().unwrap().retain(|k, _| !k.starts_with(&prefix));
    }

    /// Drops back-off entries not updated for 10 min (housekeeping; a successful pull
    /// does it too, as upstream).
    pub fn gc_backoff(&self) {
        self.backoff.lock().unwrap().gc(Instant::now());
    }
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn truncate_to_millis(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use futures::future::join_all;
    use prometheus_client::registry::Registry;
    use serde_json::json;

    use super::*;
    use crate::container::fake::{FakeRuntime, fake_image};
    use crate::events::MemoryRecorder;

    const SHA: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("pod-{uid}"), "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }))
        .unwrap()
    }

    fn container(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(Into::into),
            ..Default::default()
        }
    }

    struct Harness {
        rt: Arc<FakeRuntime>,
        recorder: MemoryRecorder,
        registry: Registry,
        manager: ImageManager,
    }

    impl Harness {
        fn new(rt: FakeRuntime, cfg: PullerConfig) -> Self {
            let rt = Arc::new(rt);
            let mut registry = Registry::default();
            let metrics = Arc::new(ImageMetrics::new(&mut registry));
            let recorder = MemoryRecorder::new("node");
            let manager = ImageManager::new(rt.clone(), cfg, metrics).with_recorder(Arc::new(recorder.clone()));
            Self { rt, recorder, registry, manager }
        }

        async fn ensure(&self, uid: &str, image: &str, policy: Option<&str>) -> Result<String, PullError> {
            self.manager
                .ensure_image_exists(&pod(uid), &container(image, policy), Vec::new(), None)
                .await
                .map(|i| i.image_ref)
        }

        /// (type, reason, message) of every event, oldest first.
        fn events(&self) -> Vec<(String, String, String)> {
            self.recorder
                .list()
                .into_iter()
                .map(|e| (e.type_.unwrap(), e.reason.unwrap(), e.message.unwrap()))
                .collect()
        }

        fn metrics_text(&self) -> String {
            let mut out = String::new();
            prometheus_client::encoding::text::encode_registry(&mut out, &self.registry).unwrap();
            out
        }
    }

    fn unthrottled() -> PullerConfig {
        PullerConfig { registry_pull_qps: 0, ..PullerConfig::default() }
    }

    fn event(type_: &str, reason: &str, message: &str) -> (String, String, String) {
        (type_.to_string(), reason.to_string(), message.to_string())
    }

    /// A pull hook that takes `each` (paused) time and records the most pulls in flight.
    fn slow_pulls(rt: &FakeRuntime, each: Duration) -> Arc<AtomicUsize> {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (in_flight2, most2) = (in_flight.clone(), most.clone());
        rt.set_pull_hook(move |_, _| {
            let (in_flight, most) = (in_flight2.clone(), most2.clone());
            Box::pin(async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(each).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        });
        most
    }

    #[test]
    fn references_parse_and_normalize_like_the_distribution_library() {
        let ok = |s: &str, repo: &str, tag: Option<&str>, digest: Option<&str>| {
            let r = ImageReference::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!((r.repository.as_str(), r.tag.as_deref(), r.digest.as_deref()), (repo, tag, digest), "{s}");
        };
        ok("busybox", "docker.io/library/busybox", None, None);
        ok("busybox:1.36", "docker.io/library/busybox", Some("1.36"), None);
        ok("library/busybox", "docker.io/library/busybox", None, None);
        ok("docker.io/busybox", "docker.io/library/busybox", None, None);
        ok("index.docker.io/team/app", "docker.io/team/app", None, None);
        ok("team/app_x-y.z__w", "docker.io/team/app_x-y.z__w", None, None);
        ok("localhost/app", "localhost/app", None, None);
        ok("localhost:5000/app:v1", "localhost:5000/app", Some("v1"), None);
        ok("[::1]:5000/app", "[::1]:5000/app", None, None);
        ok("Registry.Example.com/a/b:V_1.0-x", "Registry.Example.com/a/b", Some("V_1.0-x"), None);
        ok(&format!("registry.k8s.io/pause@{SHA}"), "registry.k8s.io/pause", None, Some(SHA));
        ok(&format!("busybox:latest@{SHA}"), "docker.io/library/busybox", Some("latest"), Some(SHA));

        let err = |s: &str, want: &str| {
            let e = ImageReference::parse(s).unwrap_err();
            assert_eq!(e.to_string(), format!("couldn't parse image name {s:?}: {want}"), "{s}");
        };
        err("", "invalid reference format");
        err("Busybox", "invalid reference format: repository name (library/Busybox) must be lowercase");
        err("localhost:5000/App", "invalid reference format: repository name (App) must be lowercase");
        err("busybox:", "invalid reference format");
        err("busy box", "invalid reference format");
        err("-busybox", "invalid reference format");
        err("team//app", "invalid reference format");
        err("busybox@sha256:abc", "invalid reference format");
        err(&format!("busybox@{}", &SHA[..SHA.len() - 1]), "invalid checksum digest length");
        err("busybox@md5:0123456789abcdef0123456789abcdef", "unsupported digest algorithm");
        err(&format!("busybox@{}", SHA.to_uppercase().replace("SHA", "sha")), "invalid checksum digest format");
        err(&SHA[7..], &format!("invalid repository name ({}), cannot specify 64-byte hexadecimal strings", &SHA[7..]));
        err(&"a".repeat(256), "repository name must not be more than 255 characters");
    }

    #[test]
    fn pull_policy_defaults_like_the_api_server() {
        for (image, want) in [
            ("busybox", PullPolicy::Always),
            ("busybox:latest", PullPolicy::Always),
            ("localhost:5000/app", PullPolicy::Always),
            ("busybox:1.36", PullPolicy::IfNotPresent),
            ("localhost:5000/app:v1", PullPolicy::IfNotPresent),
            (&format!("busybox@{SHA}"), PullPolicy::IfNotPresent),
            (&format!("busybox:1.36@{SHA}"), PullPolicy::IfNotPresent),
            // ParseImageName reports the tag even with a digest.
            (&format!("busybox:latest@{SHA}"), PullPolicy::Always),
            // Names that do not parse: no tag, so not "latest".
            ("Not An Image", PullPolicy::IfNotPresent),
        ] {
            assert_eq!(default_pull_policy(image), want, "{image}");
            assert_eq!(PullPolicy::of(&container(image, None)), want, "{image}");
            assert_eq!(PullPolicy::of(&container(image, Some(""))), want, "{image}");
        }
        assert_eq!(PullPolicy::of(&container("busybox", Some("Never"))), PullPolicy::Never);
        assert_eq!(PullPolicy::of(&container("busybox", Some("IfNotPresent"))), PullPolicy::IfNotPresent);
        assert_eq!(PullPolicy::of(&container("busybox:1", Some("Always"))), PullPolicy::Always);
        assert_eq!(PullPolicy::of(&container("busybox:1", Some("Sometimes"))), PullPolicy::Always);
    }

    #[test]
    fn the_default_tag_is_latest() {
        assert_eq!(apply_default_image_tag("busybox").unwrap(), "busybox:latest");
        assert_eq!(apply_default_image_tag("localhost:5000/app").unwrap(), "localhost:5000/app:latest");
        assert_eq!(apply_default_image_tag("busybox:1.36").unwrap(), "busybox:1.36");
        let digested = format!("busybox@{SHA}");
        assert_eq!(apply_default_image_tag(&digested).unwrap(), digested);
    }

    #[test]
    fn go_formatting() {
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(999), "999ns"),
            (Duration::from_nanos(1500), "1.5µs"),
            (Duration::from_millis(313), "313ms"),
            (Duration::from_millis(1661), "1.661s"),
            (Duration::from_millis(1200), "1.2s"),
            (Duration::from_secs(5), "5s"),
            (Duration::from_mins(1), "1m0s"),
            (Duration::from_millis(62_500), "1m2.5s"),
            (Duration::from_hours(1), "1h0m0s"),
            (Duration::from_secs(3725), "1h2m5s"),
        ] {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
        let s = |v: &[&str]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(aggregate_errors(&s(&["a"])), "a");
        assert_eq!(aggregate_errors(&s(&["a", "b", "a"])), "[a, b]");
        assert_eq!(aggregate_errors(&s(&["a", "a"])), "a");

        let rpc = |status| crate::container::Error::Rpc { operation: "pull_image", status };
        assert_eq!(go_error_text(&rpc(tonic::Status::unknown("boom")), true), "boom");
        assert_eq!(go_error_text(&rpc(tonic::Status::unknown("boom")), false), "rpc error: code = Unknown desc = boom");
        assert_eq!(
            go_error_text(&rpc(tonic::Status::not_found("no such image")), true),
            "rpc error: code = NotFound desc = no such image"
        );
        assert_eq!(go_error_text(&rpc(tonic::Status::cancelled("x")), true), "rpc error: code = Canceled desc = x");
    }

    #[tokio::test]
    async fn a_present_image_is_used_without_a_pull() {
        let h = Harness::new(FakeRuntime::with_images(&["img:1", "tool"]), unthrottled());
        assert_eq!(h.ensure("u1", "img:1", None).await.unwrap(), "sha256:img:1");
        assert_eq!(h.ensure("u1", "img:1", Some("Never")).await.unwrap(), "sha256:img:1");
        // `tool` is stored as `tool`; the manager asks for `tool:latest`, the same image.
        assert_eq!(h.ensure("u1", "tool", Some("IfNotPresent")).await.unwrap(), "sha256:tool");
        assert!(h.rt.pull_calls().is_empty());
        // The recorder folds the second, identical event into the first.
        let present = event(
            "Normal",
            "Pulled",
            "Container image \"img:1\" already present on machine and can be accessed by the pod",
        );
        assert_eq!(h.events()[0], present);
        assert_eq!(
            h.events()[1],
            event(
                "Normal",
                "Pulled",
                "Container image \"tool\" already present on machine and can be accessed by the pod"
            )
        );
    }

    #[tokio::test]
    async fn never_without_the_image_is_err_image_never_pull() {
        let h = Harness::new(FakeRuntime::default(), unthrottled());
        let e = h.ensure("u1", "img:1", Some("Never")).await.unwrap_err();
        let msg = "Container image \"img:1\" is not present with pull policy of Never";
        assert_eq!((e.reason, e.message.as_str()), (reasons::ERR_IMAGE_NEVER_PULL, msg));
        assert_eq!(h.events(), vec![event("Warning", "ErrImageNeverPull", msg)]);
        assert!(h.rt.pull_calls().is_empty());
    }

    #[tokio::test]
    async fn an_invalid_name_is_invalid_image_name() {
        let h = Harness::new(FakeRuntime::default(), unthrottled());
        let e = h.ensure("u1", "Bad Image", None).await.unwrap_err();
        let msg = "Failed to apply default image tag \"Bad Image\": couldn't parse image name \"Bad Image\": \
                   invalid reference format: repository name (library/Bad Image) must be lowercase";
        assert_eq!(e, PullError { reason: reasons::INVALID_IMAGE_NAME, message: msg.into(), retry_after: None });
        assert_eq!(h.events(), vec![event("Warning", "InspectFailed", msg)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pull_records_its_events_and_its_duration() {
        let rt = FakeRuntime::with_images(&["img"]);
        rt.add_registry_image(api::Image { size: 4_269_694, ..fake_image("img") });
        let h = Harness::new(rt, unthrottled());
        slow_pulls(&h.rt, Duration::from_millis(1200));
        // No tag: pulled as img:latest, and the default policy is Always.
        let image_ref = h.ensure("u1", "img", None).await.unwrap();
        assert_eq!(image_ref, "sha256:img");
        assert_eq!(h.rt.pull_calls().len(), 1);
        assert_eq!(h.rt.pull_calls()[0].image, "img:latest");
        assert_eq!(h.rt.pull_calls()[0].auth, None);
        assert_eq!(
            h.events(),
            vec![
                event("Normal", "Pulling", "Pulling image \"img\""),
                event(
                    "Normal",
                    "Pulled",
                    "Successfully pulled image \"img\" in 1.2s (1.2s including waiting). Image size: 4269694 bytes."
                ),
            ]
        );
        let text = h.metrics_text();
        assert!(text.contains("kubelet_image_pull_duration_seconds_sum{image_size_in_bytes=\"0-10MB\"} 1.2"), "{text}");
        assert!(text.contains("kubelet_image_pull_duration_seconds_count{image_size_in_bytes=\"0-10MB\"} 1"), "{text}");
    }

    /// Failing pulls: 10 s, doubling to 5 min; `ImagePullBackOff` without a pull while
    /// backing off. As upstream, a success does not reset the delay; ten idle minutes do.
    #[tokio::test(start_paused = true)]
    async fn the_back_off_doubles_up_to_five_minutes() {
        let rt = FakeRuntime::default();
        rt.add_registry_image(fake_image("img:1"));
        let failing = Arc::new(AtomicBool::new(true));
        let f = failing.clone();
        rt.set_pull_hook(move |image, _| {
            let (fail, image) = (f.load(Ordering::SeqCst), image.to_string());
            Box::pin(async move {
                if fail {
                    return Err(crate::container::Error::Rpc {
                        operation: "pull_image",
                        status: tonic::Status::not_found(format!("{image}: not found")),
                    });
                }
                Ok(())
            })
        });
        let h = Harness::new(rt, unthrottled());
        let pull_error = "rpc error: code = NotFound desc = img:1: not found";
        let mut delays = Vec::new();
        for _ in 0..8 {
            let e = h.ensure("u1", "img:1", Some("Always")).await.unwrap_err();
            assert_eq!((e.reason, e.message.as_str()), (reasons::ERR_IMAGE_PULL, pull_error));
            let delay = e.retry_after.unwrap();
            delays.push(delay.as_secs());
            let b = h.ensure("u1", "img:1", Some("Always")).await.unwrap_err();
            // The status carries the pull's error (upstream `prevPullErrMsg`); the event
            // below does not.
            let backoff = format!("Back-off pulling image \"img:1\": ErrImagePull: {pull_error}");
            assert_eq!(
                b,
                PullError { reason: reasons::IMAGE_PULL_BACK_OFF, message: backoff, retry_after: Some(delay) }
            );
            tokio::time::advance(delay.checked_sub(Duration::from_secs(1)).unwrap()).await;
            let b = h.ensure("u1", "img:1", Some("Always")).await.unwrap_err();
            assert_eq!((b.reason, b.retry_after), (reasons::IMAGE_PULL_BACK_OFF, Some(Duration::from_secs(1))));
            // Another pod has its own back-off.
            assert_eq!(h.ensure("u2", "img:1", Some("Always")).await.unwrap_err().reason, reasons::ERR_IMAGE_PULL);
            h.manager.forget_pod("u2");
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(h.rt.pull_calls().len(), 16);
        let events = h.events();
        assert_eq!(events[0], event("Normal", "Pulling", "Pulling image \"img:1\""));
        assert_eq!(events[1], event("Warning", "Failed", &format!("Failed to pull image \"img:1\": {pull_error}")));
        assert_eq!(events[2], event("Normal", "BackOff", "Back-off pulling image \"img:1\""));

        failing.store(false, Ordering::SeqCst);
        assert_eq!(h.ensure("u1", "img:1", Some("Always")).await.unwrap(), "sha256:img:1");
        failing.store(true, Ordering::SeqCst);
        let e = h.ensure("u1", "img:1", Some("Always")).await.unwrap_err();
        assert_eq!(e.retry_after, Some(Duration::from_mins(5)), "a success does not reset the delay");
        tokio::time::advance(Duration::from_secs(601)).await;
        let e = h.ensure("u1", "img:1", Some("Always")).await.unwrap_err();
        assert_eq!(e.retry_after, Some(Duration::from_secs(10)), "ten idle minutes do");
        h.manager.forget_pod("u1");
        assert_eq!(
            h.ensure("u1", "img:1", Some("Always")).await.unwrap_err().retry_after,
            Some(Duration::from_secs(10))
        );
    }

    fn registry_with(images: &[&str]) -> FakeRuntime {
        let rt = FakeRuntime::default();
        for i in images {
            rt.add_registry_image(fake_image(i));
        }
        rt
    }

    #[tokio::test(start_paused = true)]
    async fn serialized_pulls_never_overlap() {
        let h = Harness::new(registry_with(&["a:1", "b:1", "c:1"]), unthrottled());
        let most = slow_pulls(&h.rt, Duration::from_secs(5));
        let start = Instant::now();
        let results = join_all(["a:1", "b:1", "c:1"].iter().enumerate().map(|(i, image)| {
            let uid = format!("u{i}");
            let h = &h;
            async move { h.ensure(&uid, image, Some("IfNotPresent")).await }
        }))
        .await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert_eq!(start.elapsed(), Duration::from_secs(15));
        let pulled = |image: &str, waited: u64| {
            event(
                "Normal",
                "Pulled",
                &format!(
                    "Successfully pulled image \"{image}\" in 5s ({waited}s including waiting). Image size: 1024 bytes."
                ),
            )
        };
        let events = h.events();
        for (image, waited) in [("a:1", 5), ("b:1", 10), ("c:1", 15)] {
            assert!(events.contains(&pulled(image, waited)), "{image}: {events:#?}");
        }
        // The queue wait counts in the histogram: 5 + 10 + 15 s.
        assert!(
            h.metrics_text().contains("kubelet_image_pull_duration_seconds_sum{image_size_in_bytes=\"0-10MB\"} 30.0")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn parallel_pulls_overlap_up_to_the_limit() {
        let images = ["a:1", "b:1", "c:1", "d:1", "e:1"];
        for (limit, most_at_once, took) in [(Some(2), 2, 15), (None, 5, 5), (Some(0), 5, 5)] {
            let cfg = PullerConfig { serialize_image_pulls: false, max_parallel_image_pulls: limit, ..unthrottled() };
            let h = Harness::new(registry_with(&images), cfg);
            let most = slow_pulls(&h.rt, Duration::from_secs(5));
            let start = Instant::now();
            let results = join_all(images.iter().enumerate().map(|(i, image)| {
                let uid = format!("u{i}");
                let h = &h;
                async move { h.ensure(&uid, image, Some("IfNotPresent")).await }
            }))
            .await;
            assert!(results.iter().all(Result::is_ok), "{limit:?}: {results:?}");
            assert_eq!(most.load(Ordering::SeqCst), most_at_once, "{limit:?}");
            assert_eq!(start.elapsed(), Duration::from_secs(took), "{limit:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn registry_qps_limits_pull_starts() {
        let images = ["a:1", "b:1", "c:1", "d:1"];
        let cfg =
            PullerConfig { serialize_image_pulls: false, registry_pull_qps: 1, registry_burst: 2, ..unthrottled() };
        let h = Harness::new(registry_with(&images), cfg);
        let results = join_all(images[..3].iter().enumerate().map(|(i, image)| {
            let uid = format!("u{i}");
            let h = &h;
            async move { h.ensure(&uid, image, Some("IfNotPresent")).await }
        }))
        .await;
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 2, "{results:?}");
        let refused = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert_eq!((refused.reason, refused.message.as_str()), (reasons::ERR_IMAGE_PULL, "pull QPS exceeded"));
        assert!(h.events().iter().any(|e| e.1 == "Failed" && e.2.ends_with(": pull QPS exceeded")));
        assert_eq!(h.rt.pull_calls().len(), 2, "a refused pull never reaches the runtime");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(h.ensure("u9", "d:1", Some("IfNotPresent")).await.is_ok(), "one token a second");

        // QPS 0: no limit.
        let h = Harness::new(registry_with(&images), unthrottled());
        for (i, image) in images.iter().cycle().take(20).enumerate() {
            assert!(h.ensure(&format!("u{i}"), image, Some("Always")).await.is_ok());
        }
    }

    fn auth(user: &str) -> api::AuthConfig {
        api::AuthConfig { username: user.into(), password: format!("{user}-secret"), ..Default::default() }
    }

    #[tokio::test]
    async fn credentials_are_tried_in_order() {
        let h = Harness::new(registry_with(&["img:1"]), unthrottled());
        h.rt.set_pull_hook(|_, auth| {
            let user = auth.map(|a| a.username.clone());
            Box::pin(async move {
                match user.as_deref() {
                    Some("good") | None => Ok(()),
                    Some(u) => Err(crate::container::Error::Rpc {
                        operation: "pull_image",
                        status: tonic::Status::unknown(format!("denied for {u}")),
                    }),
                }
            })
        });
        let (p, c) = (pod("u1"), container("img:1", Some("Always")));
        let got = h.manager.ensure_image_exists(&p, &c, vec![auth("bad"), auth("good"), auth("unused")], None).await;
        assert_eq!(got.unwrap().image_ref, "sha256:img:1");
        let users: Vec<_> = h.rt.pull_calls().iter().map(|c| c.auth.clone().unwrap().username).collect();
        assert_eq!(users, ["bad", "good"]);

        // All fail: every error, as upstream's aggregate.
        let e = h.manager.ensure_image_exists(&pod("u2"), &c, vec![auth("x"), auth("y"), auth("x")], None).await;
        assert_eq!(e.unwrap_err().message, "[denied for x, denied for y]");
        let e = h.manager.ensure_image_exists(&pod("u3"), &c, vec![auth("x")], None).await;
        assert_eq!(e.unwrap_err().message, "denied for x");
        for event in h.events() {
            assert!(!event.2.contains("secret"), "{event:?}");
        }

        // None: one anonymous pull.
        let before = h.rt.pull_calls().len();
        assert!(h.ensure("u4", "img:1", Some("Always")).await.is_ok());
        assert_eq!(h.rt.pull_calls()[before..].iter().map(|c| c.auth.is_none()).collect::<Vec<_>>(), [true]);
    }

    #[tokio::test]
    async fn registry_and_signature_errors_have_their_own_reasons() {
        let h = Harness::new(registry_with(&["img:1"]), unthrottled());
        h.rt.set_pull_hook(|image, _| {
            let message = if image.starts_with("img") {
                "RegistryUnavailable: dial tcp: connection refused"
            } else {
                "SignatureValidationFailed"
            };
            Box::pin(async move {
                Err(crate::container::Error::Rpc { operation: "pull_image", status: tonic::Status::unknown(message) })
            })
        });
        let e = h.ensure("u1", "img:1", Some("Always")).await.unwrap_err();
        assert_eq!(e.reason, reasons::REGISTRY_UNAVAILABLE);
        assert_eq!(
            e.message,
            "image pull failed for img:1 because the registry is unavailable: dial tcp: connection refused"
        );
        let e = h.ensure("u1", "signed:1", Some("Always")).await.unwrap_err();
        assert_eq!(e.reason, reasons::SIGNATURE_VALIDATION_FAILED);
        assert_eq!(e.message, "image pull failed for signed:1 because the signature validation failed");
    }

    #[test]
    fn pull_requests_do_not_print_credentials() {
        let (done, _rx) = oneshot::channel();
        let req = PullRequest { image: "img".into(), credentials: vec![auth("me")], sandbox: None, done };
        let text = format!("{req:?}");
        assert!(!text.contains("secret") && !text.contains("me"), "{text}");
    }
}
