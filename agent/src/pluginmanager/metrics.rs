//! The plugin manager's family (upstream `pluginmanager/metrics`):
//! `plugin_manager_total_plugins{socket_path,state}`, one series per socket in each of the
//! two states, `desired_state_of_world` (the socket exists) and `actual_state_of_world`
//! (its plugin is registered). Upstream registers the name as is, without the `kubelet_`
//! prefix its other families carry.

use std::collections::HashSet;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::metric_families;

/// `state` of the sockets that exist.
pub const DESIRED_STATE: &str = "desired_state_of_world";
/// `state` of the sockets whose plugin is registered.
pub const ACTUAL_STATE: &str = "actual_state_of_world";

/// Label set `socket_path`, `state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TotalPluginsLabels {
    pub socket_path: String,
    pub state: &'static str,
}

metric_families! {
    /// The plugin manager's families.
    #[derive(Clone, Debug)]
    pub struct PluginManagerMetrics {
        /// `plugin_manager_total_plugins{socket_path,state}`: 1 for each socket in each state.
        pub total_plugins: Family<TotalPluginsLabels, Gauge> = Family::default(),
            ("plugin_manager_total_plugins", "[ALPHA] Number of plugins in Plugin Manager");
    }
}

impl PluginManagerMetrics {
    /// Makes the series those of `now`, dropping the ones `published` had that `now`
    /// lacks; `published` becomes `now`.
    pub(super) fn publish(&self, published: &mut HashSet<TotalPluginsLabels>, now: HashSet<TotalPluginsLabels>) {
        for gone in published.difference(&now) {
            self.total_plugins.remove(gone);
        }
        for labels in &now {
            self.total_plugins.get_or_create(labels).set(1);
        }
        *published = now;
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    fn labels(socket: &str, state: &'static str) -> TotalPluginsLabels {
        TotalPluginsLabels { socket_path: socket.to_owned(), state }
    }

    #[test]
    fn series_follow_the_published_state() {
        let mut registry = Registry::default();
        let m = PluginManagerMetrics::new(&mut registry);
        let mut published = HashSet::new();
        m.publish(&mut published, [labels("/r/a.sock", DESIRED_STATE), labels("/r/a.sock", ACTUAL_STATE)].into());
        m.publish(&mut published, [labels("/r/a.sock", DESIRED_STATE), labels("/r/b.sock", DESIRED_STATE)].into());
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &registry).unwrap();
        assert!(out.contains("# TYPE plugin_manager_total_plugins gauge"), "{out}");
        assert!(
            out.contains("plugin_manager_total_plugins{socket_path=\"/r/a.sock\",state=\"desired_state_of_world\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("plugin_manager_total_plugins{socket_path=\"/r/b.sock\",state=\"desired_state_of_world\"} 1"),
            "{out}"
        );
        assert!(!out.contains("actual_state_of_world"), "{out}");
    }
}
