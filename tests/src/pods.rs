//! Static pod manifests and readers of a pod's status as `/pods` serves it (JSON), for
//! the end-to-end tests.

use serde_json::Value;

/// The busybox image every test bed has (`cargo xtask testbed up` pushes it).
pub const BUSYBOX: &str = "localhost/busybox:latest";

/// A container script that runs until SIGTERM and then exits at once.
pub const SERVE: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

/// A static pod `name` with one busybox container `main` running `sh -c script`, the
/// restart policy `policy` and a 2 s grace period; `extra_container` is appended as is
/// (more YAML of the container, or more containers).
#[must_use]
pub fn pod_yaml(name: &str, policy: &str, script: &str, extra_container: &str) -> String {
    pod_yaml_of(name, Some(policy), BUSYBOX, "IfNotPresent", script, extra_container)
}

/// A static pod `name` with one container `main` of `image` (pulled as `pull_policy` says)
/// running `sh -c script`, the restart policy `policy` (none given: the default, `Always`)
/// and a 2 s grace period; `extra_container` is appended as is.
#[must_use]
pub fn pod_yaml_of(
    name: &str,
    policy: Option<&str>,
    image: &str,
    pull_policy: &str,
    script: &str,
    extra_container: &str,
) -> String {
    let restart = policy.map(|p| format!("  restartPolicy: {p}\n")).unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
{restart}  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: {image}
    imagePullPolicy: {pull_policy}
    command: ["sh", "-c", "{script}"]
{extra_container}"#
    )
}

/// `status.phase`.
#[must_use]
pub fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or_default()
}

/// `metadata.uid`.
#[must_use]
pub fn uid(p: &Value) -> String {
    p["metadata"]["uid"].as_str().unwrap_or_default().to_string()
}

/// The status of container `name` (`Null` when there is none).
#[must_use]
pub fn container<'a>(p: &'a Value, name: &str) -> &'a Value {
    p["status"]["containerStatuses"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

/// The `restartCount` of container `name`; -1 when it has no status.
#[must_use]
pub fn restarts(p: &Value, name: &str) -> i64 {
    container(p, name)["restartCount"].as_i64().unwrap_or(-1)
}

/// Whether container `name` is running.
#[must_use]
pub fn running(p: &Value, name: &str) -> bool {
    !container(p, name)["state"]["running"].is_null()
}

/// The `containerID` of container `name` without its `containerd://` prefix.
#[must_use]
pub fn container_id<'a>(p: &'a Value, name: &str) -> &'a str {
    let id = container(p, name)["containerID"].as_str().unwrap_or_default();
    id.split_once("://").map_or(id, |(_, id)| id)
}

/// The status (`"True"`, `"False"`) of the pod's condition `type_`, if it has it.
#[must_use]
pub fn condition<'a>(p: &'a Value, type_: &str) -> Option<&'a str> {
    p["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)?["status"].as_str()
}

/// Phase `Running`, condition `Ready` true, and container `name` running.
#[must_use]
pub fn running_and_ready(p: &Value, name: &str) -> bool {
    phase(p) == "Running" && condition(p, "Ready") == Some("True") && running(p, name)
}
