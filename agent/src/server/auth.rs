//! Authentication and authorization of requests to the HTTPS API, as the kubelet's auth
//! filter does: authenticate (x509 client certificate, else anonymous), derive the
//! request's attributes (verb; resource `nodes`, subresource from the path), authorize.
//!
//! - A client certificate reaches this point only if rustls verified it against
//!   `authentication.x509.clientCAFile`; its CN is the user and its O values the groups
//!   (plus `system:authenticated`). A certificate with an empty CN does not authenticate.
//! - Without a certificate, anonymous requests (`authentication.anonymous.enabled`) are
//!   `system:anonymous` in group `system:unauthenticated`.
//! - A request carrying a bearer token is refused with 401 while token (webhook)
//!   authentication is not implemented: upstream, without a token authenticator, it would
//!   silently become anonymous, which hides a client's misconfiguration.
//! - Refusals carry a `v1` `Status` body (upstream writes the same words as plain text).

use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum_server::tls::TlsInfo;

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// User name (certificate CN, or `system:anonymous`).
    pub name: String,
    /// Groups (certificate O values and `system:authenticated`, or
    /// `system:unauthenticated`).
    pub groups: Vec<String>,
}

/// What a request asks to do, in `SubjectAccessReview` terms (resource `nodes`, name =
/// the node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestAttributes {
    /// The authenticated user.
    pub user: UserInfo,
    /// `get`, `create`, `update`, `patch` or `delete`, from the HTTP method.
    pub verb: String,
    /// The node's name.
    pub name: String,
    /// `stats`, `metrics`, `log`, `checkpoint`, `pods`, `configz`, `healthz` or `proxy`.
    pub subresource: String,
    /// The request path.
    pub path: String,
}

impl RequestAttributes {
    /// The attributes of a request for `path` with `method` by `user` on node `node_name`.
    #[must_use]
    pub fn new(user: UserInfo, method: &Method, path: &str, node_name: &str) -> Self {
        let verb = match *method {
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "get",
        };
        Self {
            user,
            verb: verb.to_owned(),
            name: node_name.to_owned(),
            subresource: subresource_of(path).to_owned(),
            path: path.to_owned(),
        }
    }
}

/// The kubelet's mapping of paths to `nodes` subresources (`auth.go`
/// `GetRequestAttributes`, with the fine-grained `pods`/`configz`/`healthz` of
/// `KubeletFineGrainedAuthz`); everything unlisted is `proxy`.
fn subresource_of(path: &str) -> &'static str {
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
    if under("/stats") {
        "stats"
    } else if under("/metrics") {
        "metrics"
    } else if under("/logs") {
        "log"
    } else if under("/checkpoint") {
        "checkpoint"
    } else if under("/pods") {
        "pods"
    } else if under("/configz") {
        "configz"
    } else if under("/healthz") {
        "healthz"
    } else {
        "proxy"
    }
}

/// Whether a request may proceed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Denied, with the reason (logged, not sent).
    Deny(String),
}

/// Decides on authenticated requests (`authorization.mode`).
#[async_trait::async_trait]
pub trait Authorizer: Send + Sync {
    /// The decision for `attributes`.
    async fn authorize(&self, attributes: &RequestAttributes) -> Decision;
}

/// `authorization.mode: AlwaysAllow`: every authenticated request is allowed.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysAllow;

#[async_trait::async_trait]
impl Authorizer for AlwaysAllow {
    async fn authorize(&self, _attributes: &RequestAttributes) -> Decision {
        Decision::Allow
    }
}

/// An authorizer that returns a set decision and records what it was asked.
#[derive(Debug)]
pub struct FakeAuthorizer {
    decision: Decision,
    seen: Mutex<Vec<RequestAttributes>>,
}

impl FakeAuthorizer {
    /// An authorizer answering `decision` to everything.
    #[must_use]
    pub fn new(decision: Decision) -> Self {
        Self { decision, seen: Mutex::new(Vec::new()) }
    }

    /// The attributes of every request asked about so far.
    #[must_use]
    pub fn seen(&self) -> Vec<RequestAttributes> {
        self.seen.lock().expect("fake authorizer lock").clone()
    }
}

#[async_trait::async_trait]
impl Authorizer for FakeAuthorizer {
    async fn authorize(&self, attributes: &RequestAttributes) -> Decision {
        self.seen.lock().expect("fake authorizer lock").push(attributes.clone());
        self.decision.clone()
    }
}

/// Authentication settings and the authorizer, shared by every request.
#[derive(Clone)]
pub(crate) struct AuthState {
    /// Client certificates are verified (a CA is configured).
    pub x509: bool,
    pub anonymous: bool,
    pub node_name: String,
    pub authorizer: Arc<dyn Authorizer>,
}

impl std::fmt::Debug for AuthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthState")
            .field("x509", &self.x509)
            .field("anonymous", &self.anonymous)
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl AuthState {
    /// The user of a request, or `None` (401).
    pub(crate) fn authenticate(&self, tls: Option<&TlsInfo>, headers: &HeaderMap) -> Option<UserInfo> {
        if self.x509
            && let Some(leaf) = tls.and_then(|info| info.peer_certificates.first())
            && let Some(user) = user_from_certificate(leaf)
        {
            return Some(user);
        }
        let has_bearer_token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case("bearer "));
        if has_bearer_token {
            return None;
        }
        self.anonymous.then(|| UserInfo {
            name: "system:anonymous".to_owned(),
            groups: vec!["system:unauthenticated".to_owned()],
        })
    }
}

/// CN as the user and O values as groups, as the apiserver's x509 authenticator maps them.
fn user_from_certificate(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    if name.is_empty() {
        return None;
    }
    let mut groups: Vec<String> =
        subject.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_owned)).collect();
    groups.push("system:authenticated".to_owned());
    Some(UserInfo { name, groups })
}

/// The middleware in front of every route of the HTTPS API.
pub(crate) async fn filter(State(auth): State<AuthState>, mut request: Request, next: Next) -> Response {
    let tls = request.extensions().get::<Arc<TlsInfo>>().cloned();
    let Some(user) = auth.authenticate(tls.as_deref(), request.headers()) else {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    };
    let attributes = RequestAttributes::new(user, request.method(), request.uri().path(), &auth.node_name);
    if let Decision::Deny(reason) = auth.authorizer.authorize(&attributes).await {
        let message = format!(
            "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
            attributes.user.name, attributes.verb, attributes.subresource
        );
        tracing::debug!(%message, %reason, "request denied");
        return status(StatusCode::FORBIDDEN, "Forbidden", message);
    }
    request.extensions_mut().insert(attributes.user);
    next.run(request).await
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
            ("/stats/summary", "stats"),
            ("/stats", "stats"),
            ("/statsfoo", "proxy"),
            ("/metrics", "metrics"),
            ("/metrics/cadvisor", "metrics"),
            ("/logs/syslog", "log"),
            ("/pods", "pods"),
            ("/configz", "configz"),
            ("/healthz", "healthz"),
            ("/run/ns/pod/c", "proxy"),
        ] {
            assert_eq!(subresource_of(path), want, "{path}");
        }
    }

    #[test]
    fn verbs_follow_the_method() {
        let user = UserInfo { name: "u".into(), groups: vec![] };
        let attrs = RequestAttributes::new(user.clone(), &Method::POST, "/exec/a/b/c", "n");
        assert_eq!((attrs.verb.as_str(), attrs.subresource.as_str()), ("create", "proxy"));
        let attrs = RequestAttributes::new(user, &Method::HEAD, "/pods", "n");
        assert_eq!((attrs.verb.as_str(), attrs.subresource.as_str()), ("get", "pods"));
    }

    #[test]
    fn anonymous_and_bearer_tokens() {
        let state =
            |anonymous| AuthState { x509: false, anonymous, node_name: "n".into(), authorizer: Arc::new(AlwaysAllow) };
        let none = HeaderMap::new();
        let mut bearer = HeaderMap::new();
        bearer.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(state(false).authenticate(None, &none), None);
        let anon = state(true).authenticate(None, &none).unwrap();
        assert_eq!(anon.name, "system:anonymous");
        assert_eq!(anon.groups, ["system:unauthenticated"]);
        assert_eq!(state(true).authenticate(None, &bearer), None);
    }
}
