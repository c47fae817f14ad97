//! The image manager's metric families: upstream's
//! `kubelet_image_pull_duration_seconds{image_size_in_bytes}` (recorded by
//! [`super::puller`]) and `kubelet_image_garbage_collected_total{reason}` (by
//! [`super::gc`]; upstream since 1.30).

use crate::metrics::metric_families;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// Label set `image_size_in_bytes` of `kubelet_image_pull_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImageSizeLabels {
    pub image_size_in_bytes: String,
}

/// Label set `reason` of `kubelet_image_garbage_collected_total`: `age` or `space`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImageGcReasonLabels {
    pub reason: String,
}

/// Upstream `imagePullDurationBuckets` (seconds).
pub const IMAGE_PULL_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0,
    3600.0,
];

/// Upstream `GetImageSizeBucket`: the label of the size range an image falls in.
#[must_use]
pub fn image_size_bucket(bytes: u64) -> &'static str {
    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;
    const BUCKETS: [(u64, &str); 12] = [
        (0, "0-10MB"),
        (10 * MIB, "10MB-100MB"),
        (100 * MIB, "100MB-500MB"),
        (500 * MIB, "500MB-1GB"),
        (GIB, "1GB-5GB"),
        (5 * GIB, "5GB-10GB"),
        (10 * GIB, "10GB-20GB"),
        (20 * GIB, "20GB-30GB"),
        (30 * GIB, "30GB-40GB"),
        (40 * GIB, "40GB-60GB"),
        (60 * GIB, "60GB-100GB"),
        (100 * GIB, "GT100GB"),
    ];
    BUCKETS.iter().rev().find(|(low, _)| bytes >= *low).map_or("0-10MB", |(_, l)| l)
}

metric_families! {
    /// The image families.
    #[derive(Debug)]
    pub struct ImageMetrics {
        /// `kubelet_image_pull_duration_seconds{image_size_in_bytes}`: image pulls by the image's
        /// size range.
        pub image_pull_duration: Family<ImageSizeLabels, Histogram> = Family::new_with_constructor(|| Histogram::new(IMAGE_PULL_BUCKETS)),
            ("kubelet_image_pull_duration_seconds", "[ALPHA] Duration in seconds to pull an image");
        /// `kubelet_image_garbage_collected_total{reason}`: images removed by image GC, by reason
        /// (`age`, `space`).
        pub image_garbage_collected: Family<ImageGcReasonLabels, Counter> = Family::default(),
            ("kubelet_image_garbage_collected", "[ALPHA] Total number of images garbage collected by the kubelet, whether through disk usage or image age");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_size_buckets_as_upstream() {
        assert_eq!(image_size_bucket(0), "0-10MB");
        assert_eq!(image_size_bucket(10 * 1024 * 1024 - 1), "0-10MB");
        assert_eq!(image_size_bucket(10 * 1024 * 1024), "10MB-100MB");
        assert_eq!(image_size_bucket(3 << 30), "1GB-5GB");
        assert_eq!(image_size_bucket(200 << 30), "GT100GB");
    }
}
