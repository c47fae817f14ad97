//! An OTLP gRPC trace receiver for tests (`opentelemetry.proto.collector.trace.v1.TraceService/Export`
//! on 127.0.0.1), and a pipeline that exports to it: what the real exporter sends, decoded
//! back into [`ExportedSpan`]s.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::KeyValue;
/// An attribute value as received.
pub use opentelemetry_proto::tonic::common::v1::any_value::Value;
#[cfg(test)]
use tracing_subscriber::layer::SubscriberExt as _;

#[cfg(test)]
use super::{CollectorEndpoint, Telemetry, TracingSettings};

/// One received span, with its resource and scope.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportedSpan {
    pub name: String,
    /// Lowercase hex, as in `traceparent`.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// `SpanKind` (1 internal, 3 client).
    pub kind: i32,
    pub attributes: BTreeMap<String, Value>,
    /// `StatusCode` (0 unset, 1 ok, 2 error) and message.
    pub status: (i32, String),
    pub resource: BTreeMap<String, Value>,
    pub scope: String,
    /// Span events: name and attributes, in order.
    pub events: Vec<(String, BTreeMap<String, Value>)>,
}

/// The receiver: every span of every export, in arrival order.
#[derive(Debug, Clone, Default)]
pub struct TestCollector {
    spans: Arc<Mutex<Vec<ExportedSpan>>>,
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, Value> {
    list.iter().filter_map(|kv| Some((kv.key.clone(), kv.value.as_ref()?.value.clone()?))).collect()
}

#[tonic::async_trait]
impl TraceService for TestCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let resource = attributes(resource_spans.resource.as_ref().map_or(&[], |r| &r.attributes));
            for scope_spans in resource_spans.scope_spans {
                let scope = scope_spans.scope.as_ref().map(|s| s.name.clone()).unwrap_or_default();
                for span in scope_spans.spans {
                    received.push(ExportedSpan {
                        name: span.name,
                        trace_id: hex::encode(span.trace_id),
                        span_id: hex::encode(span.span_id),
                        parent_span_id: hex::encode(span.parent_span_id),
                        kind: span.kind,
                        attributes: attributes(&span.attributes),
                        status: span.status.map(|s| (s.code, s.message)).unwrap_or_default(),
                        resource: resource.clone(),
                        scope: scope.clone(),
                        events: span.events.iter().map(|e| (e.name.clone(), attributes(&e.attributes))).collect(),
                    });
                }
            }
        }
        self.spans.lock().unwrap().extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl TestCollector {
    /// Serves on an ephemeral port of 127.0.0.1 until the runtime ends.
    pub async fn start() -> (Self, SocketAddr) {
        let collector = Self::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector.clone()))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (collector, addr)
    }

    /// Serves on the unix socket `listener` until the runtime ends.
    pub fn start_on_unix(listener: tokio::net::UnixListener) -> Self {
        let collector = Self::default();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector.clone()))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        collector
    }

    /// What has arrived so far.
    #[must_use]
    pub fn spans(&self) -> Vec<ExportedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits (up to 10 s) until at least `n` spans arrived; returns them all.
    pub async fn wait_for(&self, n: usize) -> Vec<ExportedSpan> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.spans();
            if spans.len() >= n {
                return spans;
            }
            assert!(tokio::time::Instant::now() < deadline, "{} of {n} spans arrived: {spans:#?}", spans.len());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A pipeline exporting to `addr` (as `host:port`, the upstream form) with `rate` per
/// million, for node `node-1`.
#[cfg(test)]
pub(crate) fn pipeline(addr: SocketAddr, rate: u32) -> Telemetry {
    pipeline_to(&addr.to_string(), rate)
}

/// A pipeline exporting to `endpoint` (any `tracing.endpoint` form).
#[cfg(test)]
pub(crate) fn pipeline_to(endpoint: &str, rate: u32) -> Telemetry {
    let settings = TracingSettings {
        endpoint: CollectorEndpoint::parse(endpoint).unwrap(),
        sampling_rate_per_million: rate,
        node_name: "node-1".to_owned(),
    };
    Telemetry::exporting(&settings).unwrap()
}

/// A subscriber with only the trace layer of `telemetry` (install with
/// `tracing::subscriber::set_default` on the thread that makes the spans).
#[cfg(test)]
pub(crate) fn subscriber(telemetry: &Telemetry) -> impl tracing::Subscriber + Send + Sync + use<> {
    tracing_subscriber::registry().with(telemetry.layer())
}

/// Exports what is queued (blocking; the collector runs on the other worker threads).
#[cfg(test)]
pub(crate) fn flush(telemetry: &Telemetry) {
    tokio::task::block_in_place(|| telemetry.flush());
}
