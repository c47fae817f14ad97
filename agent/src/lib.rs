//! swiftlet: a Kubernetes node agent (a kubelet) for Linux nodes.
//!
//! The crate is laid out like the upstream kubelet's `pkg/kubelet`: one module per
//! subsystem, each with a trait at its boundary, the real implementation and a fake
//! for the other modules' tests. See `ARCHITECTURE.md` at the repository root for the
//! layers, the module map, the data flow and the rules; `main.rs` only parses flags and
//! hands a [`config::Config`] to [`agent::run`].

pub mod agent;
pub mod allocation;
pub mod api_objects;
pub mod api_throttle;
pub mod certificate;
pub mod cm;
pub mod config;
pub mod container;
pub mod dra;
pub mod event_api;
pub mod events;
pub mod eviction;
pub mod gc;
pub mod images;
pub mod lifecycle;
pub mod logs;
pub mod memory;
pub mod metrics;
pub mod mirror;
pub mod node;
pub mod nodeshutdown;
pub mod pleg;
pub mod pluginmanager;
pub mod pod_manager;
pub mod pod_startup;
pub mod pod_workers;
pub mod pressure;
pub mod probe;
pub mod prober;
pub mod process_metrics;
pub mod runtime;
pub mod server;
pub mod settings;
pub mod sources;
pub mod stats;
pub mod status;
pub mod sync_loop;
pub mod telemetry;
pub mod types;
pub mod volumes;
