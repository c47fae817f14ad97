//! The HTTPS API with every endpoint, and its serving certificate (`serverTLSBootstrap`).

use std::sync::Arc;

use axum::Json;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::adapters::{PlegHealth, PodsView};
use super::api_clients::{Api, ApiClients};
use super::pods::Pods;
use super::stats_handlers::{StatsState, cadvisor_handler, resource_metrics_handler, summary_handler};
use super::{Base, Error, Task, task};
use crate::config::Config;
use crate::events::MemoryRecorder;
use crate::server::{Endpoints, Server, ServerSettings};

/// The HTTPS API, the read-only port and `/healthz`, with every endpoint.
#[expect(clippy::too_many_arguments, reason = "one step of build, given what the steps before made")]
pub(super) fn server(
    base: &Base,
    api: Option<&Api>,
    pods: &Pods,
    registry: Registry,
    pleg_health: &Arc<PlegHealth>,
    memory_events: &MemoryRecorder,
    stats: &StatsState,
    configz: serde_json::Value,
    serving_slot: Option<crate::server::ServingSlot>,
) -> Result<Server, Error> {
    let Base { cfg, rt, metrics, .. } = base;
    let events_view = memory_events.clone();
    let endpoints =
        Endpoints::new(
            Arc::new(PodsView { manager: pods.pod_manager.clone(), status: pods.status.clone() }),
            Arc::new(registry),
        )
        .health_check(pleg_health.clone())
        .http_metrics(metrics.http.clone())
        .metrics_endpoint("/metrics/probes", pods.prober_metrics.registry())
        .route(
            "/events",
            get(move || {
                let items = events_view.list();
                async move {
                    Json(serde_json::json!({"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items}))
                }
            }),
        )
        .debugging_handlers(crate::settings::debugging_handlers(rt.clone(), &cfg.kubelet))
        .route("/stats/summary", get(summary_handler).with_state(stats.clone()))
        .route("/metrics/resource", get(resource_metrics_handler).with_state(stats.clone()))
        .route("/metrics/cadvisor", get(cadvisor_handler).with_state(stats.clone()));
    // Webhook authentication and authorization ask the API server (TokenReview,
    // SubjectAccessReview); standalone, the server refuses those settings.
    let endpoints = match api {
        Some(a) => endpoints.api_client(a.clients.main.clone()),
        None => endpoints,
    };
    let mut server_settings = ServerSettings { configz, ..crate::settings::server(cfg)? };
    server_settings.tls.bootstrap = serving_slot;
    Ok(Server::new(server_settings, endpoints)?)
}

/// `serverTLSBootstrap`: the serving certificate manager (signer
/// `kubernetes.io/kubelet-serving`, the names of the node's `addresses` as last
/// reported), which requests through the main client, and the slot through which the
/// HTTPS API serves its pair. A valid pair from an earlier run is served at once; without
/// one, handshakes fail until the first certificate is issued (upstream likewise).
pub(super) fn serving_certificate(
    cfg: &Config,
    addresses: tokio::sync::watch::Receiver<Vec<k8s_openapi::api::core::v1::NodeAddress>>,
    api: &ApiClients,
    registry: &mut Registry,
    shutdown: &CancellationToken,
) -> (crate::server::ServingSlot, Task) {
    use crate::certificate::rotation::{CertManager, SERVING};
    let kc = &cfg.kubelet;
    let non_empty = |s: &str| (!s.is_empty()).then(|| std::path::PathBuf::from(s));
    let fallback = non_empty(&kc.tls_cert_file).zip(non_empty(&kc.tls_private_key_file));
    let store = crate::certificate::store::FileStore::new(&cfg.cert_dir, SERVING.prefix, fallback);
    let initial = match store.current() {
        Ok(Some(pair)) if !pair.expired_at(std::time::SystemTime::now()) => Some(pair),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "the stored serving certificate does not load; requesting a new one");
            None
        }
    };
    let slot = crate::server::ServingSlot::default();
    if let Some(pair) = &initial {
        slot.set(pair.certified.clone());
    }
    let manager = CertManager::new(SERVING, store, &cfg.node_name, Some(addresses), initial);
    manager.register(registry);
    let served = slot.clone();
    let requests = task(
        manager.run_applying(api.main.clone(), shutdown.clone(), move |pair| {
            served.set(pair.certified.clone());
            tracing::info!("the HTTPS API serves the new serving certificate");
        }),
        tracing::info_span!("serving_certificate"),
    );
    (slot, requests)
}
