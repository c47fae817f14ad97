//! The requests a node agent puts on the API server, from kube-apiserver's own `/metrics`
//! (read as the cluster admin): how many a second in all, and by verb.
//!
//! `apiserver_request_total` has no user label, so the agent's requests are told apart by
//! API Priority and Fairness: every request of a node's credentials (group
//! `system:nodes`) is classified into the flow schema `system-node-high` (its node and
//! lease) or `system-nodes` (everything else), and nothing else goes there — the bench's
//! own requests (cluster admin, `system:masters`) are `exempt`, the controller-manager's
//! and the scheduler's have schemas of their own, and the bench runs one agent at a time.
//! The per-agent total is the delta of `apiserver_flowcontrol_dispatched_requests_total`
//! of those two schemas over the window: exact (a watch counts once, when it starts).
//!
//! The split by verb (and resource) is an estimate: the delta of `apiserver_request_total`
//! by verb and resource over the window, less the control plane's own rate of the same
//! verb and resource (a baseline window with no agent and no bench requests, taken while
//! the runtime's floor is measured straight over CRI) times the window, less the bench's
//! own requests in the window (which the bench knows: its pod creates and its one
//! `/metrics` read), clamped at 0, then summed by verb. Watches are the exception:
//! `apiserver_request_total` counts a `WATCH` when it ends (the control plane's informers'
//! watches end at random, the agent's when it stops), so they are left out of it and the
//! agent's watches are the ones APF started in the node schemas
//! (`apiserver_flowcontrol_request_execution_seconds_count{type="watch"}`, counted at the
//! watch's initial stage): exact, but without their resource. The estimate's sum need not
//! match the exact total.
//!
//! Checked on the test bed's kube-apiserver v1.37.2: with no agent, no request lands in
//! the node schemas; the bootstrap token's requests (the agent's certificate signing
//! request, before its node exists) go to `global-default`; the controller-manager's to
//! `kube-system-service-accounts` and `kube-controller-manager`.

use std::{collections::BTreeMap, time::Instant};

use anyhow::{Result, ensure};

use crate::bench::apiserver::ApiClient;

/// The flow schemas a node's requests are classified into.
pub const NODE_SCHEMAS: [&str; 2] = ["system-node-high", "system-nodes"];

/// One sample of Prometheus text: the metric's name, its labels and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// A sample line of the Prometheus text format (`name{a="x",b="y"} 12 [timestamp]`);
/// `None` for comments, blank lines and what does not parse.
pub fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let end;
        loop {
            // Skip separators, then a label name up to '=' or the closing brace.
            while chars.next_if(|(_, c)| *c == ',' || c.is_whitespace()).is_some() {}
            match chars.peek() {
                Some((i, '}')) => {
                    end = *i;
                    break;
                }
                None => return None,
                _ => {}
            }
            let mut key = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    c => value.push(c),
                }
            }
            labels.push((key.trim().to_owned(), value));
        }
        rest = &inner[end + 1..];
    }
    let value = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample { name, labels, value })
}

/// The samples of metric `name` in Prometheus text.
pub fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = Sample> + 'a {
    text.lines()
        .filter(move |l| l.strip_prefix(name).is_some_and(|r| r.starts_with('{') || r.starts_with(' ')))
        .filter_map(parse_line)
}

/// The counters of one reading of kube-apiserver's `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// Requests dispatched in the node flow schemas ([`NODE_SCHEMAS`]).
    pub node_requests: f64,
    /// Watches the node flow schemas started (APF's execution of a watch's initial
    /// stage, `apiserver_flowcontrol_request_execution_seconds_count{type="watch"}`).
    pub node_watches: f64,
    /// `apiserver_request_total` summed by [`request_key`] (every code, group, version,
    /// scope and component).
    pub by_request: BTreeMap<String, f64>,
}

impl Counters {
    pub fn parse(text: &str) -> Self {
        let node_requests = samples(text, "apiserver_flowcontrol_dispatched_requests_total")
            .filter(|s| s.label("flow_schema").is_some_and(|f| NODE_SCHEMAS.contains(&f)))
            .map(|s| s.value)
            .sum();
        let mut by_request = BTreeMap::new();
        for s in samples(text, "apiserver_request_total") {
            let key = request_key(
                s.label("verb").unwrap_or("?"),
                s.label("resource").unwrap_or_default(),
                s.label("subresource").unwrap_or_default(),
            );
            *by_request.entry(key).or_insert(0.0) += s.value;
        }
        let node_watches = samples(text, "apiserver_flowcontrol_request_execution_seconds_count")
            .filter(|s| s.label("type") == Some("watch"))
            .filter(|s| s.label("flow_schema").is_some_and(|f| NODE_SCHEMAS.contains(&f)))
            .map(|s| s.value)
            .sum();
        Self { node_requests, node_watches, by_request }
    }
}

/// `VERB resource[/subresource]`, or `VERB /path` for a non-resource request (the
/// `subresource` label holds the path then): `PATCH pods/status`, `GET /metrics`.
pub fn request_key(verb: &str, resource: &str, subresource: &str) -> String {
    match (resource, subresource) {
        ("", "") => verb.to_owned(),
        ("", path) => format!("{verb} {path}"),
        (r, "") => format!("{verb} {r}"),
        (r, sub) => format!("{verb} {r}/{sub}"),
    }
}

/// The verb of a [`request_key`].
pub fn verb_of(key: &str) -> &str {
    key.split_once(' ').map_or(key, |(v, _)| v)
}

/// Rates by [`request_key`] summed by verb.
pub fn by_verb(by_request: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (k, r) in by_request {
        *out.entry(verb_of(k).to_owned()).or_insert(0.0) += r;
    }
    out
}

/// The key of the agent's watches, from APF (exact, every resource): a `WATCH` counts in
/// `apiserver_request_total` only when it ends.
pub const WATCHES: &str = "WATCH (started, any resource)";

/// The bench's own `GET /metrics` of kube-apiserver.
pub const METRICS_READ: &str = "GET /metrics";

/// A reading of the counters and when it was taken.
#[derive(Debug, Clone)]
pub struct Reading {
    pub counters: Counters,
    pub at: Instant,
}

/// Reads kube-apiserver's `/metrics` (one `GET`, which the server counts once it has
/// answered: it falls into the next window).
pub async fn read(client: &mut ApiClient) -> Result<Reading> {
    let (code, text) = client.get_text("/metrics").await?;
    ensure!(code == 200, "GET /metrics of kube-apiserver: {code}: {text:.300}");
    Ok(Reading { counters: Counters::parse(&text), at: Instant::now() })
}

/// What the API server counted over one window (or several, pooled).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    pub secs: f64,
    /// Requests of the node flow schemas: the agent's, exactly.
    pub agent: f64,
    /// Watches of the node flow schemas started: the agent's, exactly.
    pub agent_watches: f64,
    /// Every request by [`request_key`].
    pub by_request: BTreeMap<String, f64>,
    /// The bench's own requests in the window, by [`request_key`].
    pub bench: BTreeMap<String, f64>,
}

impl Window {
    /// The window between two readings; `bench`: the bench's own requests between them
    /// by [`request_key`], besides the first reading's `GET /metrics` (counted here).
    pub fn between(before: &Reading, after: &Reading, bench: &[(&str, f64)]) -> Self {
        let delta = |a: f64, b: f64| (a - b).max(0.0);
        let mut by_request = BTreeMap::new();
        for (key, after_n) in &after.counters.by_request {
            let n = delta(*after_n, before.counters.by_request.get(key).copied().unwrap_or(0.0));
            if n > 0.0 {
                by_request.insert(key.clone(), n);
            }
        }
        let mut own = BTreeMap::from([(METRICS_READ.to_owned(), 1.0)]);
        for (verb, n) in bench {
            *own.entry((*verb).to_owned()).or_insert(0.0) += n;
        }
        Self {
            secs: after.at.duration_since(before.at).as_secs_f64(),
            agent: delta(after.counters.node_requests, before.counters.node_requests),
            agent_watches: delta(after.counters.node_watches, before.counters.node_watches),
            by_request,
            bench: own,
        }
    }

    /// Several windows as one (their counts and durations summed); `None` for none.
    pub fn pool<'a>(windows: impl IntoIterator<Item = &'a Self>) -> Option<Self> {
        let mut out: Option<Self> = None;
        for w in windows {
            let o = out.get_or_insert_with(Self::default);
            o.secs += w.secs;
            o.agent += w.agent;
            o.agent_watches += w.agent_watches;
            for (k, v) in &w.by_request {
                *o.by_request.entry(k.clone()).or_insert(0.0) += v;
            }
            for (k, v) in &w.bench {
                *o.bench.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        out
    }

    /// The agent's requests a second.
    pub fn agent_rate(&self) -> f64 {
        if self.secs > 0.0 { self.agent / self.secs } else { 0.0 }
    }

    /// The agent's load ÷ `other`'s. Windows of the same length (within 5 %: both are
    /// the bench's idle window, a few milliseconds apart) compare their request counts:
    /// at idle both agents send a handful of requests on timers, and dividing those whole
    /// numbers by durations that differ by milliseconds would make equal counts look
    /// unequal. Otherwise the rates.
    pub fn agent_share(&self, other: &Self) -> f64 {
        let same_length = self.secs > 0.0 && (self.secs - other.secs).abs() <= 0.05 * self.secs.max(other.secs);
        if same_length {
            crate::bench::verdict::share(self.agent, other.agent)
        } else {
            crate::bench::verdict::share(self.agent_rate(), other.agent_rate())
        }
    }

    /// Requests a second by [`request_key`] less the bench's own (the control plane's
    /// rate, for a window with no agent); watches left out (counted when they end).
    pub fn others_rate(&self) -> BTreeMap<String, f64> {
        self.by_request
            .iter()
            .filter(|(v, _)| verb_of(v) != "WATCH")
            .map(|(v, n)| {
                let rate = if self.secs > 0.0 {
                    (n - self.bench.get(v).copied().unwrap_or(0.0)).max(0.0) / self.secs
                } else {
                    0.0
                };
                (v.clone(), rate)
            })
            .collect()
    }

    /// The agent's requests a second by [`request_key`], estimated (see the module docs)
    /// against `baseline`, the control plane alone; those estimated at 0 are left out.
    /// [`by_verb`] sums them by verb.
    pub fn agent_by_request(&self, baseline: Option<&Self>) -> BTreeMap<String, f64> {
        let base = baseline.map(Self::others_rate).unwrap_or_default();
        let mut out: BTreeMap<String, f64> = self
            .by_request
            .iter()
            .filter(|(v, _)| verb_of(v) != "WATCH")
            .filter_map(|(v, n)| {
                let own = self.bench.get(v).copied().unwrap_or(0.0);
                let rest = n - own - base.get(v).copied().unwrap_or(0.0) * self.secs;
                (rest > 0.0 && self.secs > 0.0).then(|| (v.clone(), rest / self.secs))
            })
            .collect();
        if self.agent_watches > 0.0 && self.secs > 0.0 {
            out.insert(WATCHES.to_owned(), self.agent_watches / self.secs);
        }
        out
    }
}

/// `rate` requests a second, with about three significant digits.
pub fn fmt_rate(rate: f64) -> String {
    super::report::three_digits(rate)
}

/// `PATCH 0.20, GET 0.10` (highest rate first).
pub fn fmt_verbs(by_verb: &BTreeMap<String, f64>) -> String {
    fmt_top(by_verb, usize::MAX)
}

/// The `n` highest rates of `rates` as `key rate, ...`; `—` for none.
pub fn fmt_top(rates: &BTreeMap<String, f64>, n: usize) -> String {
    let mut v: Vec<(&String, &f64)> = rates.iter().filter(|(_, r)| **r >= 0.0005).collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    if v.is_empty() {
        return "—".to_owned();
    }
    v.into_iter().take(n).map(|(key, r)| format!("{key} {}", fmt_rate(*r))).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const TEXT: &str = r#"# HELP apiserver_flowcontrol_dispatched_requests_total [BETA] Number of requests
# TYPE apiserver_flowcontrol_dispatched_requests_total counter
apiserver_flowcontrol_dispatched_requests_total{flow_schema="exempt",priority_level="exempt"} 513
apiserver_flowcontrol_dispatched_requests_total{flow_schema="system-node-high",priority_level="node-high"} 40
apiserver_flowcontrol_dispatched_requests_total{flow_schema="system-nodes",priority_level="system"} 2
apiserver_flowcontrol_dispatched_requests_total_extra{flow_schema="system-nodes"} 1000
apiserver_flowcontrol_request_execution_seconds_count{flow_schema="system-nodes",priority_level="system",type="watch"} 9
apiserver_flowcontrol_request_execution_seconds_count{flow_schema="system-nodes",priority_level="system",type="regular"} 30
apiserver_flowcontrol_request_execution_seconds_count{flow_schema="exempt",priority_level="exempt",type="watch"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="WATCH",version="v1"} 3
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/healthz",verb="GET",version=""} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="status",verb="PATCH",version="v1"} 7
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 1e+02
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="GET",version="v1"} 4
"#;

    #[test]
    fn parses_prometheus_lines() {
        let s = parse_line(r#"m{a="x,y",b="q\"uote\\d"} 1.5 1700000000"#).unwrap();
        assert_eq!(s.name, "m");
        assert_eq!(s.labels, vec![("a".into(), "x,y".into()), ("b".into(), "q\"uote\\d".into())]);
        assert!((s.value - 1.5).abs() < 1e-12);
        let s = parse_line("up 1").unwrap();
        assert_eq!((s.name.as_str(), s.labels.len(), s.value), ("up", 0, 1.0));
        assert!(parse_line(r#"m{a="x",} +Inf"#).unwrap().value.is_infinite());
        assert_eq!(parse_line("# HELP m x"), None);
        assert_eq!(parse_line(r#"m{a="x" 1"#), None);
        assert_eq!(parse_line("m{} nope"), None);
        assert_eq!(samples(TEXT, "apiserver_flowcontrol_dispatched_requests_total").count(), 3);
    }

    #[test]
    fn counters_take_the_node_schemas_and_sum_by_request() {
        let c = Counters::parse(TEXT);
        assert!((c.node_requests - 42.0).abs() < 1e-9, "{c:?}");
        assert!((c.node_watches - 9.0).abs() < 1e-9, "{c:?}");
        let keys = |pairs: &[(&str, f64)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect::<BTreeMap<_, _>>();
        assert_eq!(
            c.by_request,
            keys(&[
                ("GET /healthz", 1.0),
                ("PATCH pods/status", 7.0),
                ("POST pods", 100.0),
                ("GET nodes", 4.0),
                ("WATCH pods", 3.0)
            ])
        );
        assert_eq!(by_verb(&c.by_request), keys(&[("GET", 5.0), ("PATCH", 7.0), ("POST", 100.0), ("WATCH", 3.0)]));
        assert_eq!(request_key("WATCH", "", ""), "WATCH");
        assert_eq!(verb_of("GET /metrics"), "GET");
    }

    fn reading(node: f64, verbs: &[(&str, f64)], at: Instant) -> Reading {
        Reading {
            counters: Counters {
                node_requests: node,
                node_watches: node / 10.0,
                by_request: verbs.iter().map(|(v, n)| ((*v).to_owned(), *n)).collect(),
            },
            at,
        }
    }

    #[test]
    fn windows_estimate_the_agents_verbs_against_the_baseline() {
        let t0 = Instant::now();
        // Control plane alone for 10 s: 20 PUT and 10 GET of leases, and the bench's one
        // GET /metrics.
        let base = Window::between(
            &reading(0.0, &[("GET leases", 100.0), ("PUT leases", 50.0), ("GET /metrics", 3.0)], t0),
            &reading(
                0.0,
                &[("GET leases", 110.0), ("PUT leases", 70.0), ("GET /metrics", 4.0)],
                t0 + Duration::from_secs(10),
            ),
            &[],
        );
        assert_eq!(base.bench, BTreeMap::from([(METRICS_READ.to_owned(), 1.0)]));
        assert_eq!(
            base.others_rate(),
            BTreeMap::from([
                ("GET /metrics".to_owned(), 0.0),
                ("GET leases".to_owned(), 1.0),
                ("PUT leases".to_owned(), 2.0)
            ])
        );
        // An agent for 20 s: 60 requests of its own (30 PATCH, 20 GET, 10 PUT); the bench
        // creates 5 pods (POST) and reads /metrics once.
        let w = Window::between(
            &reading(100.0, &[("GET leases", 200.0), ("GET nodes", 0.0), ("PUT leases", 100.0)], t0),
            &reading(
                160.0,
                &[
                    ("GET leases", 220.0),
                    ("GET nodes", 20.0),
                    ("GET /metrics", 1.0),
                    ("PUT leases", 150.0),
                    ("PATCH pods/status", 30.0),
                    ("POST pods", 5.0),
                    // A watch of the control plane's that ended in the window.
                    ("WATCH endpoints", 1.0),
                ],
                t0 + Duration::from_secs(20),
            ),
            &[("POST pods", 5.0)],
        );
        assert!((w.agent_rate() - 3.0).abs() < 1e-9);
        // Watches: the 6 the node schemas started (16 − 10 in the readings), not those
        // that ended.
        let est = by_verb(&w.agent_by_request(Some(&base)));
        assert_eq!(est.len(), 4, "{est:?}");
        assert!(
            (est["PATCH"] - 1.5).abs() < 1e-9
                && (est["GET"] - 1.0).abs() < 1e-9
                && (est["PUT"] - 0.5).abs() < 1e-9
                && (est["WATCH"] - 0.3).abs() < 1e-9
        );
        assert_eq!(fmt_verbs(&est), "PATCH 1.50, GET 1.00, PUT 0.500, WATCH 0.300");
        assert_eq!(fmt_top(&w.agent_by_request(Some(&base)), 2), "PATCH pods/status 1.50, GET nodes 1.00");
        // Pooled: counts and durations add up.
        let p = Window::pool([&w, &w]).unwrap();
        assert!((p.secs - 40.0).abs() < 1e-6 && (p.agent - 120.0).abs() < 1e-9);
        assert!((p.agent_rate() - 3.0).abs() < 1e-9);
        assert_eq!(Window::pool(std::iter::empty::<&Window>()), None);
        // A counter that went back (the server restarted) counts 0, not negative.
        let back = Window::between(&reading(10.0, &[], t0), &reading(5.0, &[], t0 + Duration::from_secs(1)), &[]);
        assert!(back.agent.abs() < f64::EPSILON, "{back:?}");
    }

    #[test]
    fn rates_format_with_three_digits() {
        assert_eq!(fmt_rate(0.1234), "0.123");
        assert_eq!(fmt_rate(3.21), "3.21");
        assert_eq!(fmt_rate(32.1), "32.1");
        assert_eq!(fmt_rate(321.0), "321");
        assert_eq!(fmt_verbs(&BTreeMap::new()), "—");
    }

    /// Equal request counts in windows a few milliseconds apart are equal loads (the
    /// rates would say 1.0001×); windows of different lengths compare rates.
    #[test]
    fn loads_of_windows_of_one_length_compare_counts() {
        let window = |secs: f64, agent: f64| Window { secs, agent, ..Window::default() };
        assert!((window(60.000, 6.0).agent_share(&window(59.990, 6.0)) - 1.0).abs() < f64::EPSILON);
        assert!((window(60.0, 5.0).agent_share(&window(60.5, 6.0)) - 5.0 / 6.0).abs() < 1e-12);
        assert!((window(30.0, 3.0).agent_share(&window(60.0, 12.0)) - 0.5).abs() < 1e-12);
        assert!(window(60.0, 1.0).agent_share(&window(60.0, 0.0)).is_infinite());
    }
}
