//! The resources the double serves and their discovery documents (`/api`, `/apis`,
//! `/apis/<group>/<version>`), shaped as the real server's legacy discovery answers.

use serde_json::{Value, json};

/// How a resource is stored and served.
#[derive(Debug)]
pub(crate) struct ResourceInfo {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub verbs: &'static [&'static str],
    /// Subresources: (name, kind, verbs).
    pub subresources: &'static [(&'static str, &'static str, &'static [&'static str])],
    /// The key of the storage this resource lives in. Two resources share one storage
    /// when the real server stores them once (core/v1 and events.k8s.io/v1 events).
    pub storage: &'static str,
    /// Create-only review resources (`TokenReview`, `SubjectAccessReview`): nothing is stored.
    pub review: bool,
}

impl ResourceInfo {
    /// `pods`, `leases.coordination.k8s.io`: the name errors use.
    pub(crate) fn group_resource(&self) -> String {
        if self.group.is_empty() { self.plural.to_string() } else { format!("{}.{}", self.plural, self.group) }
    }

    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_string() } else { format!("{}/{}", self.group, self.version) }
    }

    pub(crate) fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// PUT may create the object (`AllowCreateOnUpdate` of the upstream strategy).
    pub(crate) fn allow_create_on_update(&self) -> bool {
        matches!(self.storage, "leases.coordination.k8s.io" | "events")
    }

    /// PUT without `metadata.resourceVersion` is allowed (`AllowUnconditionalUpdate`).
    pub(crate) fn allow_unconditional_update(&self) -> bool {
        self.storage != "leases.coordination.k8s.io"
    }

    pub(crate) fn has_subresource(&self, sub: &str) -> bool {
        self.subresources.iter().any(|(n, _, _)| *n == sub)
    }
}

const CRUD: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
const STATUS: &[&str] = &["get", "patch", "update"];
const CREATE: &[&str] = &["create"];

pub(crate) static RESOURCES: &[ResourceInfo] = &[
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        verbs: CRUD,
        subresources: &[
            ("status", "Pod", STATUS),
            ("eviction", "Eviction", CREATE),
            ("binding", "Binding", CREATE),
            ("resize", "Pod", STATUS),
            ("ephemeralcontainers", "Pod", STATUS),
        ],
        storage: "pods",
        review: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        verbs: CRUD,
        subresources: &[("status", "Node", STATUS)],
        storage: "nodes",
        review: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        verbs: &["create", "delete", "get", "list", "patch", "update", "watch"],
        subresources: &[("status", "Namespace", STATUS), ("finalize", "Namespace", &["update"])],
        storage: "namespaces",
        review: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        verbs: CRUD,
        subresources: &[],
        storage: "configmaps",
        review: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        short_names: &["svc"],
        verbs: &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        subresources: &[("status", "Service", STATUS)],
        storage: "services",
        review: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        short_names: &[],
        verbs: CRUD,
        subresources: &[],
        storage: "secrets",
        review: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        short_names: &["sa"],
        verbs: CRUD,
        subresources: &[("token", "TokenRequest", CREATE)],
        storage: "serviceaccounts",
        review: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        verbs: CRUD,
        subresources: &[],
        storage: "events",
        review: false,
    },
    ResourceInfo {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        verbs: CRUD,
        subresources: &[],
        storage: "events",
        review: false,
    },
    ResourceInfo {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short_names: &[],
        verbs: CRUD,
        subresources: &[],
        storage: "leases.coordination.k8s.io",
        review: false,
    },
    ResourceInfo {
        group: "certificates.k8s.io",
        version: "v1",
        plural: "certificatesigningrequests",
        singular: "certificatesigningrequest",
        kind: "CertificateSigningRequest",
        namespaced: false,
        short_names: &["csr"],
        verbs: CRUD,
        subresources: &[
            ("approval", "CertificateSigningRequest", STATUS),
            ("status", "CertificateSigningRequest", STATUS),
        ],
        storage: "certificatesigningrequests.certificates.k8s.io",
        review: false,
    },
    ResourceInfo {
        group: "authentication.k8s.io",
        version: "v1",
        plural: "tokenreviews",
        singular: "tokenreview",
        kind: "TokenReview",
        namespaced: false,
        short_names: &[],
        verbs: CREATE,
        subresources: &[],
        storage: "tokenreviews.authentication.k8s.io",
        review: true,
    },
    ResourceInfo {
        group: "authentication.k8s.io",
        version: "v1",
        plural: "selfsubjectreviews",
        singular: "selfsubjectreview",
        kind: "SelfSubjectReview",
        namespaced: false,
        short_names: &[],
        verbs: CREATE,
        subresources: &[],
        storage: "selfsubjectreviews.authentication.k8s.io",
        review: true,
    },
    ResourceInfo {
        group: "authorization.k8s.io",
        version: "v1",
        plural: "subjectaccessreviews",
        singular: "subjectaccessreview",
        kind: "SubjectAccessReview",
        namespaced: false,
        short_names: &[],
        verbs: CREATE,
        subresources: &[],
        storage: "subjectaccessreviews.authorization.k8s.io",
        review: true,
    },
    ResourceInfo {
        group: "authorization.k8s.io",
        version: "v1",
        plural: "selfsubjectaccessreviews",
        singular: "selfsubjectaccessreview",
        kind: "SelfSubjectAccessReview",
        namespaced: false,
        short_names: &[],
        verbs: CREATE,
        subresources: &[],
        storage: "selfsubjectaccessreviews.authorization.k8s.io",
        review: true,
    },
    ResourceInfo {
        group: "authorization.k8s.io",
        version: "v1",
        plural: "localsubjectaccessreviews",
        singular: "localsubjectaccessreview",
        kind: "LocalSubjectAccessReview",
        namespaced: true,
        short_names: &[],
        verbs: CREATE,
        subresources: &[],
        storage: "localsubjectaccessreviews.authorization.k8s.io",
        review: true,
    },
];

/// The API groups served besides the core group, in discovery order.
const GROUPS: &[&str] =
    &["coordination.k8s.io", "events.k8s.io", "authentication.k8s.io", "authorization.k8s.io", "certificates.k8s.io"];

/// The resource served at `/api{s}/<group>/<version>/<plural>`.
pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES.iter().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Namespaced storages (for the namespace controller's cleanup), without duplicates.
pub(crate) fn namespaced_storages() -> Vec<&'static ResourceInfo> {
    let mut out: Vec<&'static ResourceInfo> = Vec::new();
    for r in RESOURCES {
        if r.namespaced && !r.review && !out.iter().any(|o| o.storage == r.storage) {
            out.push(r);
        }
    }
    out
}

/// `GET /api`.
pub(crate) fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }],
    })
}

fn group_doc(name: &str) -> Value {
    let gv = json!({ "groupVersion": format!("{name}/v1"), "version": "v1" });
    json!({ "name": name, "versions": [gv.clone()], "preferredVersion": gv })
}

/// `GET /apis`.
pub(crate) fn api_group_list() -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": GROUPS.iter().map(|g| group_doc(g)).collect::<Vec<_>>(),
    })
}

/// `GET /apis/<group>`.
pub(crate) fn api_group(group: &str) -> Option<Value> {
    GROUPS.contains(&group).then(|| {
        let mut g = group_doc(group);
        g["kind"] = json!("APIGroup");
        g["apiVersion"] = json!("v1");
        g
    })
}

/// `GET /api/v1` or `GET /apis/<group>/<version>`.
pub(crate) fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    if group.is_empty() && version != "v1" || !group.is_empty() && (!GROUPS.contains(&group) || version != "v1") {
        return None;
    }
    let mut resources = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == group && r.version == version) {
        let mut doc = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs,
        });
        if !r.short_names.is_empty() {
            doc["shortNames"] = json!(r.short_names);
        }
        if r.plural == "pods" {
            doc["categories"] = json!(["all"]);
        }
        resources.push(doc);
        for (sub, kind, verbs) in r.subresources {
            let mut doc = json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": verbs,
            });
            match *kind {
                "Eviction" => doc["group"] = json!("policy"),
                "TokenRequest" => doc["group"] = json!("authentication.k8s.io"),
                _ => {}
            }
            if matches!(*kind, "Eviction" | "TokenRequest") {
                doc["version"] = json!("v1");
            }
            resources.push(doc);
        }
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let mut list = json!({ "kind": "APIResourceList", "groupVersion": gv, "resources": resources });
    if !group.is_empty() {
        list["apiVersion"] = json!("v1");
    }
    Some(list)
}

/// `GET /version`: a 1.37 server, as the k8s-openapi feature the project builds with.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "emulationMajor": "1",
        "emulationMinor": "37",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "36",
        "gitVersion": "v1.37.0-swiftlet-test",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}
