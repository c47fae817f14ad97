//! A CSI volume's figures from its driver (upstream `csi_metrics.go`'s `metricsCsi` and
//! `csi_client.go`'s `NodeGetVolumeStats`): what the stats module reports for a CSI
//! volume whose driver has the node capability `GET_VOLUME_STATS`.
//!
//! - The request names the volume id and the volume path: the publish target the pod
//!   uses (for a block volume the device file the driver published). As upstream, the
//!   staging path is not sent (the CSI spec makes it optional).
//! - A driver without `GET_VOLUME_STATS` gives no figures (`Ok(None)`): upstream's
//!   `NotSupported`, after which the volume has no stats at all (see `crate::stats`).
//! - The answer's `BYTES` usage gives capacity (`total`), available and used bytes; its
//!   `INODES` usage the inodes, free and used; a unit the answer lacks stays 0, an unknown
//!   unit is logged and skipped, an answer with no usage at all is an error, as upstream.
//!   Negative figures (which upstream would turn into huge unsigned ones) count as 0.
//! - `volume_condition` is not read (nor decoded: `proto/csi` reserves it): upstream 1.37
//!   does not read it either (its volume health lives behind the alpha `CSIVolumeHealth`
//!   gate, off by default, in a separate `NodeGetVolumeHealth` monitor swiftlet lacks).

use std::path::Path;

use super::drivers::CsiDrivers;
use super::{Error, proto};

/// A volume's figures as its driver reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeUsage {
    /// Bytes: total, available, used.
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
    /// Inodes: total, free, used.
    pub inodes: u64,
    pub inodes_free: u64,
    pub inodes_used: u64,
}

impl VolumeUsage {
    /// The figures of a `NodeGetVolumeStats` answer.
    ///
    /// # Errors
    /// The answer has no usage.
    pub fn from_response(r: &proto::NodeGetVolumeStatsResponse) -> Result<Self, Error> {
        use proto::volume_usage::Unit;
        if r.usage.is_empty() {
            return Err(Error::Invalid("NodeGetVolumeStats: failed to get usage from response. usage is nil".into()));
        }
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        let mut out = Self::default();
        for u in &r.usage {
            match Unit::try_from(u.unit) {
                Ok(Unit::Bytes) => {
                    out.capacity = n(u.total);
                    out.available = n(u.available);
                    out.used = n(u.used);
                }
                Ok(Unit::Inodes) => {
                    out.inodes = n(u.total);
                    out.inodes_free = n(u.available);
                    out.inodes_used = n(u.used);
                }
                _ => tracing::warn!(unit = u.unit, "unknown unit in a CSI VolumeUsage"),
            }
        }
        Ok(out)
    }
}

impl CsiDrivers {
    /// `NodeGetVolumeStats` of volume `volume_id` of `driver` published at `path`;
    /// `Ok(None)` when the driver does not offer it. Blocking: runs on a blocking thread.
    ///
    /// # Errors
    /// The driver is not registered (a transient state upstream too), the call failed,
    /// or the answer had no usage.
    pub fn volume_stats_blocking(
        &self,
        driver: &str,
        volume_id: &str,
        path: &Path,
    ) -> Result<Option<VolumeUsage>, Error> {
        let op = "metricsCsi.GetMetrics";
        let d = self.get(driver).ok_or_else(|| Error::NotRegistered { op, driver: driver.to_owned() })?;
        if !d.capabilities.get_volume_stats {
            return Ok(None);
        }
        if volume_id.is_empty() {
            return Err(Error::Invalid("NodeGetVolumeStats: missing volume id".into()));
        }
        let req = proto::NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_owned(),
            volume_path: path.to_string_lossy().into_owned(),
            staging_target_path: String::new(),
        };
        let mut node = d.node();
        let answer =
            self.run_blocking(async move { node.node_get_volume_stats(req).await }).map_err(|s| Error::rpc(op, &s))?;
        VolumeUsage::from_response(answer.get_ref()).map(Some)
    }
}
