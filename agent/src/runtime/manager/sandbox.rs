//! The pod sandbox (upstream `kuberuntime_sandbox.go`): the CRI sandbox config of a pod
//! (`generatePodSandboxConfig`: hostname, DNS, port mappings, namespaces, security
//! context) and `RunPodSandbox` (`createPodSandbox`).

use k8s_openapi::api::core::v1::Pod;

use super::{RuntimeManager, dns, is_host_network, no_spec, pod_full_name};
use crate::container::{Error, Result, api, labels};
use crate::events::{EventType, node_ref, pod_ref};
use crate::runtime::security_context;

impl RuntimeManager {
    /// Builds the CRI sandbox config of a pod (upstream `generatePodSandboxConfig`).
    pub fn sandbox_config(&self, pod: &Pod, attempt: u32) -> Result<api::PodSandboxConfig> {
        self.sandbox_config_recording(pod, attempt, 0)
    }

    /// [`Self::sandbox_config`], recording the DNS warnings as events `records` times (once
    /// for a sandbox created, once for containers to start, as upstream generates it).
    pub(super) fn sandbox_config_recording(
        &self,
        pod: &Pod,
        attempt: u32,
        records: usize,
    ) -> Result<api::PodSandboxConfig> {
        let spec = pod.spec.as_ref().ok_or_else(|| Error::Invalid(no_spec(pod)))?;
        let host_network = is_host_network(spec);
        // Host-network sandboxes fail in containerd 1.6 when a hostname is set; the
        // kubelet leaves it empty for them too.
        let hostname = if host_network {
            String::new()
        } else {
            let (hostname, domain) = dns::pod_hostname_and_domain(pod, &self.dns.cluster_domain)
                .map_err(|e| Error::Invalid(e.to_string()))?;
            dns::kernel_hostname(&hostname, &domain, spec.set_hostname_as_fqdn.unwrap_or(false))
                .map_err(|e| Error::Invalid(e.to_string()))?
        };
        let mut port_mappings = Vec::new();
        for c in &spec.containers {
            for p in c.ports.iter().flatten() {
                if p.host_port.unwrap_or(0) == 0 && !host_network {
                    continue;
                }
                let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
                    "UDP" => api::Protocol::Udp,
                    "SCTP" => api::Protocol::Sctp,
                    _ => api::Protocol::Tcp,
                };
                port_mappings.push(api::PortMapping {
                    protocol: protocol as i32,
                    container_port: p.container_port,
                    host_port: p.host_port.unwrap_or(0),
                    host_ip: p.host_ip.clone().unwrap_or_default(),
                });
            }
        }
        let ns_mode = |node: bool| if node { api::NamespaceMode::Node } else { api::NamespaceMode::Pod } as i32;
        let sc = spec.security_context.as_ref();
        let security = security_context::sandbox_security_context(pod).map_err(|e| Error::Invalid(e.to_string()))?;
        let userns = self.user_namespace(pod).map_err(Error::Invalid)?;
        let linux = api::LinuxPodSandboxConfig {
            cgroup_parent: self.cm.cgroup_parent(pod),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: ns_mode(host_network),
                    pid: if spec.host_pid.unwrap_or(false) {
                        api::NamespaceMode::Node as i32
                    } else if spec.share_process_namespace.unwrap_or(false) {
                        api::NamespaceMode::Pod as i32
                    } else {
                        api::NamespaceMode::Container as i32
                    },
                    ipc: ns_mode(spec.host_ipc.unwrap_or(false)),
                    userns_options: Some(userns),
                    ..Default::default()
                }),
                privileged: spec
                    .containers
                    .iter()
                    .chain(spec.init_containers.iter().flatten())
                    .any(|c| c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false)),
                ..security
            }),
            sysctls: sc
                .and_then(|s| s.sysctls.as_ref())
                .map(|v| v.iter().map(|s| (s.name.clone(), s.value.clone())).collect())
                .unwrap_or_default(),
            ..Default::default()
        };
        let host_resolv = dns::read_resolv_conf(&self.dns.resolv_conf).map_err(|e| Error::Invalid(e.to_string()))?;
        let (dns_config, dns_events) =
            dns::pod_dns_config(pod, &self.dns, host_resolv.as_ref(), self.cfg.host_ip.as_deref());
        for _ in 0..records {
            for e in &dns_events {
                let object = if e.node { node_ref(&self.cfg.node_name) } else { pod_ref(pod) };
                self.recorder.record(object, EventType::Warning, e.reason, e.message.clone());
            }
        }
        let dns_config = Some(dns_config);
        Ok(api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: pod.metadata.name.clone().unwrap_or_default(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                attempt,
            }),
            hostname,
            log_directory: self.pod_log_dir(pod).to_string_lossy().into_owned(),
            dns_config,
            port_mappings,
            labels: labels::sandbox_labels(pod),
            annotations: labels::sandbox_annotations(pod),
            linux: Some(linux),
            windows: None,
        })
    }

    pub(super) async fn create_sandbox(
        &self,
        pod: &Pod,
        config: &api::PodSandboxConfig,
        handler: &str,
    ) -> Result<(String, Vec<String>)> {
        std::fs::create_dir_all(self.pod_log_dir(pod))
            .map_err(|e| Error::Invalid(format!("creating pod log directory: {e}")))?;
        let handler = handler.to_owned();
        let started = std::time::Instant::now();
        let run = async {
            let under_way = self.cache.starts().begin(pod.metadata.uid.as_deref().unwrap_or_default());
            let ran = self.rt.run_pod_sandbox(config.clone(), handler.clone()).await;
            if let Ok(id) = &ran {
                under_way.succeeded(id, "");
            }
            ran
        };
        let id = self.sandbox_gate.run("RunPodSandbox", run).await?;
        self.containers_changed();
        self.metrics
            .run_podsandbox_duration
            .get_or_create(&crate::runtime::metrics::RuntimeHandlerLabels { runtime_handler: handler })
            .observe(started.elapsed().as_secs_f64());
        let st = self.rt.pod_sandbox_status(&id).await?;
        let mut ips = Vec::new();
        if let Some(net) = st.network {
            if !net.ip.is_empty() {
                ips.push(net.ip);
            }
            ips.extend(net.additional_ips.into_iter().map(|i| i.ip));
        }
        tracing::info!(pod = %pod_full_name(pod), sandbox = %id, ?ips, "created pod sandbox");
        Ok((id, ips))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::manager::testing::{cluster_dns, env, pod};

    #[tokio::test]
    async fn sandbox_dns_and_hostname() {
        let tmp = tempfile::tempdir().unwrap();
        let e = env(cluster_dns(tmp.path()));
        let mut p = pod();
        p.spec.as_mut().unwrap().set_hostname_as_fqdn = Some(true);
        let sb = e.rm.sandbox_config(&p, 0).unwrap();
        assert_eq!(sb.hostname, "web-0.web.shop.svc.cluster.local");
        let d = sb.dns_config.unwrap();
        assert_eq!(d.servers, ["10.96.0.10"]);
        assert_eq!(d.searches, ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"]);
        assert_eq!(d.options, ["ndots:5"]);

        // No cluster DNS: the host's resolver, and warnings on the pod and the node when
        // a sandbox is created.
        let e = env(dns::DnsSettings { cluster_dns: vec![], ..cluster_dns(tmp.path()) });
        let sb = e.rm.sandbox_config_recording(&p, 0, 1).unwrap();
        assert_eq!(sb.dns_config.unwrap().servers, ["192.0.2.53"]);
        let missing = e.recorder.list();
        assert_eq!(missing.len(), 2);
        assert_eq!(missing[0].involved_object.kind.as_deref(), Some("Node"));
        assert_eq!(missing[1].involved_object.kind.as_deref(), Some("Pod"));
        e.rm.sandbox_config(&p, 0).unwrap();
        assert_eq!(e.recorder.list().len(), 2, "no events outside sandbox creation");

        // An unreadable resolv.conf fails the sandbox, as upstream.
        let e = env(dns::DnsSettings { resolv_conf: "/nonexistent/resolv.conf".into(), ..dns::DnsSettings::default() });
        assert!(e.rm.sandbox_config(&p, 0).unwrap_err().to_string().starts_with("could not open resolv conf file"));
    }
}
