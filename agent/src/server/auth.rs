//! Authentication and authorization of requests to the HTTPS API, as the kubelet's auth
//! filter (`pkg/kubelet/server` `InstallAuthFilter`, `auth.go`, and the delegating
//! authenticator of `k8s.io/apiserver`) does: authenticate, derive the request's
//! attributes (verb; resource `nodes`, subresources from the path), authorize.
//!
//! # Authentication
//! Tried in upstream's order; the first that authenticates wins:
//! 1. a client certificate, when `authentication.x509.clientCAFile` is set: its chain must
//!    lead to the CA bundle ([`ClientCa::verify`]); CN is the user, the O values the
//!    groups. A certificate with an empty CN does not authenticate (and is no error);
//! 2. `Authorization: Bearer <token>`, then a WebSocket request's
//!    `base64url.bearer.authorization.k8s.io.<token>` subprotocol, checked by the
//!    [`TokenAuthenticator`] (`authentication.webhook.enabled`: `TokenReview`);
//! 3. with `authentication.anonymous.enabled`, `system:anonymous` in group
//!    `system:unauthenticated` — but only if nothing above *failed*: a certificate that
//!    does not verify, a rejected token or a review that could not be made is a 401 even
//!    with anonymous access on (upstream's `unionauth.NewFailOnError`).
//!
//! Authenticated users get the group `system:authenticated` (upstream's
//! `AuthenticatedGroupAdder`). A bearer token without token authentication configured is
//! refused with 401: upstream, without a token authenticator, it would silently become
//! anonymous, which hides a client's misconfiguration.
//!
//! # Authorization
//! [`RequestAttributes::for_request`] maps the request to one or more attribute sets
//! differing only in subresource (upstream `GetRequestAttributes` with
//! `KubeletFineGrainedAuthz`, GA since 1.36 and so always on here):
//!
//! | path | subresources asked, in order |
//! |---|---|
//! | `/pods`, `/runningpods` | `pods`, then `proxy` |
//! | `/healthz` | `healthz`, then `proxy` |
//! | `/configz` | `configz`, then `proxy` |
//! | `/statusz` | `statusz`, then `proxy` |
//! | `/stats` | `stats` |
//! | `/metrics` | `metrics` |
//! | `/logs` | `log` |
//! | `/checkpoint` | `checkpoint` |
//! | anything else (`/exec`, `/run`, `/containerLogs`, `/spec`, ...) | `proxy` |
//!
//! The first allowed set lets the request through; if none is, 403 with upstream's message
//! `Forbidden (user=<u>, verb=<v>, resource=nodes, subresource(s)=[pods proxy])`. An
//! authorizer error is a 500 `Authorization error (user=..., subresource=...)`, as
//! upstream. Verbs come from the method as upstream: GET `get`, POST `create`, PUT
//! `update`, PATCH `patch`, DELETE `delete`, anything else (HEAD, OPTIONS) the empty verb.
//!
//! Refusals carry a `v1` `Status` body (upstream writes the same words as plain text).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum_server::tls::TlsInfo;
use base64::Engine as _;

use super::tls::ClientCa;

/// Who made a request (upstream `user.Info`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UserInfo {
    /// User name (certificate CN, the `TokenReview`'s username, or `system:anonymous`).
    pub name: String,
    /// The user's UID, when the `TokenReview` gave one.
    pub uid: String,
    /// Groups (certificate O values or the `TokenReview`'s groups, plus
    /// `system:authenticated`; or `system:unauthenticated`).
    pub groups: Vec<String>,
    /// Extra attributes from the `TokenReview` (passed on to `SubjectAccessReview`).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// The anonymous user (`authentication.anonymous.enabled`).
    #[must_use]
    pub fn anonymous() -> Self {
        Self {
            name: "system:anonymous".to_owned(),
            groups: vec!["system:unauthenticated".to_owned()],
            ..Self::default()
        }
    }
}

/// What a request asks to do, in `SubjectAccessReview` terms: resource `nodes` (API
/// version `v1`) named after the node, one subresource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestAttributes {
    /// The authenticated user.
    pub user: UserInfo,
    /// `get`, `create`, `update`, `patch` or `delete` from the HTTP method; "" for others.
    pub verb: String,
    /// The node's name.
    pub name: String,
    /// `stats`, `metrics`, `log`, `checkpoint`, `pods`, `configz`, `healthz`, `statusz` or
    /// `proxy`.
    pub subresource: String,
    /// The request path.
    pub path: String,
}

impl RequestAttributes {
    /// The attribute sets to try, in order, for a request for `path` with `method` by
    /// `user` on node `node_name` (see the module docs): one per subresource.
    #[must_use]
    pub fn for_request(user: &UserInfo, method: &Method, path: &str, node_name: &str) -> Vec<Self> {
        let verb = match *method {
            Method::GET => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        };
        subresources_of(path)
            .into_iter()
            .map(|subresource| Self {
                user: user.clone(),
                verb: verb.to_owned(),
                name: node_name.to_owned(),
                subresource: subresource.to_owned(),
                path: path.to_owned(),
            })
            .collect()
    }
}

/// Upstream `isSubpath`: `path` is `prefix` or below it.
pub(crate) fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}

/// The kubelet's mapping of paths to `nodes` subresources (see the module docs).
fn subresources_of(path: &str) -> Vec<&'static str> {
    let mut subresources = Vec::with_capacity(2);
    let fine_grained = [("/pods", "pods"), ("/healthz", "healthz"), ("/configz", "configz"), ("/statusz", "statusz")];
    if let Some((_, sub)) = fine_grained.iter().find(|(prefix, _)| is_subpath(path, prefix)) {
        subresources.push(*sub);
    } else if is_subpath(path, "/runningpods/") {
        subresources.push("pods");
    }
    let coarse = [("/stats/", "stats"), ("/metrics", "metrics"), ("/logs/", "log"), ("/checkpoint/", "checkpoint")];
    match coarse.iter().find(|(prefix, _)| is_subpath(path, prefix)) {
        Some((_, sub)) => subresources.push(*sub),
        None => subresources.push("proxy"),
    }
    subresources
}

/// A review (`TokenReview`, `SubjectAccessReview`) that could not be made or answered.
/// Errors are not cached; authentication errors are 401, authorization errors 500.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReviewError {
    /// The API server could not be asked, or answered with an error.
    #[error("{review} failed: {source}")]
    Api {
        /// `TokenReview` or `SubjectAccessReview`.
        review: &'static str,
        /// The client's error.
        #[source]
        source: Arc<kube::Error>,
    },
    /// No answer in time (retries included).
    #[error("{review} got no answer within {timeout:?}")]
    Timeout {
        /// `TokenReview` or `SubjectAccessReview`.
        review: &'static str,
        /// The time allowed.
        timeout: Duration,
    },
    /// The review answered with an error (`TokenReview` `status.error`).
    #[error("{review}: {message}")]
    Rejected {
        /// `TokenReview` or `SubjectAccessReview`.
        review: &'static str,
        /// `status.error`.
        message: String,
    },
}

/// Checks bearer tokens (`authentication.webhook.enabled`).
#[async_trait::async_trait]
pub trait TokenAuthenticator: Send + Sync {
    /// The user `token` belongs to: `Ok(Some)` authenticated, `Ok(None)` not a valid
    /// token, `Err` when that could not be told (or the review said why not).
    async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError>;
}

/// A token authenticator with a fixed table of tokens; counts what it is asked.
#[derive(Debug, Default)]
pub struct FakeTokenAuthenticator {
    tokens: Mutex<BTreeMap<String, UserInfo>>,
    calls: Mutex<usize>,
}

impl FakeTokenAuthenticator {
    /// Authenticates `token` as `user` from now on.
    pub fn add(&self, token: &str, user: UserInfo) {
        self.tokens.lock().expect("fake token lock").insert(token.to_owned(), user);
    }

    /// Forgets every token.
    pub fn clear(&self) {
        self.tokens.lock().expect("fake token lock").clear();
    }

    /// How many tokens it was asked about.
    #[must_use]
    pub fn calls(&self) -> usize {
        *self.calls.lock().expect("fake token lock")
    }
}

#[async_trait::async_trait]
impl TokenAuthenticator for FakeTokenAuthenticator {
    async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        *self.calls.lock().expect("fake token lock") += 1;
        Ok(self.tokens.lock().expect("fake token lock").get(token).cloned())
    }
}

/// Whether a request may proceed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Denied or no opinion, with the reason (logged, not sent).
    Deny(String),
}

/// Decides on authenticated requests (`authorization.mode`).
#[async_trait::async_trait]
pub trait Authorizer: Send + Sync {
    /// The decision for `attributes`, or why there is none (a 500).
    async fn authorize(&self, attributes: &RequestAttributes) -> Result<Decision, ReviewError>;
}

/// `authorization.mode: AlwaysAllow`: every authenticated request is allowed.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysAllow;

#[async_trait::async_trait]
impl Authorizer for AlwaysAllow {
    async fn authorize(&self, _attributes: &RequestAttributes) -> Result<Decision, ReviewError> {
        Ok(Decision::Allow)
    }
}

type DecideFn = dyn Fn(&RequestAttributes) -> Result<Decision, ReviewError> + Send + Sync;

/// An authorizer whose decisions the test sets; records what it was asked.
pub struct FakeAuthorizer {
    decide: Box<DecideFn>,
    seen: Mutex<Vec<RequestAttributes>>,
}

impl std::fmt::Debug for FakeAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeAuthorizer").field("seen", &self.seen).finish_non_exhaustive()
    }
}

impl FakeAuthorizer {
    /// An authorizer answering `decision` to everything.
    #[must_use]
    pub fn new(decision: Decision) -> Self {
        Self::from_fn(move |_| Ok(decision.clone()))
    }

    /// An authorizer answering what `decide` says.
    #[must_use]
    pub fn from_fn(
        decide: impl Fn(&RequestAttributes) -> Result<Decision, ReviewError> + Send + Sync + 'static,
    ) -> Self {
        Self { decide: Box::new(decide), seen: Mutex::new(Vec::new()) }
    }

    /// The attributes of every request asked about so far.
    #[must_use]
    pub fn seen(&self) -> Vec<RequestAttributes> {
        self.seen.lock().expect("fake authorizer lock").clone()
    }
}

#[async_trait::async_trait]
impl Authorizer for FakeAuthorizer {
    async fn authorize(&self, attributes: &RequestAttributes) -> Result<Decision, ReviewError> {
        self.seen.lock().expect("fake authorizer lock").push(attributes.clone());
        (self.decide)(attributes)
    }
}

/// The authenticators and the authorizer, shared by every request.
#[derive(Clone)]
pub(crate) struct AuthState {
    /// Client certificates are checked against this bundle (`clientCAFile`).
    pub client_ca: Option<Arc<ClientCa>>,
    /// Bearer tokens are checked by this (`authentication.webhook.enabled`).
    pub tokens: Option<Arc<dyn TokenAuthenticator>>,
    pub anonymous: bool,
    pub node_name: String,
    pub authorizer: Arc<dyn Authorizer>,
}

impl std::fmt::Debug for AuthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthState")
            .field("x509", &self.client_ca.is_some())
            .field("tokens", &self.tokens.is_some())
            .field("anonymous", &self.anonymous)
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

/// Why a request did not authenticate although it carried credentials (logged; never
/// the token itself).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum AuthenticationError {
    #[error("client certificate: {0}")]
    Certificate(String),
    #[error("invalid bearer token")]
    InvalidToken,
    #[error("bearer tokens need token authentication (authentication.webhook.enabled)")]
    NoTokenAuthenticator,
    #[error(transparent)]
    Review(#[from] ReviewError),
}

/// The prefix of a bearer token carried as a WebSocket subprotocol (upstream
/// `wsstream` protocol authenticator).
const WEBSOCKET_TOKEN_PROTOCOL: &str = "base64url.bearer.authorization.k8s.io.";

impl AuthState {
    /// The user of a request; `Ok(None)` when it carried no credentials and anonymous
    /// access is off; `Err` when credentials failed (401 either way).
    pub(crate) async fn authenticate(
        &self,
        tls: Option<&TlsInfo>,
        headers: &HeaderMap,
    ) -> Result<Option<UserInfo>, Vec<AuthenticationError>> {
        let mut errors = Vec::new();
        if let Some(client_ca) = &self.client_ca
            && let Some(chain) = tls.map(|info| &info.peer_certificates).filter(|chain| !chain.is_empty())
        {
            // The handshake did not check the chain (see `tls`): this is where it is.
            match client_ca.verify(chain) {
                Ok(()) => {
                    if let Some(user) = user_from_certificate(&chain[0]) {
                        return Ok(Some(with_authenticated_group(user)));
                    }
                }
                Err(reason) => errors.push(AuthenticationError::Certificate(reason)),
            }
        }
        for presented in [bearer_token(headers), websocket_token(headers)].into_iter().flatten() {
            let PresentedToken::Token(token) = presented else {
                errors.push(AuthenticationError::InvalidToken);
                continue;
            };
            let Some(tokens) = &self.tokens else {
                errors.push(AuthenticationError::NoTokenAuthenticator);
                continue;
            };
            match tokens.authenticate_token(&token).await {
                Ok(Some(user)) => return Ok(Some(with_authenticated_group(user))),
                Ok(None) => errors.push(AuthenticationError::InvalidToken),
                Err(error) => errors.push(error.into()),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(self.anonymous.then(UserInfo::anonymous))
    }
}

/// A bearer token as a request presents it.
#[derive(Debug, PartialEq, Eq)]
enum PresentedToken {
    Token(String),
    /// Empty or undecodable: an authentication error, as upstream.
    Malformed,
}

/// Upstream `bearertoken`: `None` without an `Authorization: Bearer` header.
fn bearer_token(headers: &HeaderMap) -> Option<PresentedToken> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let mut parts = value.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    Some(if token.is_empty() { PresentedToken::Malformed } else { PresentedToken::Token(token.to_owned()) })
}

/// Upstream's WebSocket protocol authenticator: a token in `Sec-WebSocket-Protocol` of a
/// WebSocket upgrade request (browsers cannot set `Authorization` on a WebSocket).
fn websocket_token(headers: &HeaderMap) -> Option<PresentedToken> {
    let has = |name, token: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|v| v.trim().eq_ignore_ascii_case(token))
    };
    if !has(header::CONNECTION, "upgrade") || !has(header::UPGRADE, "websocket") {
        return None;
    }
    let encoded = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(WEBSOCKET_TOKEN_PROTOCOL))?;
    let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded).ok();
    Some(match decoded.and_then(|bytes| String::from_utf8(bytes).ok()) {
        Some(token) if !token.is_empty() => PresentedToken::Token(token),
        _ => PresentedToken::Malformed,
    })
}

/// Adds `system:authenticated` unless present (upstream `AuthenticatedGroupAdder`).
fn with_authenticated_group(mut user: UserInfo) -> UserInfo {
    if !user.groups.iter().any(|g| g == "system:authenticated") {
        user.groups.push("system:authenticated".to_owned());
    }
    user
}

/// CN as the user and O values as groups, as the apiserver's x509 authenticator maps them;
/// `None` for an empty CN.
fn user_from_certificate(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    if name.is_empty() {
        return None;
    }
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_owned)).collect();
    Some(UserInfo { name, groups, ..UserInfo::default() })
}

/// The middleware in front of every route of the HTTPS API.
pub(crate) async fn filter(State(auth): State<AuthState>, mut request: Request, next: Next) -> Response {
    let tls = request.extensions().get::<Arc<TlsInfo>>().cloned();
    let user = match auth.authenticate(tls.as_deref(), request.headers()).await {
        Ok(Some(user)) => user,
        Ok(None) => return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized"),
        Err(errors) => {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            tracing::info!(?errors, path = request.uri().path(), "unable to authenticate the request");
            return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
        }
    };
    let attributes = RequestAttributes::for_request(&user, request.method(), request.uri().path(), &auth.node_name);
    let mut reasons = Vec::new();
    for attrs in &attributes {
        match auth.authorizer.authorize(attrs).await {
            Ok(Decision::Allow) => {
                request.extensions_mut().insert(user);
                return next.run(request).await;
            }
            Ok(Decision::Deny(reason)) => reasons.push(reason),
            Err(error) => {
                let message = format!(
                    "Authorization error (user={}, verb={}, resource=nodes, subresource={})",
                    attrs.user.name, attrs.verb, attrs.subresource
                );
                tracing::error!(%error, %message, "authorization error");
                return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message);
            }
        }
    }
    let subresources: Vec<&str> = attributes.iter().map(|a| a.subresource.as_str()).collect();
    let message = format!(
        "Forbidden (user={}, verb={}, resource=nodes, subresource(s)=[{}])",
        user.name,
        attributes.first().map_or("", |a| a.verb.as_str()),
        subresources.join(" ")
    );
    tracing::debug!(%message, ?reasons, "request denied");
    status(StatusCode::FORBIDDEN, "Forbidden", message)
}

/// A `v1` `Status` failure response.
pub(crate) fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response {
    let message: String = message.into();
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subresources_follow_the_kubelet() {
        for (path, want) in [
            ("/stats/summary", &["stats"][..]),
            ("/stats", &["stats"]),
            ("/statsfoo", &["proxy"]),
            ("/metrics", &["metrics"]),
            ("/metrics/cadvisor", &["metrics"]),
            ("/logs/syslog", &["log"]),
            ("/logs", &["log"]),
            ("/checkpoint/ns/pod/c", &["checkpoint"]),
            ("/pods", &["pods", "proxy"]),
            ("/pods/", &["pods", "proxy"]),
            ("/podsx", &["proxy"]),
            ("/runningpods/", &["pods", "proxy"]),
            ("/configz", &["configz", "proxy"]),
            ("/healthz", &["healthz", "proxy"]),
            ("/healthz/ping", &["healthz", "proxy"]),
            ("/statusz", &["statusz", "proxy"]),
            ("/run/ns/pod/c", &["proxy"]),
            ("/exec/ns/pod/c", &["proxy"]),
            ("/containerLogs/ns/pod/c", &["proxy"]),
            ("/spec/", &["proxy"]),
            ("/", &["proxy"]),
        ] {
            assert_eq!(subresources_of(path), want, "{path}");
        }
    }

    #[test]
    fn verbs_follow_the_method_as_upstream() {
        let user = UserInfo { name: "u".into(), ..UserInfo::default() };
        let attrs = RequestAttributes::for_request(&user, &Method::POST, "/exec/a/b/c", "n");
        assert_eq!(attrs.len(), 1);
        assert_eq!((attrs[0].verb.as_str(), attrs[0].subresource.as_str()), ("create", "proxy"));
        let attrs = RequestAttributes::for_request(&user, &Method::GET, "/pods", "n");
        let pairs: Vec<(&str, &str)> = attrs.iter().map(|a| (a.verb.as_str(), a.subresource.as_str())).collect();
        assert_eq!(pairs, [("get", "pods"), ("get", "proxy")]);
        assert_eq!(attrs[0].name, "n");
        for (method, verb) in
            [(Method::PUT, "update"), (Method::PATCH, "patch"), (Method::DELETE, "delete"), (Method::HEAD, "")]
        {
            assert_eq!(RequestAttributes::for_request(&user, &method, "/x", "n")[0].verb, verb, "{method}");
        }
    }

    fn state(anonymous: bool, tokens: Option<Arc<dyn TokenAuthenticator>>) -> AuthState {
        AuthState { client_ca: None, tokens, anonymous, node_name: "n".into(), authorizer: Arc::new(AlwaysAllow) }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        map
    }

    #[tokio::test]
    async fn anonymous_only_without_credentials() {
        let none = HeaderMap::new();
        assert_eq!(state(false, None).authenticate(None, &none).await.unwrap(), None);
        let anon = state(true, None).authenticate(None, &none).await.unwrap().unwrap();
        assert_eq!(anon, UserInfo::anonymous());
        assert_eq!(anon.groups, ["system:unauthenticated"]);
        // A token without token authentication fails, even with anonymous access on.
        let bearer = headers(&[("authorization", "Bearer abc")]);
        let errors = state(true, None).authenticate(None, &bearer).await.unwrap_err();
        assert!(matches!(errors[..], [AuthenticationError::NoTokenAuthenticator]), "{errors:?}");
        // Other schemes are no bearer token: anonymous.
        let basic = headers(&[("authorization", "Basic dTpw")]);
        assert_eq!(state(true, None).authenticate(None, &basic).await.unwrap(), Some(UserInfo::anonymous()));
    }

    #[tokio::test]
    async fn tokens_from_the_header_or_the_websocket_protocol() {
        let fake = Arc::new(FakeTokenAuthenticator::default());
        fake.add("good", UserInfo { name: "alice".into(), groups: vec!["team".into()], ..UserInfo::default() });
        let auth = state(true, Some(fake.clone()));
        let user = auth.authenticate(None, &headers(&[("authorization", "bearer good")])).await.unwrap().unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["team", "system:authenticated"]);

        // A rejected token is a failure, not anonymous.
        let errors = auth.authenticate(None, &headers(&[("authorization", "Bearer bad")])).await.unwrap_err();
        assert!(matches!(errors[..], [AuthenticationError::InvalidToken]), "{errors:?}");
        // So is an empty one (two spaces: upstream's split gives an empty token).
        let errors = auth.authenticate(None, &headers(&[("authorization", "Bearer  good")])).await.unwrap_err();
        assert!(matches!(errors[..], [AuthenticationError::InvalidToken]), "{errors:?}");

        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("good");
        let protocol = format!("v4.channel.k8s.io, {WEBSOCKET_TOKEN_PROTOCOL}{encoded}");
        let ws = headers(&[("connection", "Upgrade"), ("upgrade", "websocket"), ("sec-websocket-protocol", &protocol)]);
        assert_eq!(auth.authenticate(None, &ws).await.unwrap().unwrap().name, "alice");
        // Not a WebSocket upgrade: the protocol header means nothing.
        let plain = headers(&[("sec-websocket-protocol", &protocol)]);
        assert_eq!(auth.authenticate(None, &plain).await.unwrap(), Some(UserInfo::anonymous()));
        assert_eq!(fake.calls(), 3, "the empty token was never sent for review");
    }

    #[tokio::test]
    async fn review_errors_fail_authentication() {
        struct Broken;
        #[async_trait::async_trait]
        impl TokenAuthenticator for Broken {
            async fn authenticate_token(&self, _token: &str) -> Result<Option<UserInfo>, ReviewError> {
                Err(ReviewError::Timeout { review: "TokenReview", timeout: Duration::from_secs(10) })
            }
        }
        let errors = state(true, Some(Arc::new(Broken)))
            .authenticate(None, &headers(&[("authorization", "Bearer secret-token")]))
            .await
            .unwrap_err();
        let text = errors[0].to_string();
        assert_eq!(text, "TokenReview got no answer within 10s");
        assert!(!text.contains("secret-token"));
    }
}
