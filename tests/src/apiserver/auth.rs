//! Authentication and authorization.
//!
//! Requests authenticate with `Authorization: Bearer <token>`: a static token the test
//! configured (token → [`UserInfo`]), or a service-account token this server issued
//! through `TokenRequest`. Anything else is a 401 (anonymous access is off). Requests are
//! not authorized (every authenticated user may do everything); the [`Authorizer`] only
//! answers `SubjectAccessReviews`, which is what a kubelet asks.
//!
//! `TokenRequest` follows `pkg/registry/core/serviceaccount/storage/token.go`: default
//! expiry 1 h, at least 10 min, audiences default to the API audiences, binding to a pod
//! (UID checked, and the pod must run as that service account) or a secret or node, and
//! the kubelet's 3607 s tokens extended to a year with a `warnafter` claim. Tokens are
//! JWTs whose signature is keyed with a per-server secret (so they look and validate like
//! the real ones, but are not `RS256` signatures). `TokenReview` follows
//! `pkg/registry/authentication/tokenreview`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::api::authorization::v1::{SubjectAccessReviewSpec, SubjectAccessReviewStatus};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::meta;
use super::resources::ResourceInfo;
use super::status::{FieldError, StatusError};
use super::store::Data;

/// Who a token belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    /// Groups; `system:authenticated` is added on authentication if absent.
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with a name and groups.
    #[must_use]
    pub fn new(username: &str, groups: &[&str]) -> Self {
        Self { username: username.into(), groups: groups.iter().map(|g| (*g).to_string()).collect(), ..Self::default() }
    }

    fn to_json(&self) -> Value {
        let mut u = json!({ "username": self.username, "groups": self.groups });
        if !self.uid.is_empty() {
            u["uid"] = json!(self.uid);
        }
        if !self.extra.is_empty() {
            u["extra"] = json!(self.extra);
        }
        u
    }
}

/// A decision function for `SubjectAccessReviews`.
pub type AuthorizerFn = dyn Fn(&SubjectAccessReviewSpec) -> SubjectAccessReviewStatus + Send + Sync;

/// How `SubjectAccessReviews` (and their self/local variants) are answered.
#[derive(Clone, Default)]
pub enum Authorizer {
    /// Everything is allowed (the default).
    #[default]
    AllowAll,
    /// Everything is denied (`denied: true`, as a deny authorizer).
    DenyAll,
    /// The test decides.
    Custom(Arc<AuthorizerFn>),
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AllowAll => f.write_str("AllowAll"),
            Self::DenyAll => f.write_str("DenyAll"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl Authorizer {
    /// Allowed when `pred` holds, otherwise no opinion (`allowed: false`), as RBAC answers.
    pub fn allow_if(pred: impl Fn(&SubjectAccessReviewSpec) -> bool + Send + Sync + 'static) -> Self {
        Self::Custom(Arc::new(move |spec| {
            let allowed = pred(spec);
            SubjectAccessReviewStatus {
                allowed,
                reason: Some(if allowed { "allowed by test predicate" } else { "no rule allows it" }.into()),
                ..SubjectAccessReviewStatus::default()
            }
        }))
    }

    /// A kubelet's view of RBAC: allowed when a rule `(subject, verb, subresource)` matches a
    /// review of `nodes/<subresource>`, where the subject is the user's name or one of its
    /// groups and `"*"` matches any verb or subresource; otherwise no opinion (`allowed:
    /// false`), as RBAC answers. Reviews of other resources are never allowed.
    #[must_use]
    pub fn node_rules(rules: &[(&str, &str, &str)]) -> Self {
        let rules: Vec<(String, String, String)> =
            rules.iter().map(|(s, v, r)| ((*s).to_string(), (*v).to_string(), (*r).to_string())).collect();
        Self::allow_if(move |spec| {
            let Some(ra) = spec.resource_attributes.as_ref() else { return false };
            if ra.resource.as_deref() != Some("nodes") || ra.group.as_deref().is_some_and(|g| !g.is_empty()) {
                return false;
            }
            let verb = ra.verb.as_deref().unwrap_or("");
            let subresource = ra.subresource.as_deref().unwrap_or("");
            let is_subject = |s: &str| {
                spec.user.as_deref() == Some(s) || spec.groups.as_ref().is_some_and(|g| g.iter().any(|g| g == s))
            };
            rules.iter().any(|(s, v, r)| is_subject(s) && (v == "*" || v == verb) && (r == "*" || r == subresource))
        })
    }

    fn decide(&self, spec: &SubjectAccessReviewSpec) -> SubjectAccessReviewStatus {
        match self {
            Self::AllowAll => SubjectAccessReviewStatus {
                allowed: true,
                reason: Some("allowed by test authorizer".into()),
                ..SubjectAccessReviewStatus::default()
            },
            Self::DenyAll => SubjectAccessReviewStatus {
                allowed: false,
                denied: Some(true),
                reason: Some("denied by test authorizer".into()),
                ..SubjectAccessReviewStatus::default()
            },
            Self::Custom(f) => f(spec),
        }
    }
}

/// The kubelet's projected-token expiry that the real server extends (`WarnOnlyBoundTokenExpirationSeconds`).
const WARN_ONLY_EXPIRATION: i64 = 3607;
/// One year (`ExpirationExtensionSeconds`).
const EXTENDED_EXPIRATION: i64 = 365 * 24 * 3600;

/// Authentication state of one server.
#[derive(Debug)]
pub(crate) struct Auth {
    tokens: RwLock<HashMap<String, UserInfo>>,
    authorizer: RwLock<Authorizer>,
    secret: [u8; 32],
    key_id: String,
    /// Issuer of service-account tokens; also the API audience.
    pub issuer: String,
}

/// The outcome of authenticating a token.
pub(crate) enum Authn {
    Ok {
        user: UserInfo,
        audiences: Vec<String>,
    },
    /// Not a token of this server (no error, as the union authenticator says).
    Unknown,
    /// A token of this server that does not authenticate (expired, wrong audience, ...).
    Failed(String),
}

impl Auth {
    pub(crate) fn new(issuer: String, tokens: HashMap<String, UserInfo>, authorizer: Authorizer) -> Self {
        let secret: [u8; 32] = rand::random();
        let key_id = URL_SAFE_NO_PAD.encode(&Sha256::digest(secret)[..20]);
        Self { tokens: RwLock::new(tokens), authorizer: RwLock::new(authorizer), secret, key_id, issuer }
    }

    pub(crate) fn add_token(&self, token: &str, user: UserInfo) {
        self.tokens.write().unwrap_or_else(PoisonError::into_inner).insert(token.to_string(), user);
    }

    pub(crate) fn set_authorizer(&self, a: Authorizer) {
        *self.authorizer.write().unwrap_or_else(PoisonError::into_inner) = a;
    }

    fn api_audiences(&self) -> Vec<String> {
        vec![self.issuer.clone()]
    }

    fn sign(&self, data: &str) -> String {
        let mut sig = Vec::with_capacity(256);
        for i in 0u8..8 {
            let mut h = Sha256::new();
            h.update(self.secret);
            h.update([i]);
            h.update(data.as_bytes());
            sig.extend_from_slice(&h.finalize());
        }
        URL_SAFE_NO_PAD.encode(sig)
    }

    fn issue(&self, claims: &Value) -> String {
        let header = json!({ "alg": "RS256", "kid": self.key_id });
        let data =
            format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()));
        let sig = self.sign(&data);
        format!("{data}.{sig}")
    }

    /// Authenticates a bearer token for `audiences` (the API audiences when empty).
    pub(crate) fn authenticate(&self, d: &Data, token: &str, audiences: &[String]) -> Authn {
        let audiences = if audiences.is_empty() { self.api_audiences() } else { audiences.to_vec() };
        if let Some(u) = self.tokens.read().unwrap_or_else(PoisonError::into_inner).get(token) {
            // Static tokens are audience-agnostic: they are valid for the API audiences.
            let auds: Vec<String> = audiences.iter().filter(|a| self.api_audiences().contains(a)).cloned().collect();
            if auds.is_empty() {
                return Authn::Failed("token audiences are not valid for the requested audiences".into());
            }
            let mut user = u.clone();
            if !user.groups.iter().any(|g| g == "system:authenticated") {
                user.groups.push("system:authenticated".into());
            }
            return Authn::Ok { user, audiences: auds };
        }
        let Some(claims) = self.verify(token) else { return Authn::Unknown };
        Self::validate_sa_claims(d, &claims, &audiences)
    }

    fn verify(&self, token: &str) -> Option<Value> {
        let mut parts = token.split('.');
        let (h, p, s) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || self.sign(&format!("{h}.{p}")) != s {
            return None;
        }
        let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).ok()?).ok()?;
        (claims["iss"] == self.issuer.as_str()).then_some(claims)
    }

    fn validate_sa_claims(d: &Data, claims: &Value, audiences: &[String]) -> Authn {
        let now = jiff::Timestamp::now().as_second();
        if claims["exp"].as_i64().is_some_and(|exp| exp < now) {
            return Authn::Failed("service account token has expired".into());
        }
        let token_auds: Vec<String> =
            claims["aud"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(String::from)).collect();
        let auds: Vec<String> = audiences.iter().filter(|a| token_auds.contains(a)).cloned().collect();
        if auds.is_empty() {
            return Authn::Failed(format!(
                "token audiences {token_auds:?} is invalid for the target audiences {audiences:?}"
            ));
        }
        let k = &claims["kubernetes.io"];
        let ns = k["namespace"].as_str().unwrap_or("");
        let sa_name = k["serviceaccount"]["name"].as_str().unwrap_or("");
        let sa_uid = k["serviceaccount"]["uid"].as_str().unwrap_or("");
        match d.get("serviceaccounts", &(ns.into(), sa_name.into())) {
            Some(sa) if meta::uid(&sa) == sa_uid => {}
            Some(_) | None => {
                return Authn::Failed(format!("service account {ns}/{sa_name} has been deleted"));
            }
        }
        let mut extra = BTreeMap::new();
        if let Some(pod_name) = k["pod"]["name"].as_str() {
            let pod_uid = k["pod"]["uid"].as_str().unwrap_or("");
            match d.get("pods", &(ns.into(), pod_name.into())) {
                Some(p) if meta::uid(&p) == pod_uid => {}
                _ => return Authn::Failed(format!("pod {ns}/{pod_name} (uid {pod_uid}) has been deleted")),
            }
            extra.insert("authentication.kubernetes.io/pod-name".into(), vec![pod_name.to_string()]);
            extra.insert("authentication.kubernetes.io/pod-uid".into(), vec![pod_uid.to_string()]);
        }
        if let Some(node) = k["node"]["name"].as_str() {
            extra.insert("authentication.kubernetes.io/node-name".into(), vec![node.to_string()]);
            extra.insert(
                "authentication.kubernetes.io/node-uid".into(),
                vec![k["node"]["uid"].as_str().unwrap_or("").into()],
            );
        }
        if let Some(jti) = claims["jti"].as_str() {
            extra.insert("authentication.kubernetes.io/credential-id".into(), vec![format!("JTI={jti}")]);
        }
        let user = UserInfo {
            username: format!("system:serviceaccount:{ns}:{sa_name}"),
            uid: sa_uid.into(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
            extra,
        };
        Authn::Ok { user, audiences: auds }
    }

    /// `POST .../tokenreviews`.
    pub(crate) fn token_review(&self, d: &Data, body: &Value) -> Result<Value, StatusError> {
        let token = body.pointer("/spec/token").and_then(Value::as_str).unwrap_or("");
        if token.is_empty() {
            return Err(StatusError::bad_request("token is required for TokenReview in authentication"));
        }
        let requested: Vec<String> = body
            .pointer("/spec/audiences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        let status = match self.authenticate(d, token, &requested) {
            Authn::Ok { user, audiences } => {
                json!({ "authenticated": true, "user": user.to_json(), "audiences": audiences })
            }
            Authn::Unknown => json!({ "user": {} }),
            Authn::Failed(e) => json!({ "user": {}, "error": e }),
        };
        let mut out = review_echo(body, "authentication.k8s.io/v1", "TokenReview");
        out["status"] = status;
        Ok(out)
    }

    /// `POST .../selfsubjectreviews`.
    pub(crate) fn self_subject_review(requester: &UserInfo, body: &Value) -> Value {
        let mut out = review_echo(body, "authentication.k8s.io/v1", "SelfSubjectReview");
        out["status"] = json!({ "userInfo": requester.to_json() });
        out
    }

    /// `SubjectAccessReview` and its self and local variants.
    pub(crate) fn access_review(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        requester: &UserInfo,
        body: &Value,
    ) -> Result<Value, StatusError> {
        let mut spec: SubjectAccessReviewSpec = serde_json::from_value(body.get("spec").cloned().unwrap_or(json!({})))
            .map_err(|e| StatusError::bad_request(format!("invalid spec: {e}")))?;
        let mut errs = Vec::new();
        if info.kind == "SelfSubjectAccessReview" {
            spec.user = Some(requester.username.clone());
            spec.uid = Some(requester.uid.clone()).filter(|u| !u.is_empty());
            spec.groups = Some(requester.groups.clone());
            spec.extra = Some(requester.extra.clone()).filter(|e| !e.is_empty());
        } else if spec.user.as_deref().unwrap_or("").is_empty() && spec.groups.as_ref().is_none_or(Vec::is_empty) {
            errs.push(FieldError::invalid("spec.user", json!(""), "at least one of user or group must be specified"));
        }
        if spec.resource_attributes.is_some() == spec.non_resource_attributes.is_some() {
            errs.push(FieldError::invalid(
                "spec.resourceAttributes",
                json!(null),
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
        if info.kind == "LocalSubjectAccessReview" {
            let ns = ns.unwrap_or("");
            match spec.resource_attributes.as_mut() {
                Some(ra) if ra.namespace.as_deref().unwrap_or("").is_empty() => ra.namespace = Some(ns.into()),
                Some(ra) if ra.namespace.as_deref() != Some(ns) => errs.push(FieldError::invalid(
                    "spec.resourceAttributes.namespace",
                    json!(ra.namespace),
                    "must match metadata.namespace",
                )),
                _ => {}
            }
        }
        if !errs.is_empty() {
            return Err(StatusError::invalid(info.kind, info.group, "", &errs));
        }
        let authorizer = self.authorizer.read().unwrap_or_else(PoisonError::into_inner).clone();
        let status = authorizer.decide(&spec);
        let mut out = review_echo(body, "authorization.k8s.io/v1", info.kind);
        if info.kind != "SelfSubjectAccessReview" {
            out["spec"] = serde_json::to_value(&spec).unwrap_or_default();
        }
        out["status"] = serde_json::to_value(&status).unwrap_or_default();
        Ok(out)
    }

    /// `POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`.
    pub(crate) fn token_request(&self, d: &Data, ns: &str, sa_name: &str, body: &Value) -> Result<Value, StatusError> {
        let sa_info = super::resources::find("", "v1", "serviceaccounts").expect("served");
        let Some(sa) = d.get("serviceaccounts", &(ns.into(), sa_name.into())) else {
            return Err(StatusError::not_found(sa_info, sa_name));
        };
        let mut spec = body.get("spec").cloned().unwrap_or(json!({}));
        let spec_map = meta::ensure_object(&mut spec);
        let requested = spec_map.get("expirationSeconds").and_then(Value::as_i64).unwrap_or(3600);
        spec_map.insert("expirationSeconds".into(), json!(requested));
        let auds = spec_map.get("audiences").and_then(Value::as_array).filter(|a| !a.is_empty()).cloned();
        let auds = auds.unwrap_or_else(|| self.api_audiences().into_iter().map(Value::from).collect());
        spec_map.insert("audiences".into(), json!(auds));
        let invalid = |e: FieldError| StatusError::invalid("TokenRequest", "authentication.k8s.io", sa_name, &[e]);
        if requested < 600 {
            return Err(invalid(FieldError::invalid(
                "spec.expirationSeconds",
                json!(requested),
                "may not specify a duration less than 10 minutes",
            )));
        }
        if requested > 1 << 32 {
            return Err(invalid(FieldError::invalid(
                "spec.expirationSeconds",
                json!(requested),
                "may not specify a duration larger than 2^32 seconds",
            )));
        }
        let mut k8s = json!({
            "namespace": ns,
            "serviceaccount": { "name": sa_name, "uid": meta::uid(&sa) },
        });
        let mut pod_bound = false;
        if let Some(r) = spec_map.get("boundObjectRef").filter(|r| !r.is_null()) {
            let kind = r["kind"].as_str().unwrap_or("");
            let name = r["name"].as_str().unwrap_or("");
            let uid = r["uid"].as_str().unwrap_or("");
            let (storage, key, plural) = match kind {
                "Pod" => ("pods", (ns.to_string(), name.to_string()), "pods"),
                "Secret" => ("secrets", (ns.to_string(), name.to_string()), "secrets"),
                "Node" => ("nodes", (String::new(), name.to_string()), "nodes"),
                other => {
                    return Err(StatusError::bad_request(format!("cannot bind token to object of type {other}")));
                }
            };
            let info = super::resources::find("", "v1", plural).expect("served");
            let Some(obj) = d.get(storage, &key) else {
                return Err(StatusError::not_found(info, name));
            };
            if !uid.is_empty() && uid != meta::uid(&obj) {
                return Err(StatusError::conflict(
                    info,
                    name,
                    &format!(
                        "the UID in the bound object reference ({uid}) does not match the UID in record. \
                         The object might have been deleted and then recreated"
                    ),
                ));
            }
            let field = match kind {
                "Pod" => "pod",
                "Secret" => "secret",
                _ => "node",
            };
            k8s[field] = json!({ "name": name, "uid": meta::uid(&obj) });
            if kind == "Pod" {
                pod_bound = true;
                let pod_sa = meta::str_at(&obj, &["spec", "serviceAccountName"]);
                if pod_sa != sa_name {
                    return Err(StatusError::bad_request(format!(
                        "cannot bind token for serviceaccount \"{sa_name}\" to pod running with different serviceaccount name."
                    )));
                }
                let node = meta::str_at(&obj, &["spec", "nodeName"]);
                if !node.is_empty()
                    && let Some(n) = d.get("nodes", &(String::new(), node.to_string()))
                {
                    k8s["node"] = json!({ "name": node, "uid": meta::uid(&n) });
                }
            }
        }
        let now = jiff::Timestamp::now().as_second();
        let kube_audiences = auds.iter().all(|a| a.as_str() == Some(self.issuer.as_str()));
        let mut exp = requested;
        if pod_bound && requested == WARN_ONLY_EXPIRATION && kube_audiences {
            k8s["warnafter"] = json!(now + requested);
            exp = EXTENDED_EXPIRATION;
        }
        let claims = json!({
            "aud": auds,
            "exp": now + exp,
            "iat": now,
            "nbf": now,
            "iss": self.issuer,
            "jti": meta::new_uid(),
            "kubernetes.io": k8s,
            "sub": format!("system:serviceaccount:{ns}:{sa_name}"),
        });
        let token = self.issue(&claims);
        Ok(json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": { "name": sa_name, "namespace": ns, "creationTimestamp": meta::time_string(now) },
            "spec": spec,
            "status": { "token": token, "expirationTimestamp": meta::time_string(now + requested) },
        }))
    }
}

/// A review object as returned: the request's metadata and spec with the server's kind.
fn review_echo(body: &Value, api_version: &str, kind: &str) -> Value {
    let mut metadata = body.get("metadata").cloned().unwrap_or(json!({}));
    meta::ensure_object(&mut metadata).insert("creationTimestamp".into(), Value::Null);
    json!({
        "kind": kind,
        "apiVersion": api_version,
        "metadata": metadata,
        "spec": body.get("spec").cloned().unwrap_or(json!({})),
    })
}
