//! The HTTP front: request recording and injected failures, authentication (client
//! certificate, then bearer token, as the real server's union authenticator orders them),
//! routing of `/api`, `/apis`, `/version` and the resource paths, and the REST verbs
//! (`handlers/{create,get,update,patch,delete,watch}.go` of the real server).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode, header};
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::auth::{Auth, Authn, UserInfo};
use super::patch::{self, PatchType};
use super::registry::{self, Ctx, DeleteOpts, ListOpts, Part};
use super::resources::{self, ResourceInfo};
use super::selector::{FieldSelector, LabelSelector};
use super::status::{FieldError, StatusError};
use super::watch::{self, WatchParams};
use super::{FailureMode, PeerCertificates, RecordedRequest, Shared, meta};

/// The real server's limit on request bodies (3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Serves one request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    cancel: CancellationToken,
    peer: PeerCertificates,
    req: http::Request<hyper::body::Incoming>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return status_response(&StatusError::new(
                413,
                "RequestEntityTooLarge",
                format!("Request entity too large: limit is {MAX_BODY}"),
            ));
        }
    };
    let header_str = |h: &HeaderMap, k: header::HeaderName| h.get(k).and_then(|v| v.to_str().ok()).map(String::from);
    let mut record = RecordedRequest {
        seq: 0,
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or("").to_string(),
        user_agent: header_str(&parts.headers, header::USER_AGENT),
        content_type: header_str(&parts.headers, header::CONTENT_TYPE),
        body: String::from_utf8_lossy(&body).into_owned(),
        user: None,
        status: 0,
    };
    record.seq = shared.record(record.clone());
    let resp = serve(&shared, &cancel, peer.as_deref(), &parts, &body, &mut record).await;
    shared.finish_record(record.seq, resp.status().as_u16(), record.user.take());
    resp
}

async fn serve(
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
    peer: Option<&[rustls::pki_types::CertificateDer<'static>]>,
    parts: &http::request::Parts,
    body: &Bytes,
    record: &mut RecordedRequest,
) -> Response<Body> {
    let failure = shared.failures.check(record);
    if let Some(FailureMode::Status(code)) = failure {
        return status_response(&StatusError::injected(code));
    }
    if failure == Some(FailureMode::Hang) && !shared.failures.hang(record, cancel).await {
        // The server stopped while the request hung: the connection goes away.
        return status_response(&StatusError::new(503, "ServiceUnavailable", "server stopping"));
    }
    let Some(user) = authenticate(shared, peer, &parts.headers) else {
        return status_response(&StatusError::unauthorized());
    };
    record.user = Some(user.username.clone());
    match route(shared, cancel, parts, body, &user) {
        Ok(r) => r,
        Err(e) => status_response(&e),
    }
}

/// The union authenticator: the client certificate if it verifies (user = subject CN,
/// groups = subject O), else the bearer token; `system:authenticated` is added.
fn authenticate(
    shared: &Shared,
    peer: Option<&[rustls::pki_types::CertificateDer<'static>]>,
    headers: &HeaderMap,
) -> Option<UserInfo> {
    if let Some(chain) = peer
        && let Ok(c) = shared.ca.authenticate(chain)
        // A certificate without a common name authenticates nobody.
        && !c.common_name.is_empty()
    {
        let mut groups = c.organizations;
        groups.push("system:authenticated".into());
        let mut user = UserInfo { username: c.common_name, groups, ..UserInfo::default() };
        let fingerprint = meta::hex_string(&<sha2::Sha256 as sha2::Digest>::digest(&chain[0]));
        user.extra
            .insert("authentication.kubernetes.io/credential-id".into(), vec![format!("X509SHA256={fingerprint}")]);
        return Some(user);
    }
    bearer(shared, headers)
}

fn bearer(shared: &Shared, headers: &HeaderMap) -> Option<UserInfo> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return None;
    }
    let d = shared.store.lock();
    match shared.auth.authenticate(&d, token.trim(), &[]) {
        Authn::Ok { user, .. } => Some(user),
        Authn::Unknown | Authn::Failed(_) => None,
    }
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(v.to_string()))
        .expect("valid response")
}

pub(crate) fn status_response(e: &StatusError) -> Response<Body> {
    let mut r = json_response(e.code, &e.to_status());
    if matches!(e.code, 429 | 503 | 504) {
        r.headers_mut().insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    }
    r
}

fn text_response(code: u16, text: &'static str) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(text))
        .expect("valid response")
}

fn pct_decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                if let Ok(v) = u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    out.push(v);
                    i += 3;
                } else {
                    out.push(b'%');
                    i += 1;
                }
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Query parameters (the last value wins; `kube` starts its queries with `&`).
pub(crate) fn parse_query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (pct_decode(k, true), pct_decode(v, true))
        })
        .collect()
}

/// A resource request: which resource, namespace, object and subresource.
struct Target {
    info: &'static ResourceInfo,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_target(group: &str, version: &str, rest: &[String]) -> Option<Target> {
    if let [first, ns, res, tail @ ..] = rest
        && first == "namespaces"
        && let Some(info) = resources::find(group, version, res).filter(|i| i.namespaced)
        && tail.len() <= 2
    {
        return Some(Target {
            info,
            namespace: Some(ns.clone()),
            name: tail.first().cloned(),
            sub: tail.get(1).cloned(),
        });
    }
    let [res, tail @ ..] = rest else { return None };
    let info = resources::find(group, version, res)?;
    if tail.len() > 2 || (info.namespaced && !tail.is_empty()) {
        return None;
    }
    Some(Target { info, namespace: None, name: tail.first().cloned(), sub: tail.get(1).cloned() })
}

fn route(
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
    parts: &http::request::Parts,
    body: &Bytes,
    user: &UserInfo,
) -> Result<Response<Body>, StatusError> {
    let segs: Vec<String> =
        parts.uri.path().split('/').filter(|s| !s.is_empty()).map(|s| pct_decode(s, false)).collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let get = parts.method == Method::GET;
    let target = match s.as_slice() {
        [] if get => {
            return Ok(json_response(
                200,
                &json!({ "paths": ["/api", "/api/v1", "/apis", "/apis/", "/healthz", "/livez", "/readyz", "/version"] }),
            ));
        }
        ["healthz" | "livez" | "readyz", ..] if get => return Ok(text_response(200, "ok")),
        ["version"] if get => return Ok(json_response(200, &resources::version())),
        ["api"] if get => return Ok(json_response(200, &resources::api_versions(&shared.server_address))),
        ["apis"] if get => return Ok(json_response(200, &resources::api_group_list())),
        ["api", v] if get => {
            return resources::api_resource_list("", v)
                .map(|l| json_response(200, &l))
                .ok_or_else(StatusError::no_such_resource);
        }
        ["apis", g] if get => {
            return resources::api_group(g).map(|l| json_response(200, &l)).ok_or_else(StatusError::no_such_resource);
        }
        ["apis", g, v] if get => {
            return resources::api_resource_list(g, v)
                .map(|l| json_response(200, &l))
                .ok_or_else(StatusError::no_such_resource);
        }
        ["api", v, ..] => parse_target("", v, &segs[2..]),
        ["apis", g, v, ..] => parse_target(g, v, &segs[3..]),
        _ => return Ok(text_response(404, "404 page not found\n")),
    };
    let Some(t) = target else { return Err(StatusError::no_such_resource()) };
    let q = parse_query(parts.uri.query().unwrap_or(""));
    let ctx = Ctx {
        dry_run: q.get("dryRun").is_some_and(|v| v == "All"),
        mount_token: shared.opts.mount_service_account_token,
        user: Some(user),
    };
    if let Some(ns) = &t.namespace
        && ns.is_empty()
    {
        return Err(StatusError::bad_request("namespace is required"));
    }
    let ns = t.namespace.as_deref();
    match (&parts.method, t.name.as_deref(), t.sub.as_deref()) {
        (&Method::POST, None, None) if t.info.review => review(shared, &t, user, body),
        (_, _, _) if t.info.review => Err(StatusError::method_not_allowed()),
        (&Method::GET, None, None) => {
            if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
                start_watch(shared, cancel, &t, &q)
            } else {
                let opts = list_opts(t.info, &q)?;
                let list = registry::list(&mut shared.store.lock(), t.info, ns, &opts)?;
                Ok(json_response(200, &list))
            }
        }
        (&Method::GET, Some(name), sub @ (None | Some("status" | "resize" | "ephemeralcontainers" | "approval"))) => {
            if sub.is_some_and(|s| !t.info.has_subresource(s)) {
                return Err(StatusError::no_such_resource());
            }
            Ok(json_response(200, &registry::get(&shared.store.lock(), t.info, ns, name)?))
        }
        (&Method::POST, None, None) => {
            if t.info.namespaced && ns.is_none() {
                return Err(StatusError::method_not_allowed());
            }
            let obj = parse_json(body)?;
            let created = registry::create(&mut shared.store.lock(), ctx, t.info, ns, obj)?;
            Ok(json_response(201, &created))
        }
        (
            &Method::PUT,
            Some(name),
            sub @ (None | Some("status" | "finalize" | "resize" | "ephemeralcontainers" | "approval")),
        ) => {
            let part = match sub {
                None => Part::Main,
                Some("status") if t.info.has_subresource("status") => Part::Status,
                Some("approval") if t.info.has_subresource("approval") => Part::Approval,
                Some("resize") if t.info.has_subresource("resize") => Part::Resize,
                Some("ephemeralcontainers") if t.info.has_subresource("ephemeralcontainers") => {
                    Part::EphemeralContainers
                }
                Some("finalize") if t.info.storage == "namespaces" => Part::Finalize,
                _ => return Err(StatusError::no_such_resource()),
            };
            let obj = parse_json(body)?;
            let u = registry::update(&mut shared.store.lock(), ctx, t.info, ns, name, part, false, move |_| Ok(obj))?;
            Ok(json_response(if u.created { 201 } else { 200 }, &u.object))
        }
        (&Method::PATCH, Some(name), sub @ (None | Some("status" | "resize" | "ephemeralcontainers" | "approval"))) => {
            let part = match sub {
                None => Part::Main,
                Some("approval") if t.info.has_subresource("approval") => Part::Approval,
                Some("resize") if t.info.has_subresource("resize") => Part::Resize,
                Some("ephemeralcontainers") if t.info.has_subresource("ephemeralcontainers") => {
                    Part::EphemeralContainers
                }
                Some("status") if t.info.has_subresource("status") => Part::Status,
                Some(_) => return Err(StatusError::no_such_resource()),
            };
            patch_object(shared, ctx, &t, name, part, parts, body, &q)
        }
        (&Method::DELETE, Some(name), None) => {
            let opts = delete_opts(body, &q)?;
            let ctx = Ctx { dry_run: ctx.dry_run || opts.1, ..ctx };
            let d = registry::delete(&mut shared.store.lock(), ctx, t.info, ns, name, &opts.0)?;
            Ok(json_response(200, &delete_result(t.info, &d)))
        }
        (&Method::DELETE, None, None) => {
            let (opts, dry) = delete_opts(body, &q)?;
            let ctx = Ctx { dry_run: ctx.dry_run || dry, ..ctx };
            let lopts = list_opts(t.info, &q)?;
            let mut d = shared.store.lock();
            let names: Vec<(String, String)> = d
                .iter(t.info.storage, ns)
                .filter(|o| registry::matches(t.info, o, ns, &lopts.label, &lopts.field))
                .map(|o| (meta::namespace(o).to_string(), meta::name(o).to_string()))
                .collect();
            let mut items = Vec::new();
            for (ons, oname) in names {
                let ons = if ons.is_empty() { None } else { Some(ons.as_str()) };
                if let Ok(r) = registry::delete(&mut d, ctx, t.info, ons, &oname, &opts) {
                    items.push(r.object);
                }
            }
            Ok(json_response(
                200,
                &json!({ "kind": t.info.list_kind(), "apiVersion": t.info.api_version(),
                         "metadata": { "resourceVersion": d.rv().to_string() }, "items": items }),
            ))
        }
        (&Method::POST, Some(name), Some("token")) if t.info.storage == "serviceaccounts" => {
            let req = parse_json(body)?;
            let d = shared.store.lock();
            let out = shared.auth.token_request(&d, ns.unwrap_or(""), name, &req)?;
            Ok(json_response(201, &out))
        }
        (&Method::POST, Some(name), Some("eviction")) if t.info.storage == "pods" => {
            let ev = parse_json(body)?;
            let ev_name = meta::name(&ev);
            if !ev_name.is_empty() && ev_name != name {
                return Err(StatusError::bad_request("name in URL does not match name in Eviction object"));
            }
            let (opts, dry) = delete_opts_from(ev.get("deleteOptions"), &q)?;
            let ctx = Ctx { dry_run: ctx.dry_run || dry, ..ctx };
            registry::delete(&mut shared.store.lock(), ctx, t.info, ns, name, &opts)?;
            Ok(json_response(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        (&Method::POST, Some(name), Some("binding")) if t.info.storage == "pods" => {
            let b = parse_json(body)?;
            let node = meta::str_at(&b, &["target", "name"]).to_string();
            bind(shared, ctx, t.info, ns, name, &node)?;
            Ok(json_response(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        (&Method::GET | &Method::POST | &Method::PUT | &Method::PATCH | &Method::DELETE, _, Some(sub))
            if !t.info.has_subresource(sub) =>
        {
            Err(StatusError::no_such_resource())
        }
        _ => Err(StatusError::method_not_allowed()),
    }
}

fn parse_json(body: &Bytes) -> Result<Value, StatusError> {
    serde_json::from_slice(body)
        .map_err(|e| StatusError::bad_request(format!("the object provided is unrecognized or invalid JSON: {e}")))
}

fn list_opts(info: &ResourceInfo, q: &HashMap<String, String>) -> Result<ListOpts, StatusError> {
    Ok(ListOpts {
        label: LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?,
        field: FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str), info)?,
        limit: match q.get("limit").filter(|l| !l.is_empty()) {
            Some(l) => Some(l.parse().map_err(|_| StatusError::bad_request(format!("invalid limit: {l}")))?),
            None => None,
        },
        continue_token: q.get("continue").filter(|c| !c.is_empty()).cloned(),
        resource_version: q.get("resourceVersion").cloned(),
        resource_version_match: q.get("resourceVersionMatch").filter(|m| !m.is_empty()).cloned(),
    })
}

fn start_watch(
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
    t: &Target,
    q: &HashMap<String, String>,
) -> Result<Response<Body>, StatusError> {
    let opts = list_opts(t.info, q)?;
    let timeout = match q.get("timeoutSeconds").filter(|v| !v.is_empty()) {
        Some(v) => Duration::from_secs(
            v.parse().map_err(|_| StatusError::bad_request(format!("invalid timeoutSeconds: {v}")))?,
        ),
        // `--min-request-timeout` (1800 s) times a random factor in [1, 2).
        None => Duration::from_secs(1800 + rand::random::<u64>() % 1800),
    };
    let flag = |k: &str| q.get(k).is_some_and(|v| v == "true" || v == "1");
    let params = WatchParams {
        info: t.info,
        namespace: t.namespace.clone(),
        label: opts.label,
        field: opts.field,
        resource_version: opts.resource_version,
        allow_bookmarks: flag("allowWatchBookmarks"),
        send_initial_events: flag("sendInitialEvents"),
        timeout,
        bookmark_interval: shared.opts.bookmark_interval,
    };
    let body = watch::start(shared.store.clone(), params, cancel.clone())?;
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .expect("valid response"))
}

/// `DeleteOptions` from the body and the query (query parameters win, as upstream).
fn delete_opts(body: &Bytes, q: &HashMap<String, String>) -> Result<(DeleteOpts, bool), StatusError> {
    let v = if body.iter().all(u8::is_ascii_whitespace) { None } else { Some(parse_json(body)?) };
    delete_opts_from(v.as_ref(), q)
}

fn delete_opts_from(v: Option<&Value>, q: &HashMap<String, String>) -> Result<(DeleteOpts, bool), StatusError> {
    let mut opts = DeleteOpts::default();
    let mut dry = false;
    if let Some(v) = v {
        opts.grace_period_seconds = v.get("gracePeriodSeconds").and_then(Value::as_i64);
        opts.precondition_uid = v.pointer("/preconditions/uid").and_then(Value::as_str).map(String::from);
        opts.precondition_rv = v.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(String::from);
        dry = v.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All"));
    }
    if let Some(g) = q.get("gracePeriodSeconds").filter(|g| !g.is_empty()) {
        opts.grace_period_seconds =
            Some(g.parse().map_err(|_| StatusError::bad_request(format!("invalid gracePeriodSeconds: {g}")))?);
    }
    Ok((opts, dry))
}

/// What DELETE answers: the object for pods (`ReturnDeletedObject`) and while deletion is
/// pending; a success Status once other objects are gone.
fn delete_result(info: &ResourceInfo, d: &registry::Deleted) -> Value {
    if info.storage == "pods" || !d.removed {
        return d.object.clone();
    }
    let mut details = json!({ "name": meta::name(&d.object), "kind": info.plural, "uid": meta::uid(&d.object) });
    if !info.group.is_empty() {
        details["group"] = json!(info.group);
    }
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details })
}

#[expect(clippy::too_many_arguments, reason = "one PATCH request, unpacked")]
fn patch_object(
    shared: &Arc<Shared>,
    ctx: Ctx<'_>,
    t: &Target,
    name: &str,
    part: Part,
    parts: &http::request::Parts,
    body: &Bytes,
    q: &HashMap<String, String>,
) -> Result<Response<Body>, StatusError> {
    let ct = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let Some(pt) = PatchType::from_content_type(ct) else {
        return Err(StatusError::unsupported_media_type(ct));
    };
    let p: Value = if pt == PatchType::Apply {
        let text = std::str::from_utf8(body).map_err(|e| StatusError::bad_request(e.to_string()))?;
        serde_json::from_str(text)
            .or_else(|_| serde_saphyr::from_str::<Value>(text))
            .map_err(|e| StatusError::bad_request(format!("error decoding YAML: {e}")))?
    } else {
        parse_json(body)?
    };
    if pt == PatchType::Apply && q.get("fieldManager").is_none_or(String::is_empty) {
        return Err(StatusError::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            &[FieldError::required("fieldManager", "is required for apply patch")],
        ));
    }
    let kind = t.info.kind;
    let u = registry::update(
        &mut shared.store.lock(),
        ctx,
        t.info,
        t.namespace.as_deref(),
        name,
        part,
        pt == PatchType::Apply,
        move |cur| {
            let Some(cur) = cur else { return Ok(p) };
            let mut obj = cur.clone();
            match pt {
                PatchType::Merge | PatchType::Apply => patch::merge_patch(&mut obj, &p),
                PatchType::Json => patch::json_patch(&mut obj, &p)?,
                PatchType::Strategic => patch::strategic_merge(&mut obj, &p, kind)?,
            }
            Ok(obj)
        },
    )?;
    Ok(json_response(if u.created { 201 } else { 200 }, &u.object))
}

/// The Binding subresource (`pkg/registry/core/pod/storage` `assignPod`).
fn bind(
    shared: &Arc<Shared>,
    ctx: Ctx<'_>,
    info: &'static ResourceInfo,
    ns: Option<&str>,
    name: &str,
    node: &str,
) -> Result<(), StatusError> {
    if node.is_empty() {
        return Err(StatusError::invalid("Binding", "", name, &[FieldError::required("target.name", "")]));
    }
    let mut d = shared.store.lock();
    let pod = registry::get(&d, info, ns, name)?;
    if meta::has_deletion_timestamp(&pod) {
        return Err(StatusError::conflict(
            info,
            name,
            &format!("pod {name} is being deleted, cannot be assigned to a host"),
        ));
    }
    let current = meta::str_at(&pod, &["spec", "nodeName"]);
    if !current.is_empty() {
        return Err(StatusError::conflict(
            info,
            name,
            &format!("pod {name} is already assigned to node \"{current}\""),
        ));
    }
    if ctx.dry_run {
        return Ok(());
    }
    let mut next = pod;
    meta::ensure_object(next.get_mut("spec").unwrap_or(&mut Value::Null)).insert("nodeName".into(), json!(node));
    let conditions = next.pointer_mut("/status").and_then(Value::as_object_mut).map(|s| {
        let c = s.entry("conditions").or_insert_with(|| json!([]));
        if !c.is_array() {
            *c = json!([]);
        }
        c.as_array_mut().expect("array")
    });
    if let Some(c) = conditions {
        c.retain(|x| x["type"] != "PodScheduled");
        c.push(json!({ "type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now() }));
    }
    d.put(info.storage, super::views::to_storage(info, next));
    Ok(())
}

fn review(shared: &Arc<Shared>, t: &Target, user: &UserInfo, body: &Bytes) -> Result<Response<Body>, StatusError> {
    let req = parse_json(body)?;
    let out = match t.info.kind {
        "TokenReview" => shared.auth.token_review(&shared.store.lock(), &req)?,
        "SelfSubjectReview" => Auth::self_subject_review(user, &req),
        _ => shared.auth.access_review(t.info, t.namespace.as_deref(), user, &req)?,
    };
    Ok(json_response(201, &out))
}
