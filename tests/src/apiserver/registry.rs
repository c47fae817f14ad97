//! The generic registry (`apiserver/pkg/registry/generic/registry/store.go` and
//! `pkg/registry/rest`) with the per-resource strategies: create, get, list, guaranteed
//! update (optimistic concurrency on `metadata.resourceVersion`), the status
//! subresource, graceful deletion of pods, finalizers, and the namespace lifecycle
//! (`NamespaceLifecycle` admission plus what the namespace controller does on deletion).

use serde_json::{Value, json};

use super::admission;
use super::auth::UserInfo;
use super::certificates;
use super::meta;
use super::resources::{self, ResourceInfo};
use super::selector::{FieldSelector, LabelSelector};
use super::status::{FieldError, OPTIMISTIC_LOCK_MSG, StatusError};
use super::store::{Data, Key, Page};
use super::views;

/// Namespaces that exist from the start; the first three may never be deleted.
pub(crate) const IMMORTAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

/// Per-request settings.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ctx<'a> {
    /// `?dryRun=All`: everything but the write.
    pub dry_run: bool,
    /// The `ServiceAccount` admission plugin mounts the token volume.
    pub mount_token: bool,
    /// Who asked (None: the server itself or a controller).
    pub user: Option<&'a UserInfo>,
}

/// Which part of an object an update may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// The main resource: for pods, nodes and namespaces, status changes are dropped.
    Main,
    /// The `/status` subresource: only status (and most metadata) changes.
    Status,
    /// `namespaces/<name>/finalize`: only `spec.finalizers` changes.
    Finalize,
    /// `pods/<name>/resize`: only container cpu/memory resources and resize policies.
    Resize,
    /// `pods/<name>/ephemeralcontainers`: only `spec.ephemeralContainers` (additions).
    EphemeralContainers,
    /// `certificatesigningrequests/<name>/approval`: only the CSR's conditions.
    Approval,
}

/// `DeleteOptions`, the fields the double honours.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeleteOpts {
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

/// What a list request asks for.
#[derive(Debug, Default)]
pub(crate) struct ListOpts {
    pub label: LabelSelector,
    pub field: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

fn key(info: &ResourceInfo, ns: Option<&str>, name: &str) -> Key {
    (if info.namespaced { ns.unwrap_or("").to_string() } else { String::new() }, name.to_string())
}

/// Whether `obj` is in `ns` (when given) and matches both selectors.
pub(crate) fn matches(
    info: &ResourceInfo,
    obj: &Value,
    ns: Option<&str>,
    label: &LabelSelector,
    field: &FieldSelector,
) -> bool {
    ns.is_none_or(|ns| meta::namespace(obj) == ns) && label.matches(obj) && field.matches(info, obj)
}

/// `NamespaceLifecycle`: the namespace must exist and not be terminating.
fn check_namespace(d: &Data, info: &ResourceInfo, ns: &str, name: &str) -> Result<(), StatusError> {
    let Some(n) = d.get("namespaces", &(String::new(), ns.to_string())) else {
        return Err(StatusError::namespace_not_found(ns));
    };
    if meta::has_deletion_timestamp(&n) {
        let mut e = StatusError::forbidden(
            info,
            name,
            &format!("unable to create new content in namespace {ns} because it is being terminated"),
        );
        if let Some(d) = e.details.as_mut() {
            d["causes"] = json!([{
                "reason": "NamespaceTerminating",
                "message": format!("namespace {ns} is being terminated"),
                "field": "metadata.namespace",
            }]);
        }
        return Err(e);
    }
    Ok(())
}

fn invalid(info: &ResourceInfo, name: &str, errs: &[FieldError]) -> StatusError {
    StatusError::invalid(info.kind, info.group, name, errs)
}

/// Creates an object received at `info` under the URL namespace `url_ns`.
pub(crate) fn create(
    d: &mut Data,
    ctx: Ctx<'_>,
    info: &'static ResourceInfo,
    url_ns: Option<&str>,
    obj: Value,
) -> Result<Value, StatusError> {
    if !obj.is_object() {
        return Err(StatusError::bad_request("the body of the request must be a JSON object"));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
        && av != info.api_version()
    {
        return Err(StatusError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            info.api_version()
        )));
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && !k.is_empty()
        && k != info.kind
    {
        return Err(StatusError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            info.kind
        )));
    }
    let mut obj = views::to_storage(info, obj);
    // Namespace from the URL; cluster-scoped objects have none.
    let ns = if info.namespaced {
        let url_ns = url_ns.unwrap_or("");
        let obj_ns = meta::namespace(&obj).to_string();
        if !obj_ns.is_empty() && obj_ns != url_ns {
            return Err(StatusError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        meta::meta_mut(&mut obj).insert("namespace".into(), json!(url_ns));
        url_ns.to_string()
    } else {
        meta::meta_mut(&mut obj).remove("namespace");
        String::new()
    };
    // Names: generateName when no name is given.
    if meta::name(&obj).is_empty() {
        let prefix = meta::meta_str(&obj, "generateName").to_string();
        if prefix.is_empty() {
            return Err(invalid(
                info,
                "",
                &[FieldError::required("metadata.name", "name or generateName is required")],
            ));
        }
        let name = loop {
            let candidate = meta::generate_name(&prefix);
            if d.get(info.storage, &key(info, Some(&ns), &candidate)).is_none() {
                break candidate;
            }
        };
        meta::meta_mut(&mut obj).insert("name".into(), json!(name));
    }
    let name = meta::name(&obj).to_string();
    if info.namespaced {
        check_namespace(d, info, &ns, &name)?;
    }
    if !meta::resource_version(&obj).is_empty() {
        return Err(StatusError::internal("resourceVersion should not be set on objects to be created"));
    }
    // BeforeCreate: the system fields are the server's.
    {
        let m = meta::meta_mut(&mut obj);
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        m.remove("managedFields");
        m.remove("selfLink");
        m.insert("uid".into(), json!(meta::new_uid()));
        m.insert("creationTimestamp".into(), json!(meta::now()));
    }
    prepare_for_create(d, ctx, info, &ns, &mut obj)?;
    validate_create(info, &obj)?;
    let k = key(info, Some(&ns), &name);
    if d.get(info.storage, &k).is_some() {
        return Err(StatusError::already_exists(info, &name));
    }
    if ctx.dry_run {
        return Ok(views::to_view(info, &obj));
    }
    let stored = d.put(info.storage, obj);
    if info.storage == "namespaces" {
        on_namespace_created(d, &name);
    }
    Ok(views::to_view(info, &stored))
}

/// What the controllers do for a new namespace: the `default` `ServiceAccount`.
pub(crate) fn on_namespace_created(d: &mut Data, ns: &str) {
    let sa_info = resources::find("", "v1", "serviceaccounts").expect("served");
    if d.get("serviceaccounts", &(ns.to_string(), "default".into())).is_none() {
        let sa = json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": ns},
        });
        let _ = create(d, Ctx::default(), sa_info, Some(ns), sa);
    }
}

fn prepare_for_create(
    d: &Data,
    ctx: Ctx<'_>,
    info: &ResourceInfo,
    ns: &str,
    obj: &mut Value,
) -> Result<(), StatusError> {
    match info.storage {
        "pods" => {
            admission::default_pod(obj);
            let exists = |sa: &str| d.get("serviceaccounts", &(ns.to_string(), sa.to_string())).is_some();
            let plugins = admission::PodAdmission {
                namespace: ns,
                mount_token: ctx.mount_token,
                service_account_exists: &exists,
            };
            plugins.admit(obj).map_err(|why| StatusError::forbidden(info, meta::name(obj), &why))?;
            admission::prepare_pod_for_create(obj);
        }
        "nodes" => admission::default_node(obj),
        "namespaces" => admission::prepare_namespace_for_create(obj),
        "secrets" => admission::default_secret(obj),
        certificates::STORAGE => certificates::prepare_for_create(obj, ctx.user)?,
        "services" => {
            let allocated = allocated_cluster_ips(d, None);
            admission::default_service(obj, &allocated);
            let errs = admission::validate_service(obj, &allocated);
            if !errs.is_empty() {
                return Err(invalid(info, meta::name(obj), &errs));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The cluster IPs the stored services hold, but `except` (namespace, name).
fn allocated_cluster_ips(d: &Data, except: Option<(&str, &str)>) -> std::collections::HashSet<String> {
    d.iter("services", None)
        .filter(|s| except.is_none_or(|(ns, n)| meta::namespace(s) != ns || meta::name(s) != n))
        .filter_map(|s| s.pointer("/spec/clusterIP").and_then(Value::as_str))
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .map(str::to_string)
        .collect()
}

fn validate_create(info: &ResourceInfo, obj: &Value) -> Result<(), StatusError> {
    let name = meta::name(obj);
    let mut errs = Vec::new();
    let ok = match info.storage {
        "namespaces" => meta::is_dns1123_label(name),
        // Lease and event names are path segments upstream.
        "leases.coordination.k8s.io" | "events" | certificates::STORAGE => {
            !name.contains('/') && name != "." && name != ".."
        }
        // DNS-1035, checked with the rest of the service.
        "services" => true,
        _ => meta::is_dns1123_subdomain(name),
    };
    if !ok {
        errs.push(FieldError::invalid(
            "metadata.name",
            json!(name),
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', \
             and must start and end with an alphanumeric character",
        ));
    }
    if info.storage == "pods" {
        errs.extend(admission::validate_pod(obj));
    }
    if info.storage == certificates::STORAGE {
        errs.extend(certificates::validate_create(obj));
    }
    if errs.is_empty() { Ok(()) } else { Err(invalid(info, name, &errs)) }
}

/// Gets one object.
pub(crate) fn get(d: &Data, info: &ResourceInfo, ns: Option<&str>, name: &str) -> Result<Value, StatusError> {
    d.get(info.storage, &key(info, ns, name))
        .map(|o| views::to_view(info, &o))
        .ok_or_else(|| StatusError::not_found(info, name))
}

/// Lists objects (a `*List` object), with pagination through `limit`/`continue`.
pub(crate) fn list(d: &mut Data, info: &ResourceInfo, ns: Option<&str>, opts: &ListOpts) -> Result<Value, StatusError> {
    let (rv, items) = if let Some(token) = &opts.continue_token {
        let page = d.take_page(token).ok_or_else(|| {
            StatusError::expired(
                "The provided continue parameter is too old to display a consistent list result. \
                 You can start a new list without the continue parameter.",
            )
        })?;
        (page.rv, page.items)
    } else {
        let current = d.rv();
        if let Some(requested) = opts.resource_version.as_deref().filter(|r| !r.is_empty()) {
            let n: u64 = requested
                .parse()
                .map_err(|_| StatusError::bad_request(format!("invalid resource version: {requested}")))?;
            if n > current {
                return Err(StatusError::too_large_resource_version(n, current));
            }
            if opts.resource_version_match.as_deref() == Some("Exact") && n != current {
                // The double keeps no snapshots of the past.
                return Err(StatusError::expired(format!("too old resource version: {n} ({current})")));
            }
        }
        let items: Vec<Value> = d
            .iter(info.storage, ns)
            .filter(|o| matches(info, o, ns, &opts.label, &opts.field))
            .map(|o| list_item(info, o))
            .collect();
        (current, items)
    };
    let mut items = items;
    let mut list_meta = json!({ "resourceVersion": rv.to_string() });
    if let Some(limit) = opts.limit.filter(|l| *l > 0 && items.len() > *l) {
        let rest = items.split_off(limit);
        let token = meta::new_uid();
        list_meta["continue"] = json!(token);
        list_meta["remainingItemCount"] = json!(rest.len());
        d.save_page(token, Page { rv, items: rest });
    }
    Ok(json!({
        "kind": info.list_kind(),
        "apiVersion": info.api_version(),
        "metadata": list_meta,
        "items": items,
    }))
}

/// Items of a list carry no `kind`/`apiVersion` on the wire, as the real server's.
fn list_item(info: &ResourceInfo, obj: &Value) -> Value {
    let mut v = views::to_view(info, obj);
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    v
}

/// The result of an update.
pub(crate) struct Updated {
    pub object: Value,
    /// The update created the object (PUT with `AllowCreateOnUpdate`, or apply).
    pub created: bool,
}

/// A guaranteed update: `f` computes the new object from the current one (in the view of
/// `info`) under the lock; the resourceVersion it carries, if any, is the precondition.
#[expect(clippy::too_many_arguments, reason = "the parameters of the upstream `Update` plus the strategy switch")]
pub(crate) fn update(
    d: &mut Data,
    ctx: Ctx<'_>,
    info: &'static ResourceInfo,
    ns: Option<&str>,
    name: &str,
    part: Part,
    force_allow_create: bool,
    f: impl FnOnce(Option<&Value>) -> Result<Value, StatusError>,
) -> Result<Updated, StatusError> {
    let k = key(info, ns, name);
    let Some(old) = d.get(info.storage, &k) else {
        if part != Part::Main || !(info.allow_create_on_update() || force_allow_create) {
            return Err(StatusError::not_found(info, name));
        }
        let mut obj = f(None)?;
        check_identity(info, ns, name, &mut obj)?;
        meta::meta_mut(&mut obj).remove("resourceVersion");
        let object = create(d, ctx, info, ns, obj)?;
        return Ok(Updated { object, created: true });
    };
    let old_view = views::to_view(info, &old);
    let new = f(Some(&old_view))?;
    if !new.is_object() {
        return Err(StatusError::bad_request("the body of the request must be a JSON object"));
    }
    let mut new = views::to_storage(info, new);
    check_identity(info, ns, name, &mut new)?;
    // Every decoded object is defaulted, updates and patches included.
    match info.storage {
        "pods" => admission::default_pod(&mut new),
        "nodes" => admission::default_node(&mut new),
        "secrets" => admission::default_secret(&mut new),
        _ => {}
    }
    // Optimistic concurrency.
    let new_rv = meta::resource_version(&new).to_string();
    if new_rv.is_empty() {
        if !info.allow_unconditional_update() {
            let qualified = StatusError::invalid(
                info.plural,
                info.group,
                name,
                &[FieldError::invalid("metadata.resourceVersion", json!(0), "must be specified for an update")],
            );
            return Err(qualified);
        }
    } else if new_rv != meta::resource_version(&old) {
        return Err(StatusError::conflict(info, name, OPTIMISTIC_LOCK_MSG));
    }
    before_update(info, part, &mut new, &old)?;
    // A write that changes nothing is not a write (no new resourceVersion, no event).
    // The real server compares its canonical encoding, in which an omitted field, a null
    // and an empty list are the same thing.
    let mut cmp = new.clone();
    meta::meta_mut(&mut cmp).insert("resourceVersion".into(), json!(meta::resource_version(&old)));
    if canonical(&cmp) == canonical(&old) {
        return Ok(Updated { object: old_view, created: false });
    }
    if ctx.dry_run {
        return Ok(Updated { object: views::to_view(info, &cmp), created: false });
    }
    // A deleting object whose last finalizer goes away is deleted (`shouldDeleteDuringUpdate`).
    if info.storage != "namespaces"
        && meta::finalizers(&new) == 0
        && meta::has_deletion_timestamp(&old)
        && meta::deletion_grace(&old).is_none_or(|g| g == 0)
    {
        let stored = d.put(info.storage, new);
        let last = d.remove(info.storage, &k).unwrap_or(stored);
        after_removal(d, info, meta::namespace(&last).to_string().as_str());
        return Ok(Updated { object: views::to_view(info, &last), created: false });
    }
    let stored = d.put(info.storage, new);
    if info.storage == "namespaces" {
        try_finalize_namespace(d, name);
    }
    Ok(Updated { object: views::to_view(info, &stored), created: false })
}

/// `v` without nulls and empty lists (what encoding a decoded Go object would drop).
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, x)| !x.is_null() && !x.as_array().is_some_and(Vec::is_empty))
                .map(|(k, x)| (k.clone(), canonical(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// The name and namespace in the body must be those of the URL.
fn check_identity(info: &ResourceInfo, ns: Option<&str>, name: &str, obj: &mut Value) -> Result<(), StatusError> {
    let body_name = meta::name(obj).to_string();
    if body_name.is_empty() {
        meta::meta_mut(obj).insert("name".into(), json!(name));
    } else if body_name != name {
        return Err(StatusError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if info.namespaced {
        let ns = ns.unwrap_or("");
        let body_ns = meta::namespace(obj).to_string();
        if body_ns.is_empty() {
            meta::meta_mut(obj).insert("namespace".into(), json!(ns));
        } else if body_ns != ns {
            return Err(StatusError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    Ok(())
}

/// `rest.BeforeUpdate` and the strategies' `PrepareForUpdate` / `ValidateUpdate`.
fn before_update(info: &ResourceInfo, part: Part, new: &mut Value, old: &Value) -> Result<(), StatusError> {
    let name = meta::name(old).to_string();
    let old_meta = meta::meta(old).clone();
    {
        let m = meta::meta_mut(new);
        m.remove("managedFields");
        m.remove("selfLink");
        // Clients cannot change the generation.
        match old_meta.get("generation") {
            Some(g) => m.insert("generation".into(), g.clone()),
            None => m.remove("generation"),
        };
    }
    let obj = meta::ensure_object(new);
    let old_field = |f: &str| old.get(f).cloned();
    let restore = |obj: &mut serde_json::Map<String, Value>, f: &str| match old_field(f) {
        Some(v) => obj.insert(f.to_string(), v),
        None => obj.remove(f),
    };
    match (info.storage, part) {
        ("pods", Part::Main) => {
            restore(obj, "status");
            if new.get("spec") != old.get("spec") {
                let errs = admission::validate_pod_spec_update(new, old);
                if !errs.is_empty() {
                    return Err(invalid(info, &name, &errs));
                }
                let g = meta::meta(old).get("generation").and_then(Value::as_i64).unwrap_or(0);
                meta::meta_mut(new).insert("generation".into(), json!(g + 1));
            }
        }
        ("pods", Part::Status) => {
            restore(obj, "spec");
            let m = meta::meta_mut(new);
            match old_meta.get("ownerReferences") {
                Some(v) => m.insert("ownerReferences".into(), v.clone()),
                None => m.remove("ownerReferences"),
            };
            // The QoS class is immutable; old kubelets dropped it.
            if new.pointer("/status/qosClass").is_none_or(|q| q.as_str().unwrap_or("").is_empty())
                && let Some(q) = old.pointer("/status/qosClass").cloned()
            {
                meta::ensure_object(meta::ensure_object(new).entry("status").or_insert_with(|| json!({})))
                    .insert("qosClass".into(), q);
            }
        }
        (certificates::STORAGE, _) => {
            let errs = certificates::prepare_and_validate_update(part, new, old);
            if !errs.is_empty() {
                return Err(invalid(info, &name, &errs));
            }
        }
        ("pods", Part::Resize) => {
            if let Err(errs) = super::resize::prepare_and_validate(new, old) {
                return Err(invalid(info, &name, &errs));
            }
        }
        ("pods", Part::EphemeralContainers) => {
            if let Err(errs) = super::ephemeral::prepare_and_validate(new, old, canonical) {
                return Err(invalid(info, &name, &errs));
            }
        }
        ("nodes" | "namespaces", Part::Main) => {
            restore(obj, "status");
            if info.storage == "namespaces" {
                let fins = old.pointer("/spec/finalizers").cloned();
                let spec = meta::ensure_object(obj.entry("spec").or_insert_with(|| json!({})));
                match fins {
                    Some(f) => spec.insert("finalizers".into(), f),
                    None => spec.remove("finalizers"),
                };
            }
        }
        ("nodes" | "namespaces" | "services", Part::Status) => {
            restore(obj, "spec");
        }
        ("services", Part::Main) => {
            restore(obj, "status");
            // `patchAllocatedValues`: an update without a cluster IP keeps the allocated one.
            let spec = meta::ensure_object(obj.entry("spec").or_insert_with(|| json!({})));
            for field in ["clusterIP", "clusterIPs"] {
                if spec.get(field).is_none_or(|v| v.is_null() || v == "" || v == &json!([]))
                    && let Some(v) = old.pointer(&format!("/spec/{field}"))
                {
                    spec.insert(field.into(), v.clone());
                }
            }
            admission::default_service(new, &std::collections::HashSet::new());
            let (new_ip, old_ip) = (new.pointer("/spec/clusterIP"), old.pointer("/spec/clusterIP"));
            let mut errs = Vec::new();
            if new_ip != old_ip {
                errs.push(FieldError::invalid(
                    "spec.clusterIPs[0]",
                    new_ip.cloned().unwrap_or(Value::Null),
                    "may not change once set",
                ));
            }
            errs.extend(admission::validate_service(new, &std::collections::HashSet::new()));
            if !errs.is_empty() {
                return Err(invalid(info, &name, &errs));
            }
        }
        ("namespaces", Part::Finalize) => {
            let fins = new.pointer("/spec/finalizers").cloned();
            let mut next = old.clone();
            let spec = meta::ensure_object(meta::ensure_object(&mut next).entry("spec").or_insert_with(|| json!({})));
            match fins {
                Some(f) => spec.insert("finalizers".into(), f),
                None => spec.remove("finalizers"),
            };
            meta::meta_mut(&mut next).insert("resourceVersion".into(), json!(meta::resource_version(new)));
            *new = next;
        }
        _ => {}
    }
    let m = meta::meta_mut(new);
    // UID: the old one if none is given; it can never change.
    let new_uid = m.get("uid").and_then(Value::as_str).unwrap_or("").to_string();
    let old_uid = old_meta.get("uid").and_then(Value::as_str).unwrap_or("");
    if new_uid.is_empty() {
        m.insert("uid".into(), json!(old_uid));
    } else if new_uid != old_uid {
        return Err(invalid(info, &name, &[FieldError::invalid("metadata.uid", json!(new_uid), "field is immutable")]));
    }
    if let Some(ct) = old_meta.get("creationTimestamp") {
        m.insert("creationTimestamp".into(), ct.clone());
    }
    // An update can never set, remove or change a deletion timestamp.
    match old_meta.get("deletionTimestamp") {
        Some(ts) => {
            m.insert("deletionTimestamp".into(), ts.clone());
        }
        None if m.get("deletionTimestamp").is_some_and(|v| !v.is_null()) && part == Part::Main => {
            return Err(invalid(
                info,
                &name,
                &[FieldError::invalid(
                    "metadata.deletionTimestamp",
                    m["deletionTimestamp"].clone(),
                    "field is immutable",
                )],
            ));
        }
        None => {
            m.remove("deletionTimestamp");
        }
    }
    if let Some(g) = old_meta.get("deletionGracePeriodSeconds")
        && m.get("deletionGracePeriodSeconds").is_none_or(Value::is_null)
    {
        m.insert("deletionGracePeriodSeconds".into(), g.clone());
    }
    Ok(())
}

/// The result of a delete.
pub(crate) struct Deleted {
    /// The object: the updated one while deletion is pending, the last state once gone.
    pub object: Value,
    /// The object was removed from storage.
    pub removed: bool,
}

/// The grace period the pod strategy decides on (`CheckGracefulDelete`).
fn pod_grace(pod: &Value, requested: Option<i64>) -> i64 {
    let mut period = requested
        .unwrap_or_else(|| pod.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0));
    if meta::str_at(pod, &["spec", "nodeName"]).is_empty() {
        period = 0;
    }
    if matches!(meta::str_at(pod, &["status", "phase"]), "Failed" | "Succeeded") {
        period = 0;
    }
    if period < 0 { 1 } else { period }
}

/// Deletes an object: graceful deletion for pods, finalizers for every kind.
pub(crate) fn delete(
    d: &mut Data,
    ctx: Ctx<'_>,
    info: &'static ResourceInfo,
    ns: Option<&str>,
    name: &str,
    opts: &DeleteOpts,
) -> Result<Deleted, StatusError> {
    let k = key(info, ns, name);
    let Some(old) = d.get(info.storage, &k) else {
        return Err(StatusError::not_found(info, name));
    };
    if let Some(uid) = &opts.precondition_uid
        && uid != meta::uid(&old)
    {
        return Err(StatusError::conflict(
            info,
            name,
            &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {}", meta::uid(&old)),
        ));
    }
    if let Some(rv) = &opts.precondition_rv
        && rv != meta::resource_version(&old)
    {
        return Err(StatusError::conflict(
            info,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta::resource_version(&old)
            ),
        ));
    }
    if info.storage == "namespaces" {
        return delete_namespace(d, ctx, info, name, &old);
    }
    // Negative grace periods mean one second on the delete path.
    let requested = opts.grace_period_seconds.map(|g| if g < 0 { 1 } else { g });
    let mut next = (*old).clone();
    let mut graceful_period: Option<i64> = None;
    if info.storage == "pods" {
        if meta::has_deletion_timestamp(&old) {
            match meta::deletion_grace(&old) {
                None | Some(0) => {}
                Some(current) => match requested {
                    // Only a shorter grace period may be given.
                    Some(p) if p < current => {
                        let ts = meta::parse_time(meta::meta_str(&old, "deletionTimestamp")).unwrap_or(0);
                        let m = meta::meta_mut(&mut next);
                        m.insert("deletionTimestamp".into(), json!(meta::time_string(ts - current + p)));
                        m.insert("deletionGracePeriodSeconds".into(), json!(p));
                        graceful_period = Some(p);
                    }
                    // Graceful deletion is pending: nothing to do.
                    _ => return Ok(Deleted { object: views::to_view(info, &old), removed: false }),
                },
            }
        } else {
            let period = pod_grace(&old, requested);
            let now = jiff::Timestamp::now().as_second();
            let m = meta::meta_mut(&mut next);
            m.insert("deletionTimestamp".into(), json!(meta::time_string(now + period)));
            m.insert("deletionGracePeriodSeconds".into(), json!(period));
            if let Some(g) = m.get("generation").and_then(Value::as_i64).filter(|g| *g > 0) {
                m.insert("generation".into(), json!(g + 1));
            }
            graceful_period = Some(period);
        }
    }
    let pending_finalizers = meta::finalizers(&old) > 0;
    if graceful_period.is_none() && pending_finalizers {
        // markAsDeleting.
        let now = meta::now();
        let m = meta::meta_mut(&mut next);
        if m.get("deletionTimestamp").is_none_or(Value::is_null) {
            if let Some(g) = m.get("generation").and_then(Value::as_i64).filter(|g| *g > 0) {
                m.insert("generation".into(), json!(g + 1));
            }
            m.insert("deletionTimestamp".into(), json!(now));
        }
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
    }
    if graceful_period.is_some() || pending_finalizers {
        if next == *old {
            // Already marked; the finalizers still hold it.
            return Ok(Deleted { object: views::to_view(info, &old), removed: false });
        }
        let updated = if ctx.dry_run { std::sync::Arc::new(next) } else { d.put(info.storage, next) };
        if pending_finalizers || graceful_period.is_some_and(|p| p > 0) {
            return Ok(Deleted { object: views::to_view(info, &updated), removed: false });
        }
    }
    if ctx.dry_run {
        return Ok(Deleted { object: views::to_view(info, &old), removed: true });
    }
    let last = d.remove(info.storage, &k).ok_or_else(|| StatusError::not_found(info, name))?;
    after_removal(d, info, meta::namespace(&last).to_string().as_str());
    Ok(Deleted { object: views::to_view(info, &last), removed: true })
}

fn after_removal(d: &mut Data, info: &ResourceInfo, ns: &str) {
    if info.namespaced && !ns.is_empty() {
        try_finalize_namespace(d, ns);
    }
}

/// Namespace deletion: the namespace REST sets Terminating; the namespace controller then
/// deletes every object in it (pods gracefully) and finalizes the namespace once empty.
fn delete_namespace(
    d: &mut Data,
    ctx: Ctx<'_>,
    info: &'static ResourceInfo,
    name: &str,
    old: &Value,
) -> Result<Deleted, StatusError> {
    if IMMORTAL_NAMESPACES.contains(&name) {
        return Err(StatusError::forbidden(info, name, "this namespace may not be deleted"));
    }
    if meta::has_deletion_timestamp(old) {
        return Ok(Deleted { object: views::to_view(info, old), removed: false });
    }
    let mut next = old.clone();
    let m = meta::meta_mut(&mut next);
    m.insert("deletionTimestamp".into(), json!(meta::now()));
    m.insert("deletionGracePeriodSeconds".into(), json!(0));
    meta::ensure_object(meta::ensure_object(&mut next).entry("status").or_insert_with(|| json!({})))
        .insert("phase".into(), json!("Terminating"));
    if ctx.dry_run {
        return Ok(Deleted { object: views::to_view(info, &next), removed: false });
    }
    let marked = d.put("namespaces", next);
    for r in resources::namespaced_storages() {
        let names: Vec<String> = d.iter(r.storage, Some(name)).map(|o| meta::name(o).to_string()).collect();
        for n in names {
            let _ = delete(d, ctx, r, Some(name), &n, &DeleteOpts::default());
        }
    }
    try_finalize_namespace(d, name);
    let object = d.get("namespaces", &(String::new(), name.to_string())).unwrap_or(marked);
    Ok(Deleted { object: views::to_view(info, &object), removed: false })
}

/// Removes a terminating namespace once nothing is left in it.
fn try_finalize_namespace(d: &mut Data, ns: &str) {
    let k = (String::new(), ns.to_string());
    let Some(n) = d.get("namespaces", &k) else { return };
    if !meta::has_deletion_timestamp(&n) {
        return;
    }
    let empty = resources::namespaced_storages().iter().all(|r| d.count_in_namespace(r.storage, ns) == 0);
    if !empty {
        return;
    }
    let mut next = (*n).clone();
    if let Some(spec) = next.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("finalizers".into(), json!([]));
    }
    if next != *n {
        d.put("namespaces", next);
    }
    if meta::finalizers(&n) == 0 {
        d.remove("namespaces", &k);
    }
}
