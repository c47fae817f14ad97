//! Trace export end to end: spans made by this module's constructors go through the real
//! OTLP exporter to an in-test gRPC receiver on 127.0.0.1.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::test_collector::{ExportedSpan, TestCollector, flush, pipeline, pipeline_to, subscriber};
use super::*;

fn web_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-1"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap()
}

fn string(s: &str) -> Value {
    Value::StringValue(s.to_owned())
}

fn named<'a>(spans: &'a [ExportedSpan], name: &str) -> &'a ExportedSpan {
    spans.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no span {name:?} in {spans:#?}"))
}

/// The `traceparent` the CRI client would send from inside the current span.
fn traceparent() -> Option<String> {
    let mut metadata = tonic::metadata::MetadataMap::new();
    inject_trace_context(&mut metadata);
    metadata.get("traceparent").map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_pod_and_cri_spans_reach_the_collector_as_upstream_names_them() {
    let (collector, addr) = TestCollector::start().await;
    let telemetry = pipeline(addr, 1_000_000);
    let pod = web_pod();
    let sent_traceparent;
    {
        let _subscriber = tracing::subscriber::set_default(subscriber(&telemetry));
        // A log-only span around it (the pod worker's) is not part of the trace.
        let worker = tracing::info_span!("pod_worker", pod_uid = "uid-1");
        let _worker = worker.enter();
        let sync = sync_pod_span("uid-1", Some(&pod), "create");
        let _sync = sync.enter();
        {
            let run = cri_span("runtime.v1.RuntimeService/RunPodSandbox");
            let _run = run.enter();
            sent_traceparent = traceparent();
            record_grpc_status(&run, tonic::Code::Ok, "");
        }
        let pull = cri_span("runtime.v1.ImageService/PullImage");
        record_grpc_status(&pull, tonic::Code::Unavailable, "connection refused");
    }
    flush(&telemetry);
    let spans = collector.wait_for(3).await;
    assert_eq!(spans.len(), 3, "{spans:#?}");

    let sync = named(&spans, "syncPod");
    assert_eq!(sync.parent_span_id, "", "syncPod is a root span");
    assert_eq!(sync.kind, 1, "internal");
    let want: BTreeMap<String, Value> = [
        ("k8s.pod.uid", "uid-1"),
        ("k8s.pod", "default/web"),
        ("k8s.pod.name", "web"),
        ("k8s.namespace.name", "default"),
        ("k8s.pod.update_type", "create"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), string(v)))
    .collect();
    assert_eq!(sync.attributes, want);
    assert_eq!(sync.resource.get("service.name"), Some(&string("kubelet")));
    assert_eq!(sync.resource.get("host.name"), Some(&string("node-1")));
    assert_eq!(sync.scope, "k8s.io/kubernetes/pkg/kubelet");

    let run = named(&spans, "runtime.v1.RuntimeService/RunPodSandbox");
    assert_eq!((run.trace_id.as_str(), run.parent_span_id.as_str()), (sync.trace_id.as_str(), sync.span_id.as_str()));
    assert_eq!(run.kind, 3, "client");
    let want: BTreeMap<String, Value> = [
        ("rpc.system", string("grpc")),
        ("rpc.service", string("runtime.v1.RuntimeService")),
        ("rpc.method", string("RunPodSandbox")),
        ("rpc.grpc.status_code", Value::IntValue(0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(run.attributes, want);
    assert_eq!(run.status.0, 0, "unset on success, as otelgrpc");
    // The runtime is told which span made the call.
    assert_eq!(sent_traceparent, Some(format!("00-{}-{}-01", run.trace_id, run.span_id)));

    let pull = named(&spans, "runtime.v1.ImageService/PullImage");
    assert_eq!(pull.parent_span_id, sync.span_id);
    assert_eq!(pull.attributes["rpc.service"], string("runtime.v1.ImageService"));
    assert_eq!(pull.attributes["rpc.grpc.status_code"], Value::IntValue(14));
    assert_eq!(pull.status, (2, "connection refused".to_owned()), "error status with the message");

    tokio::task::block_in_place(|| telemetry.shutdown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_rate_zero_exports_only_what_a_sampled_parent_asks_for() {
    let (collector, addr) = TestCollector::start().await;
    let telemetry = pipeline(addr, 0);
    let pod = web_pod();
    {
        let _subscriber = tracing::subscriber::set_default(subscriber(&telemetry));
        let sync = sync_pod_span("uid-1", Some(&pod), "sync");
        let _sync = sync.enter();
        let call = cri_span("runtime.v1.RuntimeService/ListContainers");
        let _call = call.enter();
        // Unsampled, but the context still travels (flags 00), as otelgrpc sends it.
        let sent = traceparent().expect("a traceparent");
        assert!(sent.ends_with("-00"), "{sent}");
    }
    flush(&telemetry);
    assert_eq!(collector.spans(), [], "nothing is sampled at rate 0");

    // A remote parent that is sampled is followed (parent-based sampling).
    let trace_id = TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap();
    let parent_id = SpanId::from_hex("b7ad6b7169203331").unwrap();
    {
        let _subscriber = tracing::subscriber::set_default(subscriber(&telemetry));
        let remote = SpanContext::new(trace_id, parent_id, TraceFlags::SAMPLED, true, TraceState::default());
        let sync = sync_terminating_pod_span("uid-1", Some(&pod));
        let _ = sync.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
        drop(sync);
    }
    flush(&telemetry);
    let spans = collector.wait_for(1).await;
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(spans[0].name, "syncTerminatingPod");
    assert_eq!(
        (spans[0].trace_id.as_str(), spans[0].parent_span_id.as_str()),
        ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    );
    assert!(!spans[0].attributes.contains_key("k8s.pod.update_type"));
    tokio::task::block_in_place(|| telemetry.shutdown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_pod_span_has_its_uid_only() {
    let (collector, addr) = TestCollector::start().await;
    let telemetry = pipeline(addr, 1_000_000);
    {
        let _subscriber = tracing::subscriber::set_default(subscriber(&telemetry));
        drop(sync_terminated_pod_span("uid-9", None));
    }
    flush(&telemetry);
    let spans = collector.wait_for(1).await;
    assert_eq!(spans[0].name, "syncTerminatedPod");
    assert_eq!(spans[0].attributes, BTreeMap::from([("k8s.pod.uid".to_owned(), string("uid-9"))]));
    tokio::task::block_in_place(|| telemetry.shutdown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_endpoints_are_dialled() {
    use std::os::linux::net::SocketAddrExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("otel.sock");
    let file = TestCollector::start_on_unix(tokio::net::UnixListener::bind(&path).unwrap());
    let name = format!("swiftlet-test-otel-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let abstract_ = TestCollector::start_on_unix(tokio::net::UnixListener::from_std(listener).unwrap());
    for (endpoint, collector) in
        [(format!("unix://{}", path.display()), file), (format!("unix-abstract://{name}"), abstract_)]
    {
        let telemetry = pipeline_to(&endpoint, 1_000_000);
        {
            let _subscriber = tracing::subscriber::set_default(subscriber(&telemetry));
            drop(sync_pod_span("uid-1", None, "create"));
        }
        flush(&telemetry);
        assert_eq!(collector.wait_for(1).await[0].name, "syncPod", "{endpoint}");
        tokio::task::block_in_place(|| telemetry.shutdown());
    }
}

#[tokio::test]
async fn an_https_endpoint_gets_tls_without_connecting() {
    let telemetry = pipeline_to("https://collector.invalid:4317", 1_000_000);
    assert!(telemetry.tracing_enabled());
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await.unwrap();
}

#[tokio::test]
async fn without_tracing_nothing_is_recorded_or_sent() {
    let telemetry = Telemetry::default();
    assert!(!telemetry.tracing_enabled());
    let _subscriber = tracing::subscriber::set_default(subscriber(&telemetry));
    let sync = sync_pod_span("uid-1", None, "sync");
    let _sync = sync.enter();
    assert_eq!(traceparent(), None);
    telemetry.shutdown();
}

#[tokio::test]
async fn a_collector_that_is_down_costs_nothing() {
    // Nothing listens on this port: building works, spans are dropped after the export
    // fails, and shutdown returns within its bound.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let telemetry = pipeline(([127, 0, 0, 1], port).into(), 1_000_000);
    {
        let _subscriber = tracing::subscriber::set_default(subscriber(&telemetry));
        drop(sync_pod_span("uid-1", None, "sync"));
    }
    let start = std::time::Instant::now();
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await.unwrap();
    assert!(start.elapsed() < SHUTDOWN_TIMEOUT + Duration::from_secs(2), "{:?}", start.elapsed());
}

/// A `MakeWriter` into a shared buffer.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_keep_their_context_but_not_the_trace_spans() {
    let (collector, addr) = TestCollector::start().await;
    let telemetry = pipeline(addr, 1_000_000);
    let logs = Captured::default();
    let writer = logs.clone();
    {
        let agent = super::subscriber(EnvFilter::new("info"), false, false, move || writer.clone(), &telemetry);
        let _subscriber = tracing::subscriber::set_default(agent);
        let worker = tracing::info_span!("pod_worker", pod_uid = "uid-1");
        let _worker = worker.enter();
        let sync = sync_pod_span("uid-1", Some(&web_pod()), "sync");
        let _sync = sync.enter();
        let call = cri_span("runtime.v1.RuntimeService/ListContainers");
        let _call = call.enter();
        tracing::info!("inside a CRI call");
    }
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("pod_worker{pod_uid=\"uid-1\"}: "), "{text}");
    assert!(text.contains("inside a CRI call"), "{text}");
    assert!(!text.contains("syncPod") && !text.contains("rpc.") && !text.contains("k8s.pod"), "{text}");
    // ...while the same spans are exported.
    flush(&telemetry);
    let spans = collector.wait_for(2).await;
    assert_eq!(
        named(&spans, "runtime.v1.RuntimeService/ListContainers").parent_span_id,
        named(&spans, "syncPod").span_id
    );
    tokio::task::block_in_place(|| telemetry.shutdown());
}

#[test]
fn verbosity_levels() {
    assert_eq!(filter_for_verbosity(0), "info");
    assert!(filter_for_verbosity(4).contains("swiftlet=debug"));
    assert!(filter_for_verbosity(9).contains("trace"));
}
