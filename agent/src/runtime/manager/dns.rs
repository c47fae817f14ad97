//! Pod DNS and names, as upstream `pkg/kubelet/network/dns` (`GetPodDNS`) and
//! `kubelet_pods.go` (`GeneratePodHostNameAndDomain`, the managed `/etc/hosts`).
//!
//! The DNS functions are pure: they take the parsed host `resolv.conf` and return the CRI
//! `DnsConfig` plus the warning events to record, so every policy is tested without files.
//! Options merged from several places keep their first position (upstream goes through a
//! Go map, whose order is random).

use std::collections::HashSet;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{HostAlias, Pod, PodDNSConfig};

use super::{api, is_host_network, pod_full_name};

/// Upstream `MaxDNSNameservers`.
pub const MAX_NAMESERVERS: usize = 3;
/// Upstream `MaxDNSSearchPaths`.
pub const MAX_SEARCH_PATHS: usize = 32;
/// Upstream `MaxDNSSearchListChars`.
pub const MAX_SEARCH_LIST_CHARS: usize = 2048;
/// Longest search domain glibc tolerates (`DNS1123SubdomainMaxLength`).
const MAX_DOMAIN_LEN: usize = 253;
/// Upstream `defaultDNSOptions` for cluster DNS.
const DEFAULT_OPTIONS: &str = "ndots:5";
/// The hostname the kernel accepts (64 bytes with the NUL).
const HOSTNAME_MAX_LEN: usize = 63;
/// Header of the managed hosts file.
const MANAGED_HOSTS_HEADER: &str = "# Kubernetes-managed hosts file.\n";
/// Header of the hosts file of host-network pods.
const MANAGED_HOSTS_HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";

/// The kubelet's DNS settings (`KubeletConfiguration`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSettings {
    /// `clusterDNS`: the cluster DNS servers. Default: none (`ClusterFirst` pods then
    /// fall back to `Default`, with a `MissingClusterDNS` warning).
    pub cluster_dns: Vec<String>,
    /// `clusterDomain`: e.g. `cluster.local`. Default: empty (no cluster search paths).
    pub cluster_domain: String,
    /// `resolvConf`: the host resolver file the `Default` policy copies. Default
    /// `/etc/resolv.conf`; empty means none (pods then get `nameserver 127.0.0.1`).
    pub resolv_conf: String,
}

impl Default for DnsSettings {
    fn default() -> Self {
        Self { cluster_dns: Vec::new(), cluster_domain: String::new(), resolv_conf: "/etc/resolv.conf".into() }
    }
}

/// Errors of DNS configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The host resolver file cannot be read.
    #[error("could not open resolv conf file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The host resolver file has a bad line (upstream's message).
    #[error("Encountered error while parsing resolv conf file. Error: nameserver list is empty ")]
    EmptyNameserver,
    /// `spec.hostname` or `spec.subdomain` is not a DNS label.
    #[error("pod {field} {value:?} is not a valid DNS label")]
    InvalidLabel { field: &'static str, value: String },
    /// `spec.hostnameOverride` is not a DNS subdomain.
    #[error("pod HostnameOverride {0:?} is not a valid DNS subdomain")]
    InvalidHostnameOverride(String),
    /// The pod came without a spec.
    #[error("pod has no spec")]
    NoSpec,
    /// The truncated hostname is empty.
    #[error("hostname for pod {pod:?} was invalid: {hostname:?}")]
    InvalidHostname { pod: String, hostname: String },
    /// `setHostnameAsFQDN` with a name the kernel cannot hold.
    #[error(
        "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long (64 characters is the max, {} characters requested)",
        fqdn.len()
    )]
    FqdnTooLong { fqdn: String },
}

/// A parsed `resolv.conf`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    /// `nameserver` lines, in order.
    pub nameservers: Vec<String>,
    /// The last `search` line, trailing dots removed and `.` dropped.
    pub searches: Vec<String>,
    /// `options`, merged by name (a later one replaces an earlier one).
    pub options: Vec<String>,
}

/// A warning to record: `(on the node?, reason, message)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsEvent {
    /// Recorded on the node rather than on the pod.
    pub node: bool,
    /// `MissingClusterDNS` or `DNSConfigForming`.
    pub reason: &'static str,
    /// The message, as upstream.
    pub message: String,
}

fn option_name(o: &str) -> &str {
    o.split(':').next().unwrap_or(o)
}

/// Upstream `appendOptions`: later options replace earlier ones of the same name.
fn append_options(options: &mut Vec<String>, new: &[&str]) {
    for o in new {
        match options.iter_mut().find(|x| option_name(x) == option_name(o)) {
            Some(x) => (*o).clone_into(x),
            None => options.push((*o).to_owned()),
        }
    }
}

/// Upstream `parseResolvConf`.
pub fn parse_resolv_conf(text: &str) -> Result<ResolvConf, Error> {
    let mut rc = ResolvConf::default();
    let mut empty_nameserver = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.first().copied() {
            Some("nameserver") => match fields.get(1) {
                Some(ns) => rc.nameservers.push((*ns).to_owned()),
                None => empty_nameserver = true,
            },
            Some("search") => {
                rc.searches =
                    fields[1..].iter().filter(|s| **s != ".").map(|s| s.trim_end_matches('.').to_owned()).collect();
            }
            Some("options") => append_options(&mut rc.options, &fields[1..]),
            _ => {}
        }
    }
    if empty_nameserver { Err(Error::EmptyNameserver) } else { Ok(rc) }
}

/// Reads and parses the host resolver file (`None` when `resolvConf` is empty).
pub fn read_resolv_conf(path: &str) -> Result<Option<ResolvConf>, Error> {
    if path.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.to_owned(), source })?;
    parse_resolv_conf(&text).map(Some)
}

fn omit_duplicates(v: Vec<String>) -> Vec<String> {
    let mut seen = HashSet::new();
    v.into_iter().filter(|s| seen.insert(s.clone())).collect()
}

/// How a pod resolves names (upstream `podDNSType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DnsType {
    Cluster,
    Host,
    None,
}

fn dns_type(pod: &Pod) -> DnsType {
    // (Never a pod without a spec: the sandbox config refuses it first.)
    let Some(spec) = pod.spec.as_ref() else { return DnsType::Host };
    match spec.dns_policy.as_deref().unwrap_or("ClusterFirst") {
        "None" => DnsType::None,
        // Host-network pods cannot reach the cluster DNS through the service network.
        "ClusterFirst" if is_host_network(spec) => DnsType::Host,
        "ClusterFirstWithHostNet" | "ClusterFirst" => DnsType::Cluster,
        "Default" => DnsType::Host,
        other => {
            tracing::error!(pod = %pod_full_name(pod), policy = other, "invalid DNSPolicy; falling back to ClusterFirst");
            DnsType::Cluster
        }
    }
}

/// Upstream `mergeDNSOptions`: `name[:value]` entries, the pod's replace the base's.
fn merge_options(existing: &[String], pod: &PodDNSConfig) -> Vec<String> {
    let mut merged: Vec<(String, String)> = Vec::new();
    let mut put = |name: &str, value: &str| match merged.iter_mut().find(|(n, _)| n == name) {
        Some(e) => value.clone_into(&mut e.1),
        None => merged.push((name.to_owned(), value.to_owned())),
    };
    for o in existing {
        match o.split_once(':') {
            Some((n, v)) => put(n, v),
            None => put(o, ""),
        }
    }
    for o in pod.options.iter().flatten() {
        put(o.name.as_deref().unwrap_or_default(), o.value.as_deref().unwrap_or_default());
    }
    merged.into_iter().map(|(n, v)| if v.is_empty() { n } else { format!("{n}:{v}") }).collect()
}

/// Upstream `formDNSSearchFitsLimits`.
fn fit_searches(mut searches: Vec<String>, events: &mut Vec<DnsEvent>) -> Vec<String> {
    let mut exceeded = false;
    if searches.len() > MAX_SEARCH_PATHS {
        searches.truncate(MAX_SEARCH_PATHS);
        exceeded = true;
    }
    let before = searches.len();
    searches.retain(|s| s.len() <= MAX_DOMAIN_LEN);
    exceeded |= searches.len() != before;
    let line_len = searches.join(" ").len();
    if line_len > MAX_SEARCH_LIST_CHARS {
        let mut cut_len = 0;
        while let Some(last) = searches.pop() {
            cut_len += last.len() + 1;
            if line_len - cut_len <= MAX_SEARCH_LIST_CHARS {
                break;
            }
        }
        exceeded = true;
    }
    if exceeded {
        let message = format!(
            "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
            searches.join(" ")
        );
        tracing::error!(%message, "search line limits exceeded");
        events.push(DnsEvent { node: false, reason: "DNSConfigForming", message });
    }
    searches
}

/// Upstream `GetPodDNS`. `host` is the parsed `resolvConf` (`None` when it is empty);
/// `node_ip` picks the loopback nameserver in that case.
#[must_use]
pub fn pod_dns_config(
    pod: &Pod,
    settings: &DnsSettings,
    host: Option<&ResolvConf>,
    node_ip: Option<&str>,
) -> (api::DnsConfig, Vec<DnsEvent>) {
    let pod_dns_config = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref());
    let host = host.cloned().unwrap_or_default();
    let mut events = Vec::new();
    let mut cfg = api::DnsConfig { servers: host.nameservers, searches: host.searches, options: host.options };
    let mut kind = dns_type(pod);
    if kind == DnsType::Cluster && settings.cluster_dns.is_empty() {
        let message = "kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.".to_owned();
        events.push(DnsEvent { node: true, reason: "MissingClusterDNS", message: message.clone() });
        events.push(DnsEvent {
            node: false,
            reason: "MissingClusterDNS",
            message: format!("pod: {:?}. {message}", pod_full_name(pod)),
        });
        kind = DnsType::Host;
    }
    match kind {
        DnsType::None => cfg = api::DnsConfig::default(),
        DnsType::Cluster => {
            // The cluster DNS is the only nameserver: it forwards what it cannot answer.
            cfg.servers.clone_from(&settings.cluster_dns);
            if !settings.cluster_domain.is_empty() {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                let d = &settings.cluster_domain;
                let mut searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()];
                searches.append(&mut cfg.searches);
                cfg.searches = omit_duplicates(searches);
            }
            cfg.options = vec![DEFAULT_OPTIONS.to_owned()];
        }
        DnsType::Host => {
            if settings.resolv_conf.is_empty() {
                // No resolver file: "the nameserver on the local machine", as upstream.
                let v6 = node_ip.is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
                cfg.servers = vec![if v6 { "::1" } else { "127.0.0.1" }.to_owned()];
                cfg.searches = vec![".".to_owned()];
            }
        }
    }
    if let Some(pod_dns) = pod_dns_config {
        cfg.servers.extend(pod_dns.nameservers.iter().flatten().cloned());
        cfg.servers = omit_duplicates(std::mem::take(&mut cfg.servers));
        cfg.searches.extend(pod_dns.searches.iter().flatten().cloned());
        cfg.searches = omit_duplicates(std::mem::take(&mut cfg.searches));
        cfg.options = merge_options(&cfg.options, pod_dns);
    }
    if cfg.servers.len() > MAX_NAMESERVERS {
        cfg.servers.truncate(MAX_NAMESERVERS);
        let message = format!(
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
            cfg.servers.join(" ")
        );
        tracing::error!(%message, "nameserver limits exceeded");
        events.push(DnsEvent { node: false, reason: "DNSConfigForming", message });
    }
    cfg.searches = fit_searches(std::mem::take(&mut cfg.searches), &mut events);
    (cfg, events)
}

use crate::sources::defaults::{is_dns1123_label, is_dns1123_subdomain};

/// Upstream `GeneratePodHostNameAndDomain`: `spec.hostnameOverride` (a DNS subdomain; GA
/// in 1.37) alone, with no domain; else `spec.hostname` or the pod name, and
/// `<subdomain>.<ns>.svc.<domain>` when the pod has a subdomain. Either name is cut to 63
/// characters without a trailing `-` or `.`.
pub fn pod_hostname_and_domain(pod: &Pod, cluster_domain: &str) -> Result<(String, String), Error> {
    let spec = pod.spec.as_ref().ok_or(Error::NoSpec)?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    if let Some(hostname) = spec.hostname_override.as_deref() {
        if !is_dns1123_subdomain(hostname) {
            return Err(Error::InvalidHostnameOverride(hostname.to_owned()));
        }
        return Ok((truncate_hostname(&name, hostname.to_owned())?, String::new()));
    }
    let mut hostname = name.clone();
    if let Some(h) = spec.hostname.as_deref().filter(|h| !h.is_empty()) {
        if !is_dns1123_label(h) {
            return Err(Error::InvalidLabel { field: "Hostname", value: h.to_owned() });
        }
        h.clone_into(&mut hostname);
    }
    let hostname = truncate_hostname(&name, hostname)?;
    let mut domain = String::new();
    if let Some(sub) = spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
        if !is_dns1123_label(sub) {
            return Err(Error::InvalidLabel { field: "Subdomain", value: sub.to_owned() });
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        domain = format!("{sub}.{ns}.svc.{cluster_domain}");
    }
    Ok((hostname, domain))
}

/// Upstream `truncatePodHostnameIfNeeded`.
fn truncate_hostname(name: &str, mut hostname: String) -> Result<String, Error> {
    if hostname.len() > HOSTNAME_MAX_LEN {
        let cut = hostname[..HOSTNAME_MAX_LEN].trim_end_matches(['-', '.']).to_owned();
        tracing::error!(pod = %name, truncated = %cut, "hostname for pod was too long, truncated it");
        if cut.is_empty() {
            return Err(Error::InvalidHostname { pod: name.to_owned(), hostname });
        }
        hostname = cut;
    }
    Ok(hostname)
}

/// Upstream `GetNodenameForKernel`: the FQDN when `setHostnameAsFQDN` and there is a
/// domain, else the hostname.
pub fn kernel_hostname(hostname: &str, domain: &str, set_fqdn: bool) -> Result<String, Error> {
    if !set_fqdn || domain.is_empty() {
        return Ok(hostname.to_owned());
    }
    let fqdn = format!("{hostname}.{domain}");
    if fqdn.len() > HOSTNAME_MAX_LEN + 1 {
        return Err(Error::FqdnTooLong { fqdn });
    }
    Ok(fqdn)
}

fn host_aliases(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        let _ = writeln!(out, "{}\t{}", a.ip, a.hostnames.iter().flatten().cloned().collect::<Vec<_>>().join("\t"));
    }
    out
}

/// Upstream `managedHostsFileContent`: localhost entries, the pod's IPs with its
/// (fully qualified) hostname, then the host aliases.
#[must_use]
pub fn managed_hosts_content(ips: &[String], hostname: &str, domain: &str, aliases: &[HostAlias]) -> String {
    let mut out = String::from(MANAGED_HOSTS_HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in ips {
        if domain.is_empty() {
            let _ = writeln!(out, "{ip}\t{hostname}");
        } else {
            let _ = writeln!(out, "{ip}\t{hostname}.{domain}\t{hostname}");
        }
    }
    out.push_str(&host_aliases(aliases));
    out
}

/// Upstream `nodeHostsFileContent`: the node's hosts file plus the host aliases, for
/// host-network pods.
#[must_use]
pub fn node_hosts_content(node_hosts: &str, aliases: &[HostAlias]) -> String {
    format!("{MANAGED_HOSTS_HEADER_HOST_NETWORK}{node_hosts}{}", host_aliases(aliases))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c"}]);
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u"}, "spec": spec}))
            .unwrap()
    }

    fn host() -> ResolvConf {
        parse_resolv_conf(
            "# generated\nnameserver 192.0.2.53\nnameserver 192.0.2.54\nsearch old.example\nsearch corp.example. lab.example .\noptions ndots:2 timeout:1\noptions ndots:3 rotate\n",
        )
        .unwrap()
    }

    fn cluster() -> DnsSettings {
        DnsSettings {
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            ..DnsSettings::default()
        }
    }

    #[test]
    fn parses_resolv_conf_as_upstream() {
        let h = host();
        assert_eq!(h.nameservers, ["192.0.2.53", "192.0.2.54"]);
        assert_eq!(h.searches, ["corp.example", "lab.example"]);
        assert_eq!(h.options, ["ndots:3", "timeout:1", "rotate"]);
        assert_eq!(
            parse_resolv_conf("nameserver\n").unwrap_err().to_string(),
            "Encountered error while parsing resolv conf file. Error: nameserver list is empty "
        );
    }

    #[test]
    fn cluster_first() {
        let (cfg, events) = pod_dns_config(&pod(json!({})), &cluster(), Some(&host()), None);
        assert_eq!(cfg.servers, ["10.96.0.10"]);
        assert_eq!(
            cfg.searches,
            ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example", "lab.example"]
        );
        assert_eq!(cfg.options, ["ndots:5"]);
        assert!(events.is_empty());
        // No cluster domain: the host's search paths only.
        let s = DnsSettings { cluster_domain: String::new(), ..cluster() };
        let (cfg, _) = pod_dns_config(&pod(json!({"dnsPolicy": "ClusterFirst"})), &s, Some(&host()), None);
        assert_eq!(cfg.searches, ["corp.example", "lab.example"]);
    }

    #[test]
    fn cluster_first_without_cluster_dns_falls_back_to_default() {
        let (cfg, events) = pod_dns_config(&pod(json!({})), &DnsSettings::default(), Some(&host()), None);
        assert_eq!(cfg.servers, ["192.0.2.53", "192.0.2.54"]);
        assert_eq!(cfg.options, ["ndots:3", "timeout:1", "rotate"]);
        assert_eq!(events.len(), 2);
        assert!(events[0].node && events[0].reason == "MissingClusterDNS");
        assert_eq!(
            events[1].message,
            "pod: \"web_shop(u)\". kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy."
        );
    }

    #[test]
    fn host_network_policies() {
        let (cfg, _) = pod_dns_config(&pod(json!({"hostNetwork": true})), &cluster(), Some(&host()), None);
        assert_eq!(cfg.servers, ["192.0.2.53", "192.0.2.54"], "ClusterFirst + hostNetwork = Default");
        let p = pod(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}));
        let (cfg, _) = pod_dns_config(&p, &cluster(), Some(&host()), None);
        assert_eq!(cfg.servers, ["10.96.0.10"]);
    }

    #[test]
    fn default_policy_and_empty_resolv_conf() {
        let p = pod(json!({"dnsPolicy": "Default"}));
        let (cfg, _) = pod_dns_config(&p, &cluster(), Some(&host()), None);
        assert_eq!((cfg.servers.len(), cfg.searches.len()), (2, 2));
        let s = DnsSettings { resolv_conf: String::new(), ..cluster() };
        let (cfg, _) = pod_dns_config(&p, &s, None, Some("192.0.2.1"));
        assert_eq!((cfg.servers, cfg.searches), (vec!["127.0.0.1".to_string()], vec![".".to_string()]));
        let (cfg, _) = pod_dns_config(&p, &s, None, Some("2001:db8::1"));
        assert_eq!(cfg.servers, ["::1"]);
    }

    #[test]
    fn none_policy_and_dns_config_merge() {
        let p = pod(json!({"dnsPolicy": "None", "dnsConfig": {
            "nameservers": ["1.1.1.1"], "searches": ["a.example"],
            "options": [{"name": "ndots", "value": "1"}, {"name": "edns0"}]}}));
        let (cfg, _) = pod_dns_config(&p, &cluster(), Some(&host()), None);
        assert_eq!(cfg.servers, ["1.1.1.1"]);
        assert_eq!(cfg.searches, ["a.example"]);
        assert_eq!(cfg.options, ["ndots:1", "edns0"]);

        let p =
            pod(json!({"dnsConfig": {"nameservers": ["10.96.0.10", "1.1.1.1"], "searches": ["svc.cluster.local", "x"],
                                         "options": [{"name": "ndots", "value": "2"}]}}));
        let (cfg, _) = pod_dns_config(&p, &cluster(), Some(&host()), None);
        assert_eq!(cfg.servers, ["10.96.0.10", "1.1.1.1"]);
        assert_eq!(cfg.searches.last().unwrap(), "x");
        assert_eq!(cfg.searches.iter().filter(|s| *s == "svc.cluster.local").count(), 1);
        assert_eq!(cfg.options, ["ndots:2"]);
    }

    #[test]
    fn limits_are_enforced_with_a_warning() {
        let p = pod(json!({"dnsPolicy": "None", "dnsConfig": {
            "nameservers": ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"],
            "searches": (0..40).map(|i| format!("d{i}.example")).collect::<Vec<_>>()}}));
        let (cfg, events) = pod_dns_config(&p, &cluster(), None, None);
        assert_eq!(cfg.servers.len(), 3);
        assert_eq!(cfg.searches.len(), 32);
        assert_eq!(events.len(), 2);
        assert_eq!(
            events[0].message,
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 1.1.1.1 2.2.2.2 3.3.3.3"
        );
        assert!(events[1].message.starts_with("Search Line limits were exceeded"));

        // 2048 characters at most; over-long domains are dropped.
        let long: Vec<String> = (0..12).map(|i| format!("{}{i}.example", "x".repeat(200))).collect();
        let mut searches = long.clone();
        searches.insert(0, "y".repeat(300));
        let p = pod(json!({"dnsPolicy": "None", "dnsConfig": {"searches": searches}}));
        let (cfg, events) = pod_dns_config(&p, &cluster(), None, None);
        assert!(cfg.searches.join(" ").len() <= MAX_SEARCH_LIST_CHARS);
        assert_eq!(cfg.searches, long[..9]);
        assert_eq!(events.len(), 1);
    }

    #[test]
    fn hostnames_and_domains() {
        let p = pod(json!({"hostname": "h", "subdomain": "sub"}));
        assert_eq!(
            pod_hostname_and_domain(&p, "cluster.local").unwrap(),
            ("h".into(), "sub.shop.svc.cluster.local".into())
        );
        let mut p = pod(json!({}));
        p.metadata.name = Some(format!("{}-.abc", "a".repeat(62)));
        assert_eq!(pod_hostname_and_domain(&p, "").unwrap().0, "a".repeat(62));
        let p = pod(json!({"hostname": "Bad_Name"}));
        assert_eq!(
            pod_hostname_and_domain(&p, "").unwrap_err().to_string(),
            "pod Hostname \"Bad_Name\" is not a valid DNS label"
        );
        // hostnameOverride wins over hostname and subdomain, and brings no domain.
        let p = pod(json!({"hostname": "h", "subdomain": "sub", "hostnameOverride": "my.host-name"}));
        assert_eq!(pod_hostname_and_domain(&p, "cluster.local").unwrap(), ("my.host-name".into(), String::new()));
        let p = pod(json!({"hostnameOverride": "Not_A_Subdomain"}));
        assert_eq!(
            pod_hostname_and_domain(&p, "").unwrap_err().to_string(),
            "pod HostnameOverride \"Not_A_Subdomain\" is not a valid DNS subdomain"
        );
        assert_eq!(kernel_hostname("h", "sub.shop.svc.cluster.local", true).unwrap(), "h.sub.shop.svc.cluster.local");
        assert_eq!(kernel_hostname("h", "d", false).unwrap(), "h");
        assert!(kernel_hostname(&"h".repeat(40), &"d".repeat(30), true).is_err());
    }

    #[test]
    fn hosts_files() {
        let aliases: Vec<HostAlias> =
            serde_json::from_value(json!([{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]}])).unwrap();
        let content = managed_hosts_content(&["10.0.0.5".into()], "web", "sub.shop.svc.cluster.local", &aliases);
        assert_eq!(
            content,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
             10.0.0.5\tweb.sub.shop.svc.cluster.local\tweb\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"
        );
        assert!(managed_hosts_content(&["10.0.0.5".into()], "web", "", &[]).ends_with("10.0.0.5\tweb\n"));
        assert_eq!(
            node_hosts_content("127.0.0.1 localhost\n", &[]),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n"
        );
    }
}
