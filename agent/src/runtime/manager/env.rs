//! Environment variables of a container, as upstream `makeEnvironmentVariables`: `envFrom`
//! (`ConfigMap`s and `Secret`s, with `prefix`) first, then `env` in order (values with `$(VAR)`
//! expansion over what is defined so far, and `valueFrom`: `fieldRef`, `resourceFieldRef`,
//! `configMapKeyRef`, `secretKeyRef`), later definitions replacing earlier ones.
//!
//! Service link variables (`enableServiceLinks`, `<SVC>_SERVICE_HOST`, ...) need the
//! Services of the namespace from the API server; no service source exists yet, so none
//! are produced, as the upstream kubelet does without an API client. `envFrom` keys are
//! checked with the relaxed rules that are GA since Kubernetes 1.34 (printable ASCII
//! except `=`); keys that fail are skipped with an `InvalidEnvironmentVariableNames`
//! warning, as upstream.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};

use super::RuntimeManagerConfig;
use crate::types::expansion::expand;
use crate::volumes::downward_api::{self, NodeAllocatable};
use crate::volumes::source::{self, ObjectSource};

/// Why a container's environment cannot be built (the container then waits with
/// `CreateContainerConfigError`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `configMapKeyRef` to a key the `ConfigMap` lacks.
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKey { key: String, namespace: String, name: String },
    /// `secretKeyRef` to a key the `Secret` lacks.
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKey { key: String, namespace: String, name: String },
    /// A required `ConfigMap` or `Secret` does not exist (upstream's API error text).
    #[error("{resource} {name:?} not found")]
    NotFound { resource: &'static str, name: String },
    /// The object source failed (for example: no API server).
    #[error(transparent)]
    Source(#[from] source::Error),
    /// The service list has not completed once (API pods only; upstream's text).
    #[error("services have not yet been read at least once, cannot construct envvars")]
    ServicesNotSynced,
    /// A `fieldRef` or `resourceFieldRef` that cannot be resolved.
    #[error("env[{index}] {name:?}: {source}")]
    DownwardApi {
        index: usize,
        name: String,
        #[source]
        source: downward_api::Error,
    },
}

/// What [`resolve`] needs besides the pod.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// Node name and IP for `spec.nodeName` / `status.hostIP`.
    pub cfg: &'a RuntimeManagerConfig,
    /// The pod's IPs (`status.podIP(s)`).
    pub pod_ips: &'a [String],
    /// `ConfigMap`s and `Secret`s.
    pub source: &'a dyn ObjectSource,
    /// Defaults for limits the container does not set (`resourceFieldRef`).
    pub node: &'a NodeAllocatable,
}

/// A resolved environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Name → value, in definition order.
    pub vars: Vec<(String, String)>,
    /// `InvalidEnvironmentVariableNames` warnings to record as pod events.
    pub warnings: Vec<String>,
}

/// Upstream `podFieldSelectorRuntimeValue`: the pod's own and status fields, then the
/// metadata fields the downward API offers.
fn field_ref(
    pod: &Pod,
    path: &str,
    cfg: &RuntimeManagerConfig,
    pod_ips: &[String],
) -> Result<String, downward_api::Error> {
    let spec = pod.spec.as_ref();
    Ok(match path {
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_else(|| cfg.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.hostIP" | "status.hostIPs" => cfg.host_ip.clone().unwrap_or_default(),
        "status.podIP" => pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => pod_ips.join(","),
        _ => downward_api::metadata_field(pod, path)?,
    })
}

/// Environment variable names as the API accepts them since `RelaxedEnvironmentVariableValidation`
/// went GA: non-empty printable ASCII without `=`.
fn is_env_var_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'=')
}

/// `ConfigMap`s and `Secret`s read once per resolution (upstream keeps the same maps).
#[derive(Default)]
struct Objects {
    config_maps: HashMap<String, Option<ConfigMap>>,
    secrets: HashMap<String, Option<Secret>>,
}

impl Objects {
    async fn config_map(&mut self, ctx: &Context<'_>, ns: &str, name: &str) -> Result<Option<&ConfigMap>, Error> {
        if !self.config_maps.contains_key(name) {
            let cm = ctx.source.config_map(ns, name).await?;
            self.config_maps.insert(name.to_owned(), cm);
        }
        Ok(self.config_maps[name].as_ref())
    }

    async fn secret(&mut self, ctx: &Context<'_>, ns: &str, name: &str) -> Result<Option<&Secret>, Error> {
        if !self.secrets.contains_key(name) {
            let s = ctx.source.secret(ns, name).await?;
            self.secrets.insert(name.to_owned(), s);
        }
        Ok(self.secrets[name].as_ref())
    }
}

fn set(out: &mut Vec<(String, String)>, name: String, value: String) {
    out.retain(|(k, _)| *k != name);
    out.push((name, value));
}

/// Upstream `makeEnvVariableName`: upper case, `.` and `-` become `_`, and a leading
/// digit gets a `_` in front.
fn service_var_prefix(name: &str) -> String {
    let up = name.replace(['.', '-'], "_").to_uppercase();
    if up.starts_with(|c: char| c.is_ascii_digit()) { format!("_{up}") } else { up }
}

/// The variables of one service (upstream `envvars.FromServices`): `<NAME>_SERVICE_HOST`,
/// `<NAME>_SERVICE_PORT` (first port), `<NAME>_SERVICE_PORT_<PORTNAME>` for named ports,
/// and the Docker link variables `<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`.
fn service_vars(svc: &Service, out: &mut BTreeMap<String, String>) {
    let Some(spec) = &svc.spec else { return };
    let ip = spec.cluster_ip.as_deref().unwrap_or_default();
    let ports = spec.ports.as_deref().unwrap_or_default();
    if ip.is_empty() || ip == "None" || ports.is_empty() {
        return;
    }
    let prefix = service_var_prefix(svc.metadata.name.as_deref().unwrap_or_default());
    out.insert(format!("{prefix}_SERVICE_HOST"), ip.to_owned());
    out.insert(format!("{prefix}_SERVICE_PORT"), ports[0].port.to_string());
    for p in ports {
        if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
            out.insert(format!("{prefix}_SERVICE_PORT_{}", service_var_prefix(name)), p.port.to_string());
        }
    }
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.to_owned() };
    for (i, p) in ports.iter().enumerate() {
        let proto = p.protocol.as_deref().filter(|p| !p.is_empty()).unwrap_or("TCP");
        let url = format!("{}://{host}:{}", proto.to_lowercase(), p.port);
        if i == 0 {
            out.insert(format!("{prefix}_PORT"), url.clone());
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
        out.insert(format!("{port_prefix}_PROTO"), proto.to_lowercase());
        out.insert(format!("{port_prefix}_PORT"), p.port.to_string());
        out.insert(format!("{port_prefix}_ADDR"), ip.to_owned());
        out.insert(port_prefix, url);
    }
}

/// Upstream `getServiceEnvVarMap`: the `kubernetes` service of `default` always, the
/// services of the pod's namespace when `enableServiceLinks`; services without a
/// cluster IP (headless, `ExternalName`) give nothing.
#[must_use]
pub fn service_env(services: &[std::sync::Arc<Service>], ns: &str, links: bool) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for svc in services {
        let (Some(name), svc_ns) = (svc.metadata.name.as_deref(), svc.metadata.namespace.as_deref()) else {
            continue;
        };
        if svc_ns == Some("default") && name == "kubernetes" {
            chosen.entry(name).or_insert(svc);
        } else if svc_ns == Some(ns) && links {
            chosen.insert(name, svc);
        }
    }
    let mut out = BTreeMap::new();
    for svc in chosen.values() {
        service_vars(svc, &mut out);
    }
    out
}

/// Resolves the container's environment: `envFrom`, then `env` (with `$(VAR)`
/// references to earlier variables and service variables), then the service variables
/// the container does not set itself.
pub async fn resolve(pod: &Pod, container: &Container, ctx: &Context<'_>) -> Result<Resolved, Error> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
    let services = match ctx.source.services() {
        Some(s) => service_env(&s, ns, links),
        // Static pods must start without the API server; the others wait for the list.
        None if crate::types::pod::is_static_pod(pod) => BTreeMap::new(),
        None => return Err(Error::ServicesNotSynced),
    };
    let mut objects = Objects::default();
    let mut out = Resolved::default();

    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (kind, name, entries): (&str, &str, Vec<(String, String)>) = if let Some(r) = &from.config_map_ref {
            match objects.config_map(ctx, ns, &r.name).await? {
                Some(cm) => ("configMap", &r.name, cm.data.clone().unwrap_or_default().into_iter().collect()),
                None if r.optional == Some(true) => continue,
                None => return Err(Error::NotFound { resource: "configmap", name: r.name.clone() }),
            }
        } else if let Some(r) = &from.secret_ref {
            match objects.secret(ctx, ns, &r.name).await? {
                Some(s) => (
                    "secret",
                    &r.name,
                    s.data
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
                        .collect(),
                ),
                None if r.optional == Some(true) => continue,
                None => return Err(Error::NotFound { resource: "secret", name: r.name.clone() }),
            }
        } else {
            continue;
        };
        let mut invalid = Vec::new();
        for (k, v) in entries {
            let key = format!("{prefix}{k}");
            if is_env_var_name(&key) {
                set(&mut out.vars, key, v);
            } else {
                invalid.push(key);
            }
        }
        if !invalid.is_empty() {
            invalid.sort();
            out.warnings.push(format!(
                "Keys [{}] from the EnvFrom {kind} {ns}/{name} were skipped since they are considered invalid environment variable names.",
                invalid.join(", ")
            ));
        }
    }

    for (index, e) in container.env.iter().flatten().enumerate() {
        let downward = |source| Error::DownwardApi { index, name: e.name.clone(), source };
        let value = match &e.value_from {
            Some(vf) if e.value.as_deref().unwrap_or_default().is_empty() => {
                if let Some(fr) = &vf.field_ref {
                    field_ref(pod, &fr.field_path, ctx.cfg, ctx.pod_ips).map_err(downward)?
                } else if let Some(rf) = &vf.resource_field_ref {
                    let r = if rf.container_name.as_deref().unwrap_or_default().is_empty() {
                        downward_api::container_resource_value(pod, container, rf, ctx.node)
                    } else {
                        downward_api::resource_value_by_container_name(pod, rf, ctx.node)
                    };
                    r.map_err(downward)?
                } else if let Some(r) = &vf.config_map_key_ref {
                    let optional = r.optional == Some(true);
                    let Some(cm) = objects.config_map(ctx, ns, &r.name).await? else {
                        if optional {
                            continue;
                        }
                        return Err(Error::NotFound { resource: "configmap", name: r.name.clone() });
                    };
                    match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                        Some(v) => v.clone(),
                        None if optional => continue,
                        None => {
                            return Err(Error::ConfigMapKey {
                                key: r.key.clone(),
                                namespace: ns.to_owned(),
                                name: r.name.clone(),
                            });
                        }
                    }
                } else if let Some(r) = &vf.secret_key_ref {
                    let optional = r.optional == Some(true);
                    let Some(s) = objects.secret(ctx, ns, &r.name).await? else {
                        if optional {
                            continue;
                        }
                        return Err(Error::NotFound { resource: "secret", name: r.name.clone() });
                    };
                    match s.data.as_ref().and_then(|d| d.get(&r.key)) {
                        Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                        None if optional => continue,
                        None => {
                            return Err(Error::SecretKey {
                                key: r.key.clone(),
                                namespace: ns.to_owned(),
                                name: r.name.clone(),
                            });
                        }
                    }
                } else {
                    String::new()
                }
            }
            _ => {
                let mut vars: HashMap<&str, &str> = services.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                vars.extend(out.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                expand(e.value.as_deref().unwrap_or_default(), &vars)
            }
        };
        set(&mut out.vars, e.name.clone(), value);
    }
    for (k, v) in services {
        if !out.vars.iter().any(|(name, _)| *name == k) {
            out.vars.push((k, v));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use k8s_openapi::ByteString;
    use serde_json::json;

    use super::*;
    use crate::volumes::{FakeObjectSource, NoApiServer};

    const NODE: NodeAllocatable = NodeAllocatable { cpu_milli: 4000, memory: 8 << 30, ephemeral_storage: 1 << 40 };

    fn cfg() -> RuntimeManagerConfig {
        RuntimeManagerConfig {
            pod_logs_dir: PathBuf::from("/logs"),
            root_dir: PathBuf::from("/root"),
            node_name: "node-1".into(),
            host_ip: Some("192.0.2.1".into()),
        }
    }

    fn source() -> FakeObjectSource {
        let src = FakeObjectSource::new();
        src.set_config_map(
            serde_json::from_value(json!({
                "metadata": {"name": "cfg", "namespace": "ns"},
                "data": {"LOG_LEVEL": "debug", "1BAD": "x", "a=b": "y", "url": "http://db"}
            }))
            .unwrap(),
        );
        let mut s = Secret::default();
        s.metadata.name = Some("sec".into());
        s.metadata.namespace = Some("ns".into());
        s.data = Some([("password".to_string(), ByteString(b"hunter2".to_vec()))].into());
        src.set_secret(s);
        src
    }

    #[expect(clippy::needless_pass_by_value, reason = "call sites read better with json! literals")]
    fn pod(container: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "web"}},
            "spec": {"serviceAccountName": "sa", "containers": [container]}
        }))
        .unwrap()
    }

    async fn run(p: &Pod, src: &dyn ObjectSource) -> Result<Resolved, Error> {
        let cfg = cfg();
        let ips = vec!["10.0.0.5".to_string(), "fd00::5".to_string()];
        let ctx = Context { cfg: &cfg, pod_ips: &ips, source: src, node: &NODE };
        resolve(p, &p.spec.as_ref().unwrap().containers[0], &ctx).await
    }

    fn get<'a>(r: &'a Resolved, k: &str) -> Option<&'a str> {
        r.vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[expect(clippy::needless_pass_by_value, reason = "call sites read better with json! literals")]
    fn svc(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": ports}
        }))
        .unwrap()
    }

    fn cluster_services() -> Vec<Service> {
        vec![
            svc("default", "kubernetes", "10.96.0.1", json!([{"name": "https", "port": 443, "protocol": "TCP"}])),
            svc(
                "ns",
                "my-db.v2",
                "10.96.0.7",
                json!([{"port": 5432}, {"name": "metrics-http", "port": 9187, "protocol": "TCP"}]),
            ),
            svc("ns", "1dns", "fd00::a", json!([{"name": "dns", "port": 53, "protocol": "UDP"}])),
            svc("ns", "headless", "None", json!([{"port": 80}])),
            svc("other", "elsewhere", "10.96.0.9", json!([{"port": 80}])),
        ]
    }

    #[tokio::test]
    async fn service_links_as_upstream() {
        let src = source();
        src.set_services(Some(cluster_services()));
        let p = pod(json!({"name": "c", "image": "i", "env": [
            {"name": "DB", "value": "$(MY_DB_V2_SERVICE_HOST):$(MY_DB_V2_SERVICE_PORT)"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": "override"},
        ]}));
        let r = run(&p, &src).await.unwrap();
        let expect = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("MY_DB_V2_SERVICE_HOST", "10.96.0.7"),
            ("MY_DB_V2_SERVICE_PORT", "5432"),
            ("MY_DB_V2_SERVICE_PORT_METRICS_HTTP", "9187"),
            ("MY_DB_V2_PORT", "tcp://10.96.0.7:5432"),
            ("MY_DB_V2_PORT_9187_TCP", "tcp://10.96.0.7:9187"),
            ("_1DNS_SERVICE_HOST", "fd00::a"),
            ("_1DNS_PORT", "udp://[fd00::a]:53"),
            ("_1DNS_PORT_53_UDP_PROTO", "udp"),
            ("_1DNS_PORT_53_UDP_ADDR", "fd00::a"),
            // The container's own value wins; references see the service variables.
            ("KUBERNETES_SERVICE_PORT", "override"),
            ("DB", "10.96.0.7:5432"),
        ];
        for (k, v) in expect {
            assert_eq!(get(&r, k), Some(v), "{k}");
        }
        assert_eq!(r.vars.iter().filter(|(k, _)| k == "KUBERNETES_SERVICE_PORT").count(), 1);
        assert!(!r.vars.iter().any(|(k, _)| k.starts_with("HEADLESS") || k.starts_with("ELSEWHERE")), "{r:?}");
        // The container's variables come first, in definition order.
        assert_eq!(r.vars[0].0, "DB");

        // enableServiceLinks: false keeps only the kubernetes service.
        let mut off = p.clone();
        off.spec.as_mut().unwrap().enable_service_links = Some(false);
        let r = run(&off, &src).await.unwrap();
        assert_eq!(get(&r, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get(&r, "MY_DB_V2_SERVICE_HOST"), None);
        assert_eq!(get(&r, "DB"), Some("$(MY_DB_V2_SERVICE_HOST):$(MY_DB_V2_SERVICE_PORT)"));
    }

    #[tokio::test]
    async fn unsynced_services_block_api_pods_only() {
        let src = source();
        src.set_services(None);
        let p = pod(json!({"name": "c", "image": "i"}));
        let e = run(&p, &src).await.unwrap_err();
        assert_eq!(e.to_string(), "services have not yet been read at least once, cannot construct envvars");
        let mut static_pod = p.clone();
        static_pod.metadata.annotations =
            Some([(crate::types::pod::CONFIG_SOURCE_ANNOTATION.to_string(), "file".to_string())].into());
        assert!(run(&static_pod, &src).await.unwrap().vars.is_empty());
        // Standalone: no services, no variables.
        assert!(run(&p, &NoApiServer).await.unwrap().vars.is_empty());
    }

    #[tokio::test]
    async fn fields_keys_resources_and_expansion() {
        let p = pod(json!({
            "name": "c",
            "resources": {"limits": {"memory": "1Gi"}, "requests": {"cpu": "250m"}},
            "env": [
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                {"name": "IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
                {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "LOG_LEVEL"}}},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "password"}}},
                {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "CPU_REQ_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope", "optional": true}}},
                {"name": "OPT2", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": true}}},
                {"name": "GREETING", "value": "$(POD) on $(NODE) at $(LEVEL) $(UNKNOWN)"}
            ]
        }));
        let r = run(&p, &source()).await.unwrap();
        assert_eq!(get(&r, "POD"), Some("p"));
        assert_eq!(get(&r, "APP"), Some("web"));
        assert_eq!(get(&r, "NODE"), Some("node-1"));
        assert_eq!(get(&r, "SA"), Some("sa"));
        assert_eq!(get(&r, "IPS"), Some("10.0.0.5,fd00::5"));
        assert_eq!(get(&r, "HOST"), Some("192.0.2.1"));
        assert_eq!(get(&r, "LEVEL"), Some("debug"));
        assert_eq!(get(&r, "PW"), Some("hunter2"));
        assert_eq!(get(&r, "MEM_MI"), Some("1024"));
        // No cpu limit: the node's 4 cores.
        assert_eq!(get(&r, "CPU_LIMIT"), Some("4"));
        assert_eq!(get(&r, "CPU_REQ_M"), Some("250"));
        assert_eq!(get(&r, "OPT"), None);
        assert_eq!(get(&r, "OPT2"), None);
        assert_eq!(get(&r, "GREETING"), Some("p on node-1 at debug $(UNKNOWN)"));
    }

    #[tokio::test]
    async fn env_from_with_prefix_and_invalid_keys() {
        let p = pod(json!({
            "name": "c",
            "envFrom": [
                {"configMapRef": {"name": "cfg"}},
                {"prefix": "S_", "secretRef": {"name": "sec"}},
                {"configMapRef": {"name": "absent", "optional": true}}
            ],
            "env": [{"name": "LOG_LEVEL", "value": "info"}, {"name": "U", "value": "$(url)/$(S_password)"}]
        }));
        let r = run(&p, &source()).await.unwrap();
        let names: Vec<&str> = r.vars.iter().map(|(k, _)| k.as_str()).collect();
        // 1BAD is valid under the relaxed rules; a=b is not.
        assert_eq!(names, ["1BAD", "url", "S_password", "LOG_LEVEL", "U"]);
        assert_eq!(get(&r, "LOG_LEVEL"), Some("info"), "env overrides envFrom");
        assert_eq!(get(&r, "U"), Some("http://db/hunter2"));
        assert_eq!(
            r.warnings,
            vec![
                "Keys [a=b] from the EnvFrom configMap ns/cfg were skipped since they are considered invalid environment variable names."
            ]
        );
    }

    #[tokio::test]
    async fn errors_as_upstream() {
        let src = source();
        let msg = |e: Error| e.to_string();
        let one = |env: serde_json::Value| pod(json!({"name": "c", "env": [env]}));
        let p = one(json!({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "missing"}}}));
        assert_eq!(msg(run(&p, &src).await.unwrap_err()), "couldn't find key missing in ConfigMap ns/cfg");
        let p = one(json!({"name": "X", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "missing"}}}));
        assert_eq!(msg(run(&p, &src).await.unwrap_err()), "couldn't find key missing in Secret ns/sec");
        let p = one(json!({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}));
        assert_eq!(msg(run(&p, &src).await.unwrap_err()), "configmap \"absent\" not found");
        let p = pod(json!({"name": "c", "envFrom": [{"secretRef": {"name": "absent"}}]}));
        assert_eq!(msg(run(&p, &src).await.unwrap_err()), "secret \"absent\" not found");
        let p = one(json!({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}));
        assert_eq!(msg(run(&p, &src).await.unwrap_err()), "env[0] \"X\": unsupported fieldPath: status.phase");
        let p = one(json!({"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}}));
        assert_eq!(msg(run(&p, &src).await.unwrap_err()), "env[0] \"X\": unsupported container resource : limits.gpu");
        // Standalone: optional does not excuse a source that cannot answer.
        let p =
            one(json!({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k", "optional": true}}}));
        assert_eq!(msg(run(&p, &NoApiServer).await.unwrap_err()), "ConfigMap ns/cfg: no API server (standalone mode)");
    }
}
