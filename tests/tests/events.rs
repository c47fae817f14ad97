//! End-to-end test of the events the agent posts to the real kube-apiserver (the test
//! bed's control plane, see `swiftlet_tests::cluster`): a pod whose liveness
//! probe errors every second (the exec of a binary its image lacks) must not flood the
//! API server. As upstream's event correlator does, the agent creates nine `Unhealthy`
//! events (each exec error has a message of its own: containerd names the exec), then
//! one `(combined from similar events): ...` event whose count grows, and nothing more.

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use serde_json::json;
use swiftlet_tests::cluster::Cluster;
use swiftlet_tests::{AgentOptions, Cri, cri_endpoint, tail, testbed_lock};

const COMBINED: &str = "(combined from similar events): ";
const ERRORED: &str = "Liveness probe errored and resulted in unknown state: rpc error: code = Unknown desc = ";

fn probed(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
                "livenessProbe": {"exec": {"command": ["/no-such-binary"]}, "periodSeconds": 1, "failureThreshold": 3}
            }]
        }
    })
}

/// The pod's `Unhealthy` events.
async fn unhealthy(events: &Api<Event>, name: &str) -> Result<Vec<Event>> {
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some("Unhealthy"))
        .collect())
}

#[tokio::test]
async fn a_failing_liveness_probe_posts_nine_events_then_one_combined() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let mut node = cluster.join("events", AgentOptions::default()).await?;
    let ns = node.namespace("events").await?;
    node.create_pod(&ns, probed("flood")).await?;
    let events = Api::<Event>::namespaced(cluster.client(), &ns);

    // Ten errors take ten seconds; the combined event's count then grows by one a second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let combined = loop {
        let found = unhealthy(&events, "flood").await?;
        if let Some(e) = found
            .iter()
            .find(|e| e.message.as_deref().is_some_and(|m| m.starts_with(COMBINED)) && e.count.unwrap_or_default() >= 5)
        {
            break e.clone();
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no combined event counted to 5: {found:#?}\n{}",
            tail(&node.agent.log(), 60)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let message = combined.message.clone().unwrap_or_default();
    assert!(message.starts_with(&format!("{COMBINED}{ERRORED}")), "{message}");
    assert!(message.contains("/no-such-binary"), "{message}");

    let found = unhealthy(&events, "flood").await?;
    assert_eq!(found.len(), 10, "nine events and the combined one: {found:#?}");
    for e in found.iter().filter(|e| e.metadata.name != combined.metadata.name) {
        let m = e.message.as_deref().unwrap_or_default();
        assert!(m.starts_with(ERRORED), "{m}");
        assert_eq!(e.count, Some(1), "each error has a message of its own: {e:#?}");
        assert_eq!(e.involved_object.field_path.as_deref(), Some("spec.containers{main}"));
    }
    // Errors do not count as failures: the container was not restarted.
    let pod = Api::<Pod>::namespaced(cluster.client(), &ns).get("flood").await?;
    let restarts = pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|cs| cs.first().map(|c| c.restart_count))
        .unwrap_or_default();
    assert_eq!(restarts, 0);
    node.leave(&cri).await
}
