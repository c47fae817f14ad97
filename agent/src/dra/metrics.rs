//! The DRA manager's families (upstream `pkg/kubelet/metrics` and
//! `cm/dra/claiminfo.go`): `dra_operations_duration_seconds{is_error,operation_name}`,
//! `dra_grpc_operations_duration_seconds{driver_name,grpc_status_code,method_name}` and
//! the scrape-time gauge `dra_resource_claims_in_use{driver_name}`. Upstream gives them
//! the `dra` subsystem and no `kubelet` namespace, hence no `kubelet_` prefix.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;

use super::state::Cache;
use crate::metrics::{HistogramFamily, metric_families};

/// The `driver_name` of `dra_resource_claims_in_use` that counts claims whatever their
/// drivers (upstream `DRAResourceClaimsInUseAnyDriver`).
pub const ANY_DRIVER: &str = "<any>";

/// Upstream `DRADurationBuckets`, `ExponentialBucketsRange(0.1, 40, 15)`, as Go computes
/// them: 15 buckets from 0.1 to 40, each `(40 / 0.1)^(1/14)` times the previous. Spelled
/// out because Rust's `powf` and Go's `math.Pow` differ in the last bit for some of them,
/// which would show in the `le` labels.
pub const DRA_DURATION_BUCKETS: [f64; 15] = [
    0.1,
    0.153_412_740_463_439_1,
    0.235_354_689_365_025_24,
    0.361_064_078_764_099_46,
    0.553_918_298_061_075_2,
    0.849_781_240_983_936,
    1.303_672_689_737_678,
    1.999_999_999_999_999_3,
    3.068_254_809_268_780_5,
    4.707_093_787_300_502_5,
    7.221_281_575_281_985,
    11.078_365_961_221_499,
    16.995_624_819_678_714,
    26.073_453_794_753_54,
    39.999_999_999_999_97,
];

fn dra_histogram() -> Histogram {
    Histogram::new(DRA_DURATION_BUCKETS)
}

/// Labels of `dra_operations_duration_seconds`, in the order Go writes them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// `"true"` or `"false"`.
    pub is_error: String,
    /// `PrepareResources` or `UnprepareResources`.
    pub operation_name: String,
}

/// Labels of `dra_grpc_operations_duration_seconds`, in the order Go writes them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcLabels {
    pub driver_name: String,
    /// grpc-go's name of the code (`OK`, `Unavailable`, ...).
    pub grpc_status_code: String,
    /// The full method (`/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`).
    pub method_name: String,
}

metric_families! {
    /// The DRA manager's histograms. `dra_resource_claims_in_use` is a collector over the
    /// manager's claims: see [`super::DraManager::claims_in_use_collector`].
    #[derive(Clone, Debug)]
    pub struct DraMetrics {
        /// `dra_operations_duration_seconds{is_error,operation_name}`: one observation
        /// per `prepare_resources` / `unprepare_resources` of a pod.
        pub operations_duration: HistogramFamily<OperationLabels> = Family::new_with_constructor(dra_histogram),
            ("dra_operations_duration_seconds", "[ALPHA] Latency histogram in seconds for the duration of handling all ResourceClaims referenced by a pod when the pod starts or stops. Identified by the name of the operation (PrepareResources or UnprepareResources) and separated by the success of the operation. The number of failed operations is provided through the histogram's overall count");
        /// `dra_grpc_operations_duration_seconds{driver_name,grpc_status_code,method_name}`:
        /// every call to a plugin.
        pub grpc_operations_duration: HistogramFamily<GrpcLabels> = Family::new_with_constructor(dra_histogram),
            ("dra_grpc_operations_duration_seconds", "[ALPHA] Duration in seconds of the DRA gRPC operations");
    }
}

impl DraMetrics {
    pub(super) fn observe_operation(&self, operation: &str, is_error: bool, seconds: f64) {
        let labels = OperationLabels { is_error: is_error.to_string(), operation_name: operation.to_owned() };
        self.operations_duration.get_or_create(&labels).observe(seconds);
    }
}

/// `dra_resource_claims_in_use{driver_name}`, computed at scrape time from the prepared
/// claims: one series per driver with prepared claims, and [`ANY_DRIVER`] for all of
/// them (always present, 0 when none). A driver without claims has no series, so
/// uninstalled drivers do not linger.
pub struct ClaimsInUseCollector {
    pub(super) cache: Arc<Mutex<Cache>>,
}

impl std::fmt::Debug for ClaimsInUseCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimsInUseCollector").finish_non_exhaustive()
    }
}

/// The help of `dra_resource_claims_in_use`, upstream's.
const CLAIMS_IN_USE_HELP: &str = "[ALPHA] The number of ResourceClaims that are currently in use on the node, by driver name (driver_name label value) and across all drivers (special value <any> for driver_name). Note that the sum of all by-driver counts is not the total number of in-use ResourceClaims because the same ResourceClaim might use devices from different drivers. Instead, use the count for the <any> driver_name.";

impl Collector for ClaimsInUseCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counts: BTreeMap<String, u64> = self.cache.lock().unwrap().claims_in_use();
        let mut family =
            encoder.encode_descriptor("dra_resource_claims_in_use", CLAIMS_IN_USE_HELP, None, MetricType::Gauge)?;
        for (driver, count) in &counts {
            let labels = [("driver_name", driver.as_str())];
            ConstGauge::new(i64::try_from(*count).unwrap_or(i64::MAX)).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn buckets_grow_by_a_constant_factor_from_0_1_to_40() {
        let b = DRA_DURATION_BUCKETS;
        assert!((b[0] - 0.1).abs() < 1e-12);
        assert!((b[14] - 40.0).abs() < 1e-9);
        let factor = 400f64.powf(1.0 / 14.0);
        for w in b.windows(2) {
            assert!((w[1] / w[0] - factor).abs() < 1e-12, "{w:?}");
        }
    }

    #[test]
    fn histograms_have_upstream_names_and_labels() {
        let mut reg = Registry::default();
        let m = DraMetrics::new(&mut reg);
        m.observe_operation("PrepareResources", true, 0.05);
        let grpc = GrpcLabels {
            driver_name: "d".into(),
            grpc_status_code: "OK".into(),
            method_name: "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources".into(),
        };
        m.grpc_operations_duration.get_or_create(&grpc).observe(0.2);
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &reg).unwrap();
        assert!(out.contains("# TYPE dra_operations_duration_seconds histogram"), "{out}");
        assert!(out.contains("histogram's overall count.\n"), "one period, as upstream's help: {out}");
        assert!(
            out.contains(
                "dra_operations_duration_seconds_count{is_error=\"true\",operation_name=\"PrepareResources\"} 1"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "# HELP dra_grpc_operations_duration_seconds [ALPHA] Duration in seconds of the DRA gRPC operations"
            ),
            "{out}"
        );
    }
}
