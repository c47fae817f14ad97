//! Tests of the API server double with the real `kube` client (and raw HTTP where a
//! client would hide what the server answered).

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod, Service, ServiceAccount};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use serde_json::json;

use super::{Authorizer, Failure, Options, TestApiServer, UserInfo};

async fn server() -> Result<TestApiServer> {
    Ok(TestApiServer::start(Options::default()).await?)
}

fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    serde_json::from_value(p).expect("valid pod")
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {
            "capacity": {"cpu": "2", "memory": "4Gi"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}],
        },
    }))
    .expect("valid node")
}

/// The API error of a kube call.
fn api_err<T: std::fmt::Debug>(r: kube::Result<T>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn next_event<S>(s: &mut S) -> Result<WatchEvent<Pod>>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin,
{
    Ok(tokio::time::timeout(Duration::from_secs(10), s.next()).await?.context("watch ended")??)
}

fn raw_http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client")
}

#[tokio::test]
async fn create_get_list_and_pod_defaults() -> Result<()> {
    let srv = server().await?;
    let pods: Api<Pod> = Api::default_namespaced(srv.client().await?);
    let created = pods.create(&PostParams::default(), &pod("web", None)).await?;
    let spec = created.spec.as_ref().context("spec")?;
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.enable_service_links, Some(true));
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    assert_eq!(spec.priority, Some(0));
    let tolerations = spec.tolerations.as_ref().context("tolerations")?;
    assert_eq!(tolerations.len(), 2);
    assert!(tolerations.iter().all(|t| t.toleration_seconds == Some(300) && t.effect.as_deref() == Some("NoExecute")));
    let c = &spec.containers[0];
    assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(c.termination_message_path.as_deref(), Some("/dev/termination-log"));
    assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
    let status = created.status.as_ref().context("status")?;
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());

    // AlreadyExists, NotFound, namespace checks.
    let e = api_err(pods.create(&PostParams::default(), &pod("web", None)).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "pods \"web\" already exists");
    let e = api_err(pods.get("nope").await);
    assert_eq!((e.code, e.reason.as_str(), e.message.as_str()), (404, "NotFound", "pods \"nope\" not found"));
    let mut elsewhere = pod("x", None);
    elsewhere.metadata.namespace = None;
    let e =
        api_err(Api::<Pod>::namespaced(srv.client().await?, "nope").create(&PostParams::default(), &elsewhere).await);
    assert_eq!((e.code, e.message.as_str()), (404, "namespaces \"nope\" not found"));

    // generateName, a tagged image, a mirror pod (no service account), Guaranteed QoS.
    let mut generated = pod("", None);
    generated.metadata.name = None;
    generated.metadata.labels = None;
    generated.metadata.generate_name = Some("gen-".into());
    let mut spec = generated.spec.take().context("spec")?;
    spec.containers[0].image = Some("busybox:1.36".into());
    spec.containers[0].resources = Some(serde_json::from_value(json!({"limits": {"cpu": "1", "memory": "64Mi"}}))?);
    generated.spec = Some(spec);
    generated.metadata.annotations = Some([("kubernetes.io/config.mirror".to_string(), "hash".to_string())].into());
    let generated = pods.create(&PostParams::default(), &generated).await?;
    let name = generated.metadata.name.as_deref().context("name")?;
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    let spec = generated.spec.as_ref().context("spec")?;
    assert_eq!(spec.containers[0].image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(spec.service_account_name, None);
    assert_eq!(generated.status.and_then(|s| s.qos_class).as_deref(), Some("Guaranteed"));

    let list = pods.list(&ListParams::default()).await?;
    assert_eq!(list.items.len(), 2);
    let rv: u64 = list.metadata.resource_version.as_deref().context("list rv")?.parse()?;
    assert_eq!(rv, srv.resource_version());
    let by_label = pods.list(&ListParams::default().labels("app=web")).await?;
    assert_eq!(by_label.items.len(), 1);
    let e = api_err(pods.list(&ListParams::default().fields("spec.bogus=1")).await);
    assert_eq!((e.code, e.message.as_str()), (400, "field label not supported: spec.bogus"));

    // Pagination with continue tokens.
    let cms: Api<ConfigMap> = Api::default_namespaced(srv.client().await?);
    for i in 0..5 {
        cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": format!("cm{i}")}}))?)
            .await?;
    }
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(2);
    loop {
        let page = cms.list(&lp).await?;
        assert!(page.items.len() <= 2);
        names.extend(page.items.into_iter().filter_map(|c| c.metadata.name));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => lp = ListParams::default().limit(2).continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(names, ["cm0", "cm1", "cm2", "cm3", "cm4"]);
    Ok(())
}

#[tokio::test]
async fn update_conflicts_and_status_subresource() -> Result<()> {
    let srv = server().await?;
    let client = srv.client().await?;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let p = pods.create(&PostParams::default(), &pod("p", Some("n1"))).await?;

    let mut changed = p.clone();
    changed.metadata.labels.get_or_insert_default().insert("x".into(), "1".into());
    // Status changes through the main resource are ignored.
    changed.status.get_or_insert_default().phase = Some("Running".into());
    let updated = pods.replace("p", &PostParams::default(), &changed).await?;
    assert_eq!(updated.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"));
    assert_eq!(updated.metadata.labels.as_ref().and_then(|l| l.get("x")).map(String::as_str), Some("1"));
    assert_ne!(updated.metadata.resource_version, p.metadata.resource_version);
    // The same stale object again: 409 with the real server's message.
    let e = api_err(pods.replace("p", &PostParams::default(), &changed).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on pods \"p\": the object has been modified; please apply your changes to \
         the latest version and try again"
    );
    // A spec change other than the image is forbidden.
    let mut bad = updated.clone();
    bad.spec.as_mut().context("spec")?.containers[0].name = "renamed".into();
    assert_eq!(api_err(pods.replace("p", &PostParams::default(), &bad).await).code, 422);
    // An update that changes nothing is no write.
    let same = pods.replace("p", &PostParams::default(), &updated).await?;
    assert_eq!(same.metadata.resource_version, updated.metadata.resource_version);

    // The status subresource changes only status.
    let mut st = same.clone();
    st.status.get_or_insert_default().phase = Some("Running".into());
    st.spec.as_mut().context("spec")?.active_deadline_seconds = Some(5);
    let after = pods.replace_status("p", &PostParams::default(), &st).await?;
    assert_eq!(after.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
    assert_eq!(after.status.as_ref().and_then(|s| s.qos_class.as_deref()), Some("BestEffort"));
    assert_eq!(after.spec.as_ref().and_then(|s| s.active_deadline_seconds), None);

    // The server's canonical form: a null, an absent field and an empty list are the same,
    // so writing back what was read (through k8s-openapi, which drops nulls) is no write.
    let with_nulls = json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": null}
    ]}});
    let patched = pods.patch_status("p", &PatchParams::default(), &Patch::Merge(with_nulls)).await?;
    let rewritten = pods.replace_status("p", &PostParams::default(), &patched).await?;
    assert_eq!(rewritten.metadata.resource_version, patched.metadata.resource_version);

    // Nodes: status through the main resource ignored; spec through /status ignored.
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.create(&PostParams::default(), &node("n1")).await?;
    let st = n.status.as_ref().context("status")?;
    assert_eq!(st.allocatable, st.capacity, "allocatable defaults to capacity");
    let mut n2 = n.clone();
    n2.status.as_mut().context("status")?.conditions = None;
    n2.spec.get_or_insert_default().unschedulable = Some(true);
    let n2 = nodes.replace("n1", &PostParams::default(), &n2).await?;
    assert_eq!(n2.status.as_ref().and_then(|s| s.conditions.as_ref()).map(Vec::len), Some(2));
    assert_eq!(n2.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    let mut n3 = n2.clone();
    n3.spec.get_or_insert_default().unschedulable = Some(false);
    n3.status.as_mut().context("status")?.conditions = None;
    let n3 = nodes.replace_status("n1", &PostParams::default(), &n3).await?;
    assert_eq!(n3.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert_eq!(n3.status.as_ref().and_then(|s| s.conditions.as_ref()), None);

    // Leases: no unconditional update; PUT may create.
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}
    }))?;
    let created = leases.replace("n1", &PostParams::default(), &lease).await?;
    assert!(created.metadata.resource_version.is_some());
    let e = api_err(leases.replace("n1", &PostParams::default(), &lease).await);
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("metadata.resourceVersion: Invalid value: 0: must be specified for an update"),
        "{}",
        e.message
    );
    let mut renewed = created.clone();
    renewed.spec.get_or_insert_default().lease_duration_seconds = Some(41);
    leases.replace("n1", &PostParams::default(), &renewed).await?;
    assert_eq!(api_err(leases.replace("n1", &PostParams::default(), &renewed).await).code, 409);
    Ok(())
}

#[tokio::test]
async fn patches_of_all_kinds() -> Result<()> {
    let srv = server().await?;
    let client = srv.client().await?;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("p", Some("n1"))).await?;
    let pp = PatchParams::default();

    let p = pods.patch("p", &pp, &Patch::Merge(json!({"metadata": {"labels": {"app": null, "b": "2"}}}))).await?;
    let labels = p.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("b").map(String::as_str), Some("2"));
    assert!(!labels.contains_key("app"));

    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}]))?;
    let p = pods.patch("p", &pp, &Patch::<()>::Json(jp)).await?;
    assert_eq!(p.metadata.annotations.and_then(|a| a.get("k").cloned()).as_deref(), Some("v"));
    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/name", "value": "other"}]))?;
    assert_eq!(api_err(pods.patch("p", &pp, &Patch::<()>::Json(failing)).await).code, 422);

    // Strategic merge on status: conditions by type, containerStatuses replaced whole.
    let status = json!({"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "c", "ready": false, "restartCount": 0, "image": "busybox", "imageID": ""}],
    }});
    pods.patch_status("p", &pp, &Patch::Strategic(status)).await?;
    let p = pods
        .patch_status(
            "p",
            &pp,
            &Patch::Strategic(json!({"status": {
                "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "ready": true, "restartCount": 1, "image": "busybox", "imageID": ""}],
            }})),
        )
        .await?;
    let st = p.status.context("status")?;
    let conds: Vec<(String, String)> =
        st.conditions.unwrap_or_default().into_iter().map(|c| (c.type_, c.status)).collect();
    assert_eq!(conds, [("Ready".into(), "True".into()), ("PodScheduled".into(), "True".into())]);
    let cs = st.container_statuses.unwrap_or_default();
    assert_eq!((cs.len(), cs[0].ready, cs[0].restart_count), (1, true, 1));
    assert_eq!(st.phase.as_deref(), Some("Running"));
    // A patch of the main resource does not touch status.
    let p = pods.patch("p", &pp, &Patch::Merge(json!({"status": {"phase": "Failed"}}))).await?;
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Running"));
    // A resourceVersion in the patch is a precondition.
    let e = api_err(pods.patch("p", &pp, &Patch::Merge(json!({"metadata": {"resourceVersion": "1"}}))).await);
    assert_eq!(e.code, 409);

    // Nodes: addresses and conditions merge by type.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node("n1")).await?;
    let n = nodes
        .patch_status(
            "n1",
            &pp,
            &Patch::Strategic(json!({"status": {
                "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}],
                "conditions": [{"type": "Ready", "status": "True"}],
            }})),
        )
        .await?;
    let st = n.status.context("status")?;
    let addrs: Vec<(String, String)> =
        st.addresses.unwrap_or_default().into_iter().map(|a| (a.type_, a.address)).collect();
    assert_eq!(addrs, [("InternalIP".into(), "10.0.0.2".into()), ("Hostname".into(), "n1".into())]);
    let conds = st.conditions.unwrap_or_default();
    assert_eq!(conds.len(), 2);
    assert_eq!(conds.iter().find(|c| c.type_ == "Ready").map(|c| c.status.as_str()), Some("True"));

    // Apply creates and merges; it needs a field manager.
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "1"}});
    let created = cms.patch("applied", &PatchParams::apply("test"), &Patch::Apply(&cm)).await?;
    assert_eq!(created.data.and_then(|d| d.get("a").cloned()).as_deref(), Some("1"));
    let e = api_err(cms.patch("applied", &PatchParams::default(), &Patch::Apply(&cm)).await);
    assert_eq!(e.code, 422);

    // An unknown patch content type is a 415.
    let r = raw_http()
        .patch(format!("{}/api/v1/namespaces/default/pods/p", srv.url()))
        .bearer_auth(srv.token())
        .header("user-agent", "swiftlet/test")
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 415);

    // Every PATCH is recorded with its content type.
    let patches: Vec<_> = srv.requests().into_iter().filter(|r| r.method == "PATCH").collect();
    assert!(
        patches.iter().any(|r| r.path == "/api/v1/namespaces/default/pods/p/status"
            && r.content_type.as_deref() == Some("application/strategic-merge-patch+json")
            && r.user.as_deref() == Some("admin")),
        "{patches:#?}"
    );
    let last = patches.last().context("the 415")?;
    assert_eq!((last.user_agent.as_deref(), last.status), (Some("swiftlet/test"), 415));
    Ok(())
}

#[tokio::test]
async fn graceful_pod_deletion() -> Result<()> {
    let srv = server().await?;
    let pods: Api<Pod> = Api::default_namespaced(srv.client().await?);
    let bound = pods.create(&PostParams::default(), &pod("bound", Some("n1"))).await?;
    let rv = bound.metadata.resource_version.clone().context("rv")?;
    let mut w = pods.watch(&WatchParams::default().fields("metadata.name=bound").timeout(30), &rv).await?.boxed();

    // A bound, running pod is only marked: deletionTimestamp = now + grace.
    let marked = pods.delete("bound", &DeleteParams::default()).await?.left().context("pod object")?;
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    let ts = marked.metadata.deletion_timestamp.as_ref().context("deletionTimestamp")?.0.as_second();
    let expected = jiff::Timestamp::now().as_second() + 30;
    assert!((expected - 2..=expected + 1).contains(&ts));
    assert!(pods.get("bound").await.is_ok());
    assert!(matches!(next_event(&mut w).await?, WatchEvent::Modified(p) if p.metadata.deletion_timestamp.is_some()));
    // A longer grace period changes nothing.
    let again = pods.delete("bound", &DeleteParams::default().grace_period(60)).await?.left().context("pod")?;
    assert_eq!(again.metadata.deletion_grace_period_seconds, Some(30));
    // The wrong UID precondition is a conflict.
    let wrong = DeleteParams::default()
        .grace_period(0)
        .preconditions(Preconditions { uid: Some("not-the-uid".into()), resource_version: None });
    assert_eq!(api_err(pods.delete("bound", &wrong).await).code, 409);
    // The kubelet's final delete: grace 0 with the UID precondition removes it.
    let fin = DeleteParams::default()
        .grace_period(0)
        .preconditions(Preconditions { uid: bound.metadata.uid.clone(), resource_version: None });
    pods.delete("bound", &fin).await?;
    assert_eq!(api_err(pods.get("bound").await).code, 404);
    assert!(
        matches!(next_event(&mut w).await?, WatchEvent::Modified(p) if p.metadata.deletion_grace_period_seconds == Some(0))
    );
    assert!(matches!(next_event(&mut w).await?, WatchEvent::Deleted(_)));

    // Unbound pods and terminal pods go at once.
    pods.create(&PostParams::default(), &pod("unbound", None)).await?;
    pods.delete("unbound", &DeleteParams::default()).await?;
    assert_eq!(api_err(pods.get("unbound").await).code, 404);
    pods.create(&PostParams::default(), &pod("done", Some("n1"))).await?;
    pods.patch_status("done", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Succeeded"}})))
        .await?;
    pods.delete("done", &DeleteParams::default()).await?;
    assert_eq!(api_err(pods.get("done").await).code, 404);

    // Finalizers hold an object until the last one is removed.
    let cms: Api<ConfigMap> = Api::default_namespaced(srv.client().await?);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "f", "finalizers": ["x/y"]}}))?,
    )
    .await?;
    let held = cms.delete("f", &DeleteParams::default()).await?.left().context("object while finalizing")?;
    assert!(held.metadata.deletion_timestamp.is_some());
    cms.patch("f", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    assert_eq!(api_err(cms.get("f").await).code, 404);
    Ok(())
}

#[tokio::test]
async fn namespace_lifecycle() -> Result<()> {
    let srv = server().await?;
    let client = srv.client().await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> =
        nss.list(&ListParams::default()).await?.items.into_iter().filter_map(|n| n.metadata.name).collect();
    assert_eq!(names, ["default", "kube-node-lease", "kube-public", "kube-system"]);
    assert_eq!(api_err(nss.delete("default", &DeleteParams::default()).await).code, 403);
    nss.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "tmp"}}))?).await?;
    assert!(srv.get::<ServiceAccount>(Some("tmp"), "default").is_some(), "the default service account");
    let pods: Api<Pod> = Api::namespaced(client, "tmp");
    let mut p = pod("p", Some("n1"));
    p.metadata.namespace = Some("tmp".into());
    pods.create(&PostParams::default(), &p).await?;
    let ns = nss.delete("tmp", &DeleteParams::default()).await?.left().context("namespace")?;
    assert_eq!(ns.status.and_then(|s| s.phase).as_deref(), Some("Terminating"));
    // The bound pod is being deleted gracefully; nothing new may be created.
    assert!(pods.get("p").await?.metadata.deletion_timestamp.is_some());
    p.metadata.name = Some("q".into());
    let e = api_err(pods.create(&PostParams::default(), &p).await);
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    pods.delete("p", &DeleteParams::default().grace_period(0)).await?;
    assert_eq!(api_err(nss.get("tmp").await).code, 404);
    Ok(())
}

#[tokio::test]
async fn field_and_label_selectors_on_watch() -> Result<()> {
    let srv = server().await?;
    let pods: Api<Pod> = Api::default_namespaced(srv.client().await?);
    pods.create(&PostParams::default(), &pod("a", Some("n1"))).await?;
    pods.create(&PostParams::default(), &pod("b", Some("n2"))).await?;
    pods.create(&PostParams::default(), &pod("c", None)).await?;
    let on_n1 = pods.list(&ListParams::default().fields("spec.nodeName=n1")).await?;
    assert_eq!(on_n1.items.iter().filter_map(|p| p.metadata.name.as_deref()).collect::<Vec<_>>(), ["a"]);
    let not_n1 = pods.list(&ListParams::default().fields("spec.nodeName!=n1,status.phase=Pending")).await?;
    assert_eq!(not_n1.items.len(), 2);

    // From "0": the current state as ADDED, then changes that match.
    let mut w = pods.watch(&WatchParams::default().fields("spec.nodeName=n1").timeout(30), "0").await?.boxed();
    assert!(matches!(next_event(&mut w).await?, WatchEvent::Added(p) if p.metadata.name.as_deref() == Some("a")));
    // Binding c to n1 makes it match: ADDED.
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "c"}, "target": {"kind": "Node", "name": "n1"}});
    let _: kube::core::Status = pods.create_subresource("binding", "c", &PostParams::default(), &binding).await?;
    assert!(matches!(next_event(&mut w).await?, WatchEvent::Added(p) if p.metadata.name.as_deref() == Some("c")));
    let e = api_err(
        pods.create_subresource::<_, kube::core::Status>("binding", "c", &PostParams::default(), &binding).await,
    );
    assert_eq!(e.code, 409);
    // A change on n2 is not seen; one on n1 is.
    pods.patch("b", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}}))).await?;
    pods.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}}))).await?;
    assert!(matches!(next_event(&mut w).await?, WatchEvent::Modified(p) if p.metadata.name.as_deref() == Some("a")));

    // A label change that stops matching is a DELETED with the event's resourceVersion.
    let rv = srv.resource_version().to_string();
    let mut lw = pods.watch(&WatchParams::default().labels("app=web").timeout(30), &rv).await?.boxed();
    let p =
        pods.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}}))).await?;
    match next_event(&mut lw).await? {
        WatchEvent::Deleted(d) => {
            assert_eq!(d.metadata.name.as_deref(), Some("a"));
            assert_eq!(d.metadata.resource_version, p.metadata.resource_version);
            assert_eq!(d.metadata.labels.and_then(|l| l.get("app").cloned()).as_deref(), Some("web"));
        }
        other => bail!("expected DELETED, got {other:?}"),
    }
    pods.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}}))).await?;
    assert!(matches!(next_event(&mut lw).await?, WatchEvent::Added(p) if p.metadata.name.as_deref() == Some("a")));
    Ok(())
}

#[tokio::test]
async fn bookmarks_resume_and_too_old_resource_version() -> Result<()> {
    let srv =
        TestApiServer::start(Options { bookmark_interval: Duration::from_millis(100), ..Options::default() }).await?;
    let pods: Api<Pod> = Api::default_namespaced(srv.client().await?);
    let a = pods.create(&PostParams::default(), &pod("a", None)).await?;
    let rv_a = a.metadata.resource_version.clone().context("rv")?;
    pods.create(&PostParams::default(), &pod("b", None)).await?;

    // Resuming replays what happened after the resourceVersion, then bookmarks follow.
    let mut w = pods.watch(&WatchParams::default().timeout(30), &rv_a).await?.boxed();
    assert!(matches!(next_event(&mut w).await?, WatchEvent::Added(p) if p.metadata.name.as_deref() == Some("b")));
    match next_event(&mut w).await? {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, srv.resource_version().to_string()),
        other => bail!("expected BOOKMARK, got {other:?}"),
    }
    // Without allowWatchBookmarks there are none.
    let mut quiet = pods
        .watch(&WatchParams::default().disable_bookmarks().timeout(1), &srv.resource_version().to_string())
        .await?
        .boxed();
    assert!(tokio::time::timeout(Duration::from_secs(5), quiet.next()).await?.is_none(), "ends at timeoutSeconds");

    // After a compaction, an old resourceVersion is 410 Expired, sent as an ERROR event.
    srv.compact();
    let mut old = pods.watch(&WatchParams::default().timeout(30), &rv_a).await?.boxed();
    match next_event(&mut old).await? {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(e.message.starts_with(&format!("too old resource version: {rv_a} (")), "{}", e.message);
        }
        other => bail!("expected ERROR, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn watcher_relists_after_410_across_a_restart() -> Result<()> {
    let srv = server().await?;
    let pods: Api<Pod> = Api::default_namespaced(srv.client().await?);
    pods.create(&PostParams::default(), &pod("a", Some("n1"))).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cfg = watcher::Config::default().fields("spec.nodeName=n1");
    let task = tokio::spawn(watcher(pods.clone(), cfg).default_backoff().for_each(move |e| {
        let _ = tx.send(e.map_err(|e| e.to_string()));
        futures::future::ready(())
    }));
    let recv = async |rx: &mut tokio::sync::mpsc::UnboundedReceiver<_>| {
        tokio::time::timeout(Duration::from_secs(20), rx.recv()).await.ok().flatten().context("watcher went quiet")
    };
    // The initial list.
    loop {
        if matches!(recv(&mut rx).await?, Ok(watcher::Event::InitDone)) {
            break;
        }
    }
    pods.create(&PostParams::default(), &pod("b", Some("n1"))).await?;
    assert!(matches!(recv(&mut rx).await?, Ok(watcher::Event::Apply(p)) if p.metadata.name.as_deref() == Some("b")));

    // The server goes down; a pod appears meanwhile; the restarted server's watch cache
    // starts at the current resourceVersion, so the watcher's resume is too old.
    srv.stop().await;
    srv.create(&pod("c", Some("n1")))?;
    srv.restart().await?;
    let mut saw_410 = false;
    let mut relisted = Vec::new();
    loop {
        match recv(&mut rx).await? {
            Err(e) => saw_410 |= e.contains("410") || e.contains("Expired"),
            Ok(watcher::Event::InitApply(p)) => relisted.extend(p.metadata.name),
            Ok(watcher::Event::InitDone) => break,
            Ok(_) => {}
        }
    }
    assert!(saw_410, "the watcher saw 410 Expired");
    relisted.sort();
    assert_eq!(relisted, ["a", "b", "c"]);
    // It keeps watching afterwards.
    pods.create(&PostParams::default(), &pod("d", Some("n1"))).await?;
    assert!(matches!(recv(&mut rx).await?, Ok(watcher::Event::Apply(p)) if p.metadata.name.as_deref() == Some("d")));
    task.abort();

    // The streaming-list variant (sendInitialEvents) works too.
    let streamed: Vec<Pod> = tokio::time::timeout(
        Duration::from_secs(10),
        watcher(pods, watcher::Config::default().streaming_lists()).applied_objects().take(4).try_collect(),
    )
    .await??;
    assert_eq!(streamed.len(), 4);
    Ok(())
}

#[tokio::test]
async fn restart_keeps_data_and_failures_can_be_injected() -> Result<()> {
    let srv = server().await?;
    let client = srv.client().await?;
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "keep"}, "data": {"k": "v"}}))?,
    )
    .await?;
    srv.stop().await;
    assert!(!srv.is_running());
    assert!(cms.get("keep").await.is_err(), "the server is down");
    srv.restart().await?;
    assert_eq!(cms.get("keep").await?.data.and_then(|d| d.get("k").cloned()).as_deref(), Some("v"));

    // One 500 for GETs, then normal service.
    srv.fail_requests(Failure::status(500).matching(|r| r.method == "GET").times(1));
    let e = api_err(cms.get("keep").await);
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    assert!(cms.get("keep").await.is_ok());

    // A hanging request is answered once the failure is cleared.
    srv.fail_requests(Failure::hang().matching(|r| r.path.ends_with("/keep")));
    let pending = tokio::spawn({
        let cms = cms.clone();
        async move { cms.get("keep").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "the request hangs");
    srv.clear_failures();
    assert!(tokio::time::timeout(Duration::from_secs(10), pending).await??.is_ok());
    Ok(())
}

#[tokio::test]
async fn authentication_and_tls() -> Result<()> {
    let srv = server().await?;
    let url = format!("{}/api/v1/namespaces/default/pods", srv.url());
    for token in [None, Some("wrong")] {
        let mut req = raw_http().get(&url);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await?;
        assert_eq!(r.status().as_u16(), 401);
        let body: serde_json::Value = r.json().await?;
        assert_eq!(
            (body["kind"].as_str(), body["reason"].as_str(), body["code"].as_u64()),
            (Some("Status"), Some("Unauthorized"), Some(401))
        );
    }
    srv.add_token("node-token", UserInfo::new("system:node:n1", &["system:nodes"]));
    let r = raw_http().get(&url).bearer_auth("node-token").send().await?;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(srv.requests().last().and_then(|r| r.user.clone()).as_deref(), Some("system:node:n1"));

    // HTTPS with the kubeconfig's CA, and discovery as kube-rs runs it.
    let tls = TestApiServer::start(Options { tls: true, ..Options::default() }).await?;
    assert!(tls.url().starts_with("https://127.0.0.1:"));
    let client = tls.client().await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    assert_eq!(nss.list(&ListParams::default()).await?.items.len(), 4);
    let discovery = kube::Discovery::new(client.clone()).run().await?;
    assert!(discovery.has_group("coordination.k8s.io") && discovery.has_group("events.k8s.io"));
    let v = client.apiserver_version().await?;
    assert_eq!((v.major.as_str(), v.minor.as_str()), ("1", "37"));
    let written = tls.write_kubeconfig(&std::env::temp_dir().join(format!("swiftlet-kc-{}", std::process::id())))?;
    assert!(std::fs::read_to_string(&written)?.contains("certificate-authority-data"));
    std::fs::remove_dir_all(written.parent().context("dir")?)?;
    Ok(())
}

#[tokio::test]
async fn token_request_and_reviews() -> Result<()> {
    let srv = server().await?;
    let client = srv.client().await?;
    let sas: Api<ServiceAccount> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let p = pods.create(&PostParams::default(), &pod("p", Some("n1"))).await?;
    let request = |seconds: i64, uid: Option<String>| TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(seconds),
            bound_object_ref: Some(BoundObjectReference {
                kind: Some("Pod".into()),
                api_version: Some("v1".into()),
                name: Some("p".into()),
                uid,
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let tr: TokenRequest = sas
        .create_subresource("token", "default", &PostParams::default(), &request(3600, p.metadata.uid.clone()))
        .await?;
    let st = tr.status.context("status")?;
    let token = st.token.context("token")?;
    assert_eq!(token.split('.').count(), 3);
    let exp = st.expiration_timestamp.context("expiration")?.0.as_second();
    let expected = jiff::Timestamp::now().as_second() + 3600;
    assert!((expected - 2..=expected + 1).contains(&exp));
    assert_eq!(
        tr.spec.and_then(|s| s.audiences).as_deref(),
        Some(&["https://kubernetes.default.svc.cluster.local".to_string()][..])
    );
    // Under 10 minutes is invalid; a wrong pod UID is a conflict.
    let e = api_err(
        sas.create_subresource::<_, TokenRequest>("token", "default", &PostParams::default(), &request(60, None)).await,
    );
    assert_eq!(e.code, 422);
    assert!(e.message.contains("may not specify a duration less than 10 minutes"), "{}", e.message);
    let e = api_err(
        sas.create_subresource::<_, TokenRequest>(
            "token",
            "default",
            &PostParams::default(),
            &request(3600, Some("x".into())),
        )
        .await,
    );
    assert_eq!(e.code, 409);

    // TokenReview: the issued token is the service account's, bound to the pod.
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review = |token: &str| TokenReview {
        spec: TokenReviewSpec { token: token.into(), audiences: None },
        ..TokenReview::default()
    };
    let r = reviews.create(&PostParams::default(), &review(&token)).await?.status.context("status")?;
    assert_eq!(r.authenticated, Some(true));
    let user = r.user.context("user")?;
    assert_eq!(user.username.as_deref(), Some("system:serviceaccount:default:default"));
    assert!(user.groups.unwrap_or_default().contains(&"system:serviceaccounts:default".to_string()));
    assert_eq!(
        user.extra.and_then(|e| e.get("authentication.kubernetes.io/pod-name").cloned()),
        Some(vec!["p".to_string()])
    );
    // The token also authenticates API requests, until its pod is gone.
    let url = format!("{}/api/v1/namespaces", srv.url());
    assert_eq!(raw_http().get(&url).bearer_auth(&token).send().await?.status().as_u16(), 200);
    srv.delete::<Pod>(Some("default"), "p", Some(0))?;
    assert_eq!(raw_http().get(&url).bearer_auth(&token).send().await?.status().as_u16(), 401);
    let r = reviews.create(&PostParams::default(), &review("garbage")).await?.status.context("status")?;
    assert_ne!(r.authenticated, Some(true));
    srv.add_token("t1", UserInfo::new("alice", &["devs"]));
    let r = reviews.create(&PostParams::default(), &review("t1")).await?.status.context("status")?;
    assert_eq!(r.user.and_then(|u| u.username).as_deref(), Some("alice"));

    // SubjectAccessReview answers as configured.
    let access_reviews: Api<SubjectAccessReview> = Api::all(client);
    let sar = |user: &str| SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some("get".into()),
                resource: Some("pods".into()),
                namespace: Some("default".into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let allowed = |r: SubjectAccessReview| r.status.map(|s| (s.allowed, s.denied.unwrap_or(false)));
    assert_eq!(allowed(access_reviews.create(&PostParams::default(), &sar("bob")).await?), Some((true, false)));
    srv.set_authorizer(Authorizer::DenyAll);
    assert_eq!(allowed(access_reviews.create(&PostParams::default(), &sar("bob")).await?), Some((false, true)));
    srv.set_authorizer(Authorizer::allow_if(|spec| spec.user.as_deref() == Some("alice")));
    assert_eq!(allowed(access_reviews.create(&PostParams::default(), &sar("alice")).await?), Some((true, false)));
    assert_eq!(allowed(access_reviews.create(&PostParams::default(), &sar("bob")).await?), Some((false, false)));
    let e = api_err(access_reviews.create(&PostParams::default(), &SubjectAccessReview::default()).await);
    assert_eq!(e.code, 422);

    // A kubelet's rules: nodes/<subresource> by user or group.
    srv.set_authorizer(Authorizer::node_rules(&[("alice", "get", "stats"), ("ops", "*", "proxy")]));
    let node_sar = |user: &str, groups: &[&str], verb: &str, subresource: &str| SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(groups.iter().map(|g| (*g).to_string()).collect()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                version: Some("v1".into()),
                resource: Some("nodes".into()),
                subresource: Some(subresource.into()),
                name: Some("node-1".into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    for (user, groups, verb, subresource, want) in [
        ("alice", &[][..], "get", "stats", true),
        ("alice", &[], "create", "stats", false),
        ("alice", &[], "get", "proxy", false),
        ("bob", &["ops"], "create", "proxy", true),
        ("bob", &["ops"], "get", "metrics", false),
    ] {
        let r = access_reviews.create(&PostParams::default(), &node_sar(user, groups, verb, subresource)).await?;
        assert_eq!(allowed(r), Some((want, false)), "{user} {verb} {subresource}");
    }
    assert_eq!(srv.reviews("tokenreviews").len(), 3);
    let access_review_bodies = srv.reviews("subjectaccessreviews");
    assert_eq!(access_review_bodies.len(), 10);
    assert_eq!(access_review_bodies[9]["spec"]["resourceAttributes"]["subresource"], "metrics");
    Ok(())
}

#[tokio::test]
async fn events_in_both_api_versions_and_store_helpers() -> Result<()> {
    let srv = server().await?;
    let client = srv.client().await?;
    let new_events: Api<k8s_openapi::api::events::v1::Event> = Api::default_namespaced(client.clone());
    let ev: k8s_openapi::api::events::v1::Event = serde_json::from_value(json!({
        "metadata": {"name": "p.1"},
        "eventTime": "2026-01-01T00:00:00.000001Z",
        "regarding": {"kind": "Pod", "namespace": "default", "name": "p"},
        "note": "Started container c", "reason": "Started", "type": "Normal", "action": "Start",
        "reportingController": "kubelet", "reportingInstance": "n1",
    }))?;
    new_events.create(&PostParams::default(), &ev).await?;
    let core: Api<Event> = Api::default_namespaced(client);
    let got = core.get("p.1").await?;
    assert_eq!(got.message.as_deref(), Some("Started container c"));
    assert_eq!(got.involved_object.name.as_deref(), Some("p"));
    assert_eq!(got.reporting_component.as_deref(), Some("kubelet"));
    let by_object = core.list(&ListParams::default().fields("involvedObject.name=p,reason=Started")).await?;
    assert_eq!(by_object.items.len(), 1);
    let back = new_events.list(&ListParams::default().fields("regarding.name=p")).await?;
    assert_eq!(back.items[0].note.as_deref(), Some("Started container c"));

    // The typed store helpers the end-to-end tests use.
    srv.create(&pod("h", Some("n1")))?;
    assert_eq!(srv.list::<Pod>(Some("default")).len(), 1);
    let running = srv.modify::<Pod>(Some("default"), "h", true, |p| {
        p.status.get_or_insert_default().phase = Some("Running".into());
    })?;
    assert_eq!(running.status.and_then(|st| st.phase).as_deref(), Some("Running"));
    let waiter = srv.wait_for::<Pod>(Some("default"), "h", Duration::from_secs(10), |p| p.is_none());
    let deleting = srv.delete::<Pod>(Some("default"), "h", None)?;
    assert!(deleting.is_some_and(|p| p.metadata.deletion_timestamp.is_some()));
    let (res, ()) = tokio::join!(waiter, async {
        tokio::task::yield_now().await;
        let _ = srv.delete::<Pod>(Some("default"), "h", Some(0));
    });
    assert!(res?.is_none());
    Ok(())
}

#[tokio::test]
async fn services_get_cluster_ips_and_keep_them() -> Result<()> {
    let srv = server().await?;
    let client = srv.client().await?;
    let all: Api<Service> = Api::all(client.clone());
    let listed = all.list(&ListParams::default()).await?.items;
    let names: Vec<_> = listed.iter().map(|s| (s.metadata.namespace.clone(), s.metadata.name.clone())).collect();
    assert_eq!(names, [(Some("default".to_string()), Some("kubernetes".to_string()))]);
    let k = listed[0].spec.clone().context("spec")?;
    assert_eq!(k.cluster_ip.as_deref(), Some("10.96.0.1"));
    let port = &k.ports.context("ports")?[0];
    assert_eq!((port.name.as_deref(), port.port), (Some("https"), 443));

    let svcs: Api<Service> = Api::default_namespaced(client);
    let web: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]},
    }))?;
    let web = svcs.create(&PostParams::default(), &web).await?;
    let spec = web.spec.clone().context("spec")?;
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.2"), "the lowest free address");
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    let ports = spec.ports.context("ports")?;
    assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
    assert_eq!(ports[0].target_port, Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(80)));

    // A taken address, a bad name, unnamed ports and a bad port number are 422s naming the field.
    let taken: Service = serde_json::from_value(json!({
        "metadata": {"name": "taken"}, "spec": {"clusterIP": "10.96.0.2", "ports": [{"port": 80}]},
    }))?;
    let e = api_err(svcs.create(&PostParams::default(), &taken).await);
    assert_eq!(e.code, 422);
    assert!(e.message.contains("provided IP is already allocated"), "{}", e.message);
    let bad: Service = serde_json::from_value(json!({
        "metadata": {"name": "1bad"}, "spec": {"ports": [{"port": 80}, {"port": 70000}]},
    }))?;
    let e = api_err(svcs.create(&PostParams::default(), &bad).await);
    assert_eq!(e.code, 422);
    for field in ["metadata.name", "spec.ports[1].name", "spec.ports[1].port"] {
        assert!(e.message.contains(field), "{field} in {}", e.message);
    }
    let headless: Service =
        serde_json::from_value(json!({"metadata": {"name": "headless"}, "spec": {"clusterIP": "None"}}))?;
    let headless = svcs.create(&PostParams::default(), &headless).await?;
    assert_eq!(headless.spec.and_then(|s| s.cluster_ip).as_deref(), Some("None"));

    // Updates keep the allocated address and cannot change it.
    let kept =
        svcs.patch("web", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}))).await?;
    assert_eq!(kept.spec.and_then(|s| s.cluster_ip).as_deref(), Some("10.96.0.2"));
    let e = api_err(
        svcs.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"clusterIP": "10.96.0.9"}}))).await,
    );
    assert_eq!(e.code, 422);
    assert!(e.message.contains("spec.clusterIPs[0]"), "{}", e.message);
    // A deleted service's address is free again.
    svcs.delete("web", &DeleteParams::default()).await?;
    let again: Service =
        serde_json::from_value(json!({"metadata": {"name": "again"}, "spec": {"ports": [{"port": 8080}]}}))?;
    let again = svcs.create(&PostParams::default(), &again).await?;
    assert_eq!(again.spec.and_then(|s| s.cluster_ip).as_deref(), Some("10.96.0.2"));
    Ok(())
}

#[tokio::test]
async fn resize_subresource_changes_only_resources_with_conflicts_and_generation() -> Result<()> {
    let srv = server().await?;
    let pods: Api<Pod> = Api::default_namespaced(srv.client().await?);
    let mut p = pod("r", Some("n1"));
    p.spec.as_mut().context("spec")?.containers[0].resources = Some(serde_json::from_value(
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}),
    )?);
    let created = pods.create(&PostParams::default(), &p).await?;
    assert_eq!(created.metadata.generation, Some(1));

    // JSON merge patch replaces the container list: only the resources are taken.
    let merge = json!({"metadata": {"labels": {"ignored": "yes"}}, "spec": {"containers": [
        {"name": "c", "image": "other", "resources": {"requests": {"cpu": "150m", "memory": "64Mi"}, "limits": {"cpu": "300m", "memory": "128Mi"}}}
    ]}});
    let resized = pods.patch_subresource("resize", "r", &PatchParams::default(), &Patch::Merge(merge)).await?;
    assert_eq!(resized.metadata.generation, Some(2));
    let ctr = &resized.spec.as_ref().context("spec")?.containers[0];
    assert_eq!(ctr.image.as_deref(), Some("busybox"));
    assert_eq!(serde_json::to_value(&ctr.resources)?["limits"]["cpu"], "300m");
    assert!(resized.metadata.labels.as_ref().is_some_and(|l| !l.contains_key("ignored")));
    // GET on the subresource is the pod.
    let got = pods.get_subresource("resize", "r").await?;
    assert_eq!(got.metadata.resource_version, resized.metadata.resource_version);

    // PUT with the stale object: 409.
    let e = api_err(pods.replace_subresource("resize", "r", &PostParams::default(), &created).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    // PUT with the current one, resized back: allowed, generation 3.
    let mut back = resized.clone();
    back.spec.as_mut().context("spec")?.containers[0].resources =
        created.spec.as_ref().context("spec")?.containers[0].resources.clone();
    let b = pods.replace_subresource("resize", "r", &PostParams::default(), &back).await?;
    assert_eq!(b.metadata.generation, Some(3));

    // Invalid: other resources; a QoS class change (strategic merge patch by name).
    let eph = json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"ephemeral-storage": "1Gi"}}}]}});
    let e = api_err(pods.patch_subresource("resize", "r", &PatchParams::default(), &Patch::Strategic(eph)).await);
    assert_eq!(e.code, 422);
    assert_eq!(e.message, "Pod \"r\" is invalid: spec: Forbidden: only cpu and memory resources are mutable");
    let guaranteed =
        json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "200m", "memory": "128Mi"}}}]}});
    let e =
        api_err(pods.patch_subresource("resize", "r", &PatchParams::default(), &Patch::Strategic(guaranteed)).await);
    assert_eq!(
        e.message,
        "Pod \"r\" is invalid: spec: Invalid value: \"Burstable\": Pod QOS Class may not change as a result of resizing"
    );
    // The main resource still refuses resource changes.
    let mut main = b.clone();
    main.spec.as_mut().context("spec")?.containers[0].resources =
        resized.spec.as_ref().context("spec")?.containers[0].resources.clone();
    assert_eq!(api_err(pods.replace("r", &PostParams::default(), &main).await).code, 422);
    Ok(())
}

#[tokio::test]
async fn ephemeral_containers_subresource_adds_debuggers_as_kubectl_debug_does() -> Result<()> {
    let srv = server().await?;
    let pods: Api<Pod> = Api::default_namespaced(srv.client().await?);
    let debugger = |name: &str| {
        json!({"name": name, "image": "busybox", "stdin": true, "tty": true,
               "terminationMessagePolicy": "File", "targetContainerName": "c"})
    };
    // Never on create.
    let mut with = serde_json::to_value(pod("d", Some("n1")))?;
    with["spec"]["ephemeralContainers"] = json!([debugger("early")]);
    let e = api_err(pods.create(&PostParams::default(), &serde_json::from_value(with)?).await);
    assert_eq!(e.code, 422);
    assert_eq!(e.message, "Pod \"d\" is invalid: spec.ephemeralContainers: Forbidden: cannot be set on create");
    let created = pods.create(&PostParams::default(), &pod("d", Some("n1"))).await?;
    let rv = created.metadata.resource_version.clone().context("rv")?;
    let mut w = pods.watch(&WatchParams::default().fields("metadata.name=d").timeout(30), &rv).await?.boxed();

    // kubectl debug: a strategic merge patch of the subresource adding one, merged by name;
    // anything else in the request is dropped.
    let patch =
        json!({"metadata": {"labels": {"ignored": "yes"}}, "spec": {"ephemeralContainers": [debugger("debug-1")]}});
    let added =
        pods.patch_subresource("ephemeralcontainers", "d", &PatchParams::default(), &Patch::Strategic(patch)).await?;
    assert_ne!(added.metadata.resource_version.as_deref(), Some(rv.as_str()));
    assert_eq!(added.metadata.generation, Some(2));
    assert!(added.metadata.labels.as_ref().is_some_and(|l| !l.contains_key("ignored")));
    let ec = &added.spec.as_ref().context("spec")?.ephemeral_containers.as_ref().context("ephemeral")?[0];
    assert_eq!((ec.name.as_str(), ec.target_container_name.as_deref()), ("debug-1", Some("c")));
    // Defaulted as the API server does.
    assert_eq!(ec.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(ec.termination_message_path.as_deref(), Some("/dev/termination-log"));
    match next_event(&mut w).await? {
        WatchEvent::Modified(p) => {
            assert_eq!(p.metadata.resource_version, added.metadata.resource_version);
            assert_eq!(p.spec.context("spec")?.ephemeral_containers.map(|l| l.len()), Some(1));
        }
        other => bail!("expected MODIFIED, got {other:?}"),
    }
    // GET on the subresource is the pod.
    let got = pods.get_subresource("ephemeralcontainers", "d").await?;
    assert_eq!(got.metadata.resource_version, added.metadata.resource_version);

    // PUT: a stale object is a conflict; the current one with a second debugger is fine.
    let mut second = added.clone();
    let list = second.spec.as_mut().context("spec")?.ephemeral_containers.as_mut().context("list")?;
    list.push(serde_json::from_value(debugger("debug-2"))?);
    let mut stale = second.clone();
    stale.metadata.resource_version = created.metadata.resource_version.clone();
    let e = api_err(pods.replace_subresource("ephemeralcontainers", "d", &PostParams::default(), &stale).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    let two = pods.replace_subresource("ephemeralcontainers", "d", &PostParams::default(), &second).await?;
    assert_eq!(two.spec.as_ref().context("spec")?.ephemeral_containers.as_ref().map(Vec::len), Some(2));

    // Refused: changing or removing one, a target that is no container, forbidden fields.
    let ssp = |v: serde_json::Value| Patch::Strategic(v);
    let changed = json!({"spec": {"ephemeralContainers": [{"name": "debug-1", "image": "nginx"}]}});
    let e = api_err(pods.patch_subresource("ephemeralcontainers", "d", &PatchParams::default(), &ssp(changed)).await);
    assert_eq!(e.code, 422);
    assert!(
        e.message.starts_with(
            "Pod \"d\" is invalid: spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debug-1\" may not be changed"
        ),
        "{}",
        e.message
    );
    let removed = json!({"spec": {"ephemeralContainers": [debugger("debug-2")]}});
    let e = api_err(
        pods.patch_subresource("ephemeralcontainers", "d", &PatchParams::default(), &Patch::Merge(removed)).await,
    );
    assert!(e.message.contains("existing ephemeral containers \"debug-1\" may not be removed"), "{}", e.message);
    let mut bad = debugger("debug-3");
    bad["targetContainerName"] = json!("nope");
    bad["ports"] = json!([{"containerPort": 80}]);
    let e = api_err(
        pods.patch_subresource(
            "ephemeralcontainers",
            "d",
            &PatchParams::default(),
            &ssp(json!({"spec": {"ephemeralContainers": [bad]}})),
        )
        .await,
    );
    assert_eq!(
        e.message,
        "Pod \"d\" is invalid: [spec.ephemeralContainers[2].targetContainerName: Not found: \"nope\", \
         spec.ephemeralContainers[2].ports: Forbidden: cannot be set for an Ephemeral Container]"
    );
    let causes = e.details.context("details")?.causes;
    assert_eq!(causes[0].reason, "FieldValueNotFound");
    assert_eq!(causes[0].field, "spec.ephemeralContainers[2].targetContainerName");
    let dup = json!({"spec": {"ephemeralContainers": [debugger("c")]}});
    let e = api_err(pods.patch_subresource("ephemeralcontainers", "d", &PatchParams::default(), &ssp(dup)).await);
    assert_eq!(e.message, "Pod \"d\" is invalid: spec.ephemeralContainers[2].name: Duplicate value: \"c\"");

    // The main resource cannot change them; an unknown pod is a 404 naming it.
    let mut main = pods.get("d").await?;
    main.spec.as_mut().context("spec")?.ephemeral_containers.as_mut().context("list")?[0].image = Some("x".into());
    assert_eq!(api_err(pods.replace("d", &PostParams::default(), &main).await).code, 422);
    let e = api_err(pods.get_subresource("ephemeralcontainers", "nope").await);
    assert_eq!((e.code, e.details.map(|d| d.name)), (404, Some("nope".into())));
    Ok(())
}

mod certificates {
    //! Client-certificate authentication, `CertificateSigningRequests` and the stand-in
    //! CSR controllers.

    use std::time::{Duration, SystemTime};

    use anyhow::{Context as _, Result};
    use base64::Engine as _;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
    use serde_json::{Value, json};

    use super::api_err;
    use crate::apiserver::{CsrController, Options, TestApiServer, UserInfo};

    async fn tls_server() -> Result<TestApiServer> {
        Ok(TestApiServer::start(Options { tls: true, ..Options::default() }).await?)
    }

    /// A PEM CSR (one organization at most: rcgen's subjects) and its key.
    fn csr_pem(cn: &str, org: Option<&str>, sans: &[&str]) -> Result<(String, rcgen::KeyPair)> {
        let key = rcgen::KeyPair::generate()?;
        let mut p = rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_string()).collect::<Vec<_>>())?;
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        if let Some(o) = org {
            p.distinguished_name.push(rcgen::DnType::OrganizationName, o);
        }
        Ok((p.serialize_request(&key)?.pem()?, key))
    }

    fn csr(name: &str, request_pem: &str, signer: &str, usages: &[&str]) -> Value {
        json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(request_pem),
                "signerName": signer,
                "usages": usages,
            },
        })
    }

    fn typed(v: Value) -> Result<CertificateSigningRequest> {
        Ok(serde_json::from_value(v)?)
    }

    fn condition_types(c: &CertificateSigningRequest) -> Vec<(String, String)> {
        c.status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .map(|c| (c.type_.clone(), c.reason.clone().unwrap_or_default()))
            .collect()
    }

    /// `SelfSubjectReview` of the client's user: (username, groups).
    async fn whoami(client: &kube::Client) -> Result<(String, Vec<String>)> {
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
        let req = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?)?;
        let out: Value = client.request(req).await?;
        let u = &out["status"]["userInfo"];
        let groups = u["groups"].as_array().context("groups")?.iter().filter_map(|g| g.as_str().map(String::from));
        Ok((u["username"].as_str().unwrap_or("").to_string(), groups.collect()))
    }

    fn field_causes(s: &kube::core::Status) -> Vec<String> {
        s.details.iter().flat_map(|d| d.causes.iter()).map(|c| c.field.clone()).collect()
    }

    #[tokio::test]
    async fn client_certificates_authenticate_as_subject() -> Result<()> {
        let srv = tls_server().await?;
        let (cert, key) = srv.issue_client_cert("alice", &["dev", "ops"], Duration::from_hours(1))?;
        let client = srv.client_with_cert(&cert, &key).await?;
        let nss: Api<Namespace> = Api::all(client.clone());
        assert_eq!(nss.list(&ListParams::default()).await?.items.len(), 4);
        assert_eq!(srv.requests().last().and_then(|r| r.user.clone()).as_deref(), Some("alice"));
        let (user, groups) = whoami(&client).await?;
        assert_eq!(user, "alice");
        assert_eq!(groups, ["dev", "ops", "system:authenticated"]);

        // Refused with 401: another CA's certificate, an expired one, one not yet valid.
        let other = tls_server().await?;
        let now = SystemTime::now();
        let hour = Duration::from_hours(1);
        let refused = [
            other.issue_client_cert("alice", &[], hour)?,
            srv.issue_client_cert_between("alice", &[], now - 2 * hour, now - hour)?,
            srv.issue_client_cert_between("alice", &[], now + hour, now + 2 * hour)?,
        ];
        for (cert, key) in refused {
            let pods: Api<Pod> = Api::default_namespaced(srv.client_with_cert(&cert, &key).await?);
            let s = api_err(pods.list(&ListParams::default()).await);
            assert_eq!((s.code, s.reason.as_str()), (401, "Unauthorized"));
        }
        // The bearer token of a bootstrap kubeconfig still works alongside.
        srv.add_token("bootstrap", UserInfo::new("system:bootstrap:abcdef", &["system:bootstrappers"]));
        let dir = tempfile::tempdir()?;
        let path = srv.write_kubeconfig_with_token(dir.path(), "bootstrap-kubeconfig", "bootstrap")?;
        assert_eq!(path, dir.path().join("bootstrap-kubeconfig"));
        let kc = kube::config::Kubeconfig::read_from(&path)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
        let (user, _) = whoami(&kube::Client::try_from(cfg)?).await?;
        assert_eq!(user, "system:bootstrap:abcdef");
        Ok(())
    }

    #[tokio::test]
    async fn csr_create_validation_and_subresources() -> Result<()> {
        let srv = tls_server().await?;
        let csrs: Api<CertificateSigningRequest> = Api::all(srv.client().await?);
        let (pem, _) = csr_pem("system:node:n1", Some("system:nodes"), &[])?;
        let mut body = csr("c1", &pem, "example.com/signer", &["client auth"]);
        body["spec"]["username"] = json!("mallory");
        body["status"] = json!({"conditions": [{"type": "Approved", "status": "True"}]});
        let created = csrs.create(&PostParams::default(), &typed(body)?).await?;
        assert_eq!(created.spec.username.as_deref(), Some("admin"));
        assert_eq!(
            created.spec.groups.as_deref(),
            Some(&["system:masters".to_string(), "system:authenticated".to_string()][..])
        );
        assert!(condition_types(&created).is_empty());

        // Invalid requests name their field.
        let cases = [
            (csr("bad", "not a csr", "example.com/s", &["client auth"]), "spec.request"),
            (csr("bad", &pem, "example.com/s", &[]), "spec.usages"),
            (csr("bad", &pem, "example.com/s", &["flying"]), "spec.usages[0]"),
            (csr("bad", &pem, "", &["client auth"]), "spec.signerName"),
            (csr("bad", &pem, "nodomain", &["client auth"]), "spec.signerName"),
        ];
        for (body, field) in cases {
            let s = api_err(csrs.create(&PostParams::default(), &typed(body)?).await);
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{field}: {s:?}");
            assert_eq!(field_causes(&s), [field]);
        }
        let mut short = csr("bad", &pem, "example.com/s", &["client auth"]);
        short["spec"]["expirationSeconds"] = json!(300);
        let s = api_err(csrs.create(&PostParams::default(), &typed(short)?).await);
        assert_eq!((s.code, field_causes(&s)), (422, vec!["spec.expirationSeconds".to_string()]));

        // The main resource keeps spec and status; metadata changes.
        let pp = PatchParams::default();
        let p = json!({"metadata": {"labels": {"a": "b"}}, "spec": {"usages": ["server auth"]},
                       "status": {"conditions": [{"type": "Approved", "status": "True"}]}});
        let u = csrs.patch("c1", &pp, &Patch::Merge(&p)).await?;
        assert_eq!(u.spec.usages.as_deref(), Some(&["client auth".to_string()][..]));
        assert!(condition_types(&u).is_empty());
        assert_eq!(u.metadata.labels.and_then(|l| l.get("a").cloned()).as_deref(), Some("b"));

        // /status may not approve.
        let approve = json!({"status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Test"}]}});
        let s = api_err(csrs.patch_status("c1", &pp, &Patch::Merge(&approve)).await);
        assert_eq!((s.code, field_causes(&s)), (422, vec!["status.conditions".to_string()]));
        // /approval changes only the conditions, with time stamps.
        let mut with_more = approve.clone();
        with_more["spec"] = json!({"signerName": "example.com/other"});
        with_more["status"]["certificate"] = json!("Zm9v");
        let a = csrs.patch_subresource("approval", "c1", &pp, &Patch::Merge(&with_more)).await?;
        assert_eq!(condition_types(&a), [("Approved".to_string(), "Test".to_string())]);
        assert_eq!(a.spec.signer_name, "example.com/signer");
        let st = a.status.as_ref().context("status")?;
        assert!(st.certificate.is_none());
        let cond = &st.conditions.as_ref().context("conditions")?[0];
        assert!(cond.last_update_time.is_some() && cond.last_transition_time.is_some());
        // Approved and Denied exclude each other; the approval cannot be taken back.
        let deny = json!({"status": {"conditions": [
            {"type": "Approved", "status": "True", "reason": "Test"}, {"type": "Denied", "status": "True"}]}});
        let s = api_err(csrs.patch_subresource("approval", "c1", &pp, &Patch::Merge(&deny)).await);
        assert_eq!((s.code, field_causes(&s)), (422, vec!["status.conditions[1].type".to_string()]));
        let s = api_err(
            csrs.patch_subresource("approval", "c1", &pp, &Patch::Merge(&json!({"status": {"conditions": []}}))).await,
        );
        assert_eq!(s.code, 422);
        // /status sets the certificate (a real one) once, and keeps the approval.
        let bogus = json!({"status": {"certificate": "Zm9v"}});
        let s = api_err(csrs.patch_status("c1", &pp, &Patch::Merge(&bogus)).await);
        assert_eq!((s.code, field_causes(&s)), (422, vec!["status.certificate".to_string()]));
        let (cert, _) = srv.issue_client_cert("x", &[], Duration::from_hours(1))?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&cert);
        let issued = json!({"status": {"certificate": b64, "conditions": [
            {"type": "Approved", "status": "True", "reason": "Changed"}]}});
        let st = csrs.patch_status("c1", &pp, &Patch::Merge(&issued)).await?;
        assert_eq!(condition_types(&st), [("Approved".to_string(), "Test".to_string())]);
        assert_eq!(srv.csr_pem_certificate("c1").as_deref(), Some(cert.as_str()));
        let (other, _) = srv.issue_client_cert("y", &[], Duration::from_hours(1))?;
        let again = json!({"status": {"certificate": base64::engine::general_purpose::STANDARD.encode(other)}});
        let s = api_err(csrs.patch_status("c1", &pp, &Patch::Merge(&again)).await);
        assert_eq!((s.code, field_causes(&s)), (422, vec!["status.certificate".to_string()]));

        // Field selectors, discovery.
        let by_name = csrs.list(&ListParams::default().fields("metadata.name=c1")).await?;
        assert_eq!(by_name.items.len(), 1);
        let by_signer = csrs.list(&ListParams::default().fields("spec.signerName=example.com/nope")).await?;
        assert!(by_signer.items.is_empty());
        let discovery = kube::Discovery::new(srv.client().await?).run().await?;
        assert!(discovery.has_group("certificates.k8s.io"));
        Ok(())
    }

    #[tokio::test]
    async fn csr_controller_approves_signs_fails_and_denies() -> Result<()> {
        let srv = TestApiServer::start(Options {
            tls: true,
            csr_controller: CsrController::ApproveAndSign { duration: Duration::from_hours(24) },
            ..Options::default()
        })
        .await?;
        srv.add_token("bootstrap", UserInfo::new("system:bootstrap:abcdef", &["system:bootstrappers"]));
        let dir = tempfile::tempdir()?;
        let path = srv.write_kubeconfig_with_token(dir.path(), "bootstrap-kubeconfig", "bootstrap")?;
        let kc = kube::config::Kubeconfig::read_from(&path)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
        let csrs: Api<CertificateSigningRequest> = Api::all(kube::Client::try_from(cfg)?);
        let pp = PostParams::default();
        let wait = Duration::from_secs(10);

        // Another signer's CSR stays pending.
        let (pem, _) = csr_pem("someone", None, &[])?;
        csrs.create(&pp, &typed(csr("other", &pem, "example.com/signer", &["client auth"]))?).await?;

        // A kubelet client CSR is approved and signed.
        let (pem, key) = csr_pem("system:node:n1", Some("system:nodes"), &[])?;
        let mut body = csr(
            "node-n1",
            &pem,
            super::super::certificates::KUBELET_CLIENT_SIGNER,
            &["digital signature", "client auth"],
        );
        body["spec"]["expirationSeconds"] = json!(3600);
        let created = csrs.create(&pp, &typed(body)?).await?;
        assert_eq!(created.spec.username.as_deref(), Some("system:bootstrap:abcdef"));
        let signed = srv
            .wait_for::<CertificateSigningRequest>(None, "node-n1", wait, |c| {
                c.and_then(|c| c.status.as_ref()).is_some_and(|s| s.certificate.is_some())
            })
            .await?
            .context("signed")?;
        assert_eq!(condition_types(&signed), [("Approved".to_string(), "AutoApproved".to_string())]);
        let cert_pem = srv.csr_pem_certificate("node-n1").context("certificate")?;
        let (_, pem_block) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())?;
        let (_, cert) = x509_parser::parse_x509_certificate(&pem_block.contents)?;
        let subject = cert.subject();
        let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| a.as_str().unwrap_or("").to_string();
        assert_eq!(subject.iter_common_name().map(text).collect::<Vec<_>>(), ["system:node:n1"]);
        assert_eq!(subject.iter_organization().map(text).collect::<Vec<_>>(), ["system:nodes"]);
        let now = jiff::Timestamp::now().as_second();
        let (nb, na) = (cert.validity().not_before.timestamp(), cert.validity().not_after.timestamp());
        // Backdated 5 minutes; short-lived (below 8 h): NotAfter = now + expirationSeconds.
        assert!((now - 300 - 5..=now - 300).contains(&nb), "not before {nb}, now {now}");
        assert!((now + 3600 - 5..=now + 3600).contains(&na), "not after {na}, now {now}");
        let eku = cert.extended_key_usage()?.context("EKU")?.value;
        assert!(eku.client_auth && !eku.server_auth);
        assert!(cert.key_usage()?.context("key usage")?.value.digital_signature());
        let issuer_ok = cert.issuer().iter_common_name().map(text).any(|cn| cn == "swiftlet-test-apiserver-ca");
        assert!(issuer_ok);

        // The issued certificate authenticates as the node.
        let node_client = srv.client_with_cert(&cert_pem, &key.serialize_pem()).await?;
        let (user, groups) = whoami(&node_client).await?;
        assert_eq!(user, "system:node:n1");
        assert!(groups.contains(&"system:nodes".to_string()));

        // A CSR that breaks the signer's rules is approved, then Failed.
        let (pem, _) = csr_pem("bob", Some("system:nodes"), &[])?;
        csrs.create(
            &pp,
            &typed(csr(
                "bad",
                &pem,
                super::super::certificates::KUBELET_CLIENT_SIGNER,
                &["digital signature", "client auth"],
            ))?,
        )
        .await?;
        let failed = srv
            .wait_for::<CertificateSigningRequest>(None, "bad", wait, |c| {
                c.is_some_and(|c| condition_types(c).iter().any(|(t, _)| t == "Failed"))
            })
            .await?
            .context("failed")?;
        assert_eq!(
            condition_types(&failed),
            [
                ("Approved".to_string(), "AutoApproved".to_string()),
                ("Failed".to_string(), "SignerValidationFailure".to_string())
            ]
        );
        assert!(failed.status.as_ref().and_then(|s| s.certificate.as_ref()).is_none());
        // A serving CSR without a SAN fails too.
        let (pem, _) = csr_pem("system:node:n1", Some("system:nodes"), &[])?;
        csrs.create(
            &pp,
            &typed(csr(
                "serving",
                &pem,
                super::super::certificates::KUBELET_SERVING_SIGNER,
                &["digital signature", "server auth"],
            ))?,
        )
        .await?;
        srv.wait_for::<CertificateSigningRequest>(None, "serving", wait, |c| {
            c.is_some_and(|c| condition_types(c).iter().any(|(t, _)| t == "Failed"))
        })
        .await?;
        let other: CertificateSigningRequest = srv.get(None, "other").context("other")?;
        assert!(condition_types(&other).is_empty());

        // Deny: every pending CSR, the other signer's included.
        srv.set_csr_controller(CsrController::Deny { reason: "NoWay".into(), message: "denied by test".into() });
        let denied = srv
            .wait_for::<CertificateSigningRequest>(None, "other", wait, |c| {
                !c.is_none_or(|c| condition_types(c).is_empty())
            })
            .await?
            .context("denied")?;
        assert_eq!(condition_types(&denied), [("Denied".to_string(), "NoWay".to_string())]);
        let (pem, _) = csr_pem("system:node:n2", Some("system:nodes"), &[])?;
        csrs.create(
            &pp,
            &typed(csr(
                "node-n2",
                &pem,
                super::super::certificates::KUBELET_CLIENT_SIGNER,
                &["digital signature", "client auth"],
            ))?,
        )
        .await?;
        let n2 = srv
            .wait_for::<CertificateSigningRequest>(None, "node-n2", wait, |c| {
                !c.is_none_or(|c| condition_types(c).is_empty())
            })
            .await?
            .context("n2")?;
        assert_eq!(condition_types(&n2), [("Denied".to_string(), "NoWay".to_string())]);
        Ok(())
    }
}
