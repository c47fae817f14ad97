//! Rendering cost of `/metrics/cadvisor` and `/metrics` (no HTTP, no TLS): the
//! cAdvisor text of a synthetic 250-pod collection (`stats::synthetic`, about the scrape
//! bench's 22k series), and the kubelet registry's text with its upstream-name rewriting.
//!
//! `cargo bench -p swiftlet --bench metrics_render [-- ITERATIONS]` prints the median
//! and the fastest of the iterations (default 30) for each. A plain `main`, not a
//! test: nothing is asserted about time.

use std::hint::black_box;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use swiftlet::agent::metrics::KubeletMetrics;
use swiftlet::metrics::OperationLabels;
use swiftlet::server::metrics::HttpLabels;
use swiftlet::stats::cadvisor::{self, MachineInfo};
use swiftlet::stats::synthetic::{self, Shape};

fn machine() -> MachineInfo {
    MachineInfo {
        boot_id: "3f1f0fd5-7c1e-4b52-9d5e-0c3b2f7c1a10".to_owned(),
        machine_id: "5b1c9e8d2f3a4b6c8d0e1f2a3b4c5d6e".to_owned(),
        system_uuid: "ec2a5c47-1d7a-9f3e-8c55-0b2a6f0e3d11".to_owned(),
        cpu_cores: Some(2),
        cpu_physical_cores: Some(1),
        cpu_sockets: Some(1),
        kernel_version: "6.1.0-27-cloud-amd64".to_owned(),
        os_version: "Debian GNU/Linux 12 (bookworm)".to_owned(),
    }
}

/// A registry filled as after a while with 250 pods.
fn kubelet_registry() -> Registry {
    let mut registry = Registry::default();
    let m = KubeletMetrics::new(&mut registry, "bench-node");
    registry.register_collector(Box::new(swiftlet::process_metrics::ProcessCollector::default()));
    let operations = [
        "list_podsandbox",
        "list_containers",
        "container_status",
        "podsandbox_status",
        "create_container",
        "start_container",
        "run_podsandbox",
        "image_status",
        "pull_image",
        "stop_container",
        "remove_container",
        "exec_sync",
        "version",
        "status",
        "image_fs_info",
    ];
    for (k, op) in operations.iter().enumerate() {
        for i in 0..50 {
            m.cri.observe_runtime_operation(op, 0.0005 * (i * (k + 1)) as f64, i % 17 == 0);
        }
    }
    for op in ["sync", "create", "update", "kill"] {
        let h = m.pod_workers.pod_worker_duration.get_or_create(&OperationLabels { operation_type: op.into() });
        for i in 0..250 {
            h.observe(0.001 * f64::from(i));
        }
    }
    for path in ["pods", "metrics", "metrics/cadvisor", "metrics/resource", "stats", "healthz"] {
        let labels = HttpLabels {
            method: "GET".into(),
            path: path.into(),
            server_type: "readwrite".into(),
            long_running: "false".into(),
        };
        m.http.http_requests.get_or_create(&labels).inc();
        m.http.http_requests_duration.get_or_create(&labels).observe(0.01);
    }
    for i in 0..250 {
        m.pod_startup.pod_start_duration.observe(0.5 + f64::from(i) * 0.01, None, None);
        m.pod_startup.pod_start_sli_duration.observe(0.4 + f64::from(i) * 0.01, None, None);
        m.pod_startup.pod_start_total_duration.observe(0.6 + f64::from(i) * 0.01, None, None);
    }
    registry
}

fn time(iterations: usize, mut f: impl FnMut() -> usize) -> (Duration, Duration, usize) {
    let mut bytes = 0;
    for _ in 0..3 {
        bytes = black_box(f());
    }
    let mut times: Vec<Duration> = (0..iterations)
        .map(|_| {
            let start = Instant::now();
            black_box(f());
            start.elapsed()
        })
        .collect();
    times.sort_unstable();
    (times[times.len() / 2], times[0], bytes)
}

fn report(what: &str, (median, min, bytes): (Duration, Duration, usize)) {
    println!(
        "{what:<40} median {:>8.2} ms   min {:>8.2} ms   {:>9} bytes",
        median.as_secs_f64() * 1e3,
        min.as_secs_f64() * 1e3,
        bytes
    );
}

fn main() {
    let iterations = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(30);
    let collection = synthetic::collection(Shape::BENCH_250);
    let machine = machine();
    let text = cadvisor::render_with(&collection, &machine);
    let series = text.lines().filter(|l| !l.starts_with('#')).count();
    println!("/metrics/cadvisor of {} pods: {series} series", collection.pods.len());
    report("cadvisor::render_with", time(iterations, || cadvisor::render_with(black_box(&collection), &machine).len()));
    report("MachineInfo::read", time(iterations, || MachineInfo::read().kernel_version.len()));

    let registry = kubelet_registry();
    report(
        "/metrics: encode + upstream names",
        time(iterations, || {
            let mut text = String::new();
            prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).expect("encodes");
            swiftlet::metrics::with_upstream_counter_names(&text).len()
        }),
    );
    let mut encoded = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut encoded, &registry).expect("encodes");
    report(
        "/metrics: upstream names only",
        time(iterations, || swiftlet::metrics::with_upstream_counter_names(black_box(&encoded)).len()),
    );
}
