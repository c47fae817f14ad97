//! The Grafana dashboards and Prometheus rules of `dashboards/`.
//!
//! Without containerd (they run everywhere `cargo test --workspace` runs): every dashboard
//! is Grafana JSON of a current schema whose panels all query the `${datasource}`
//! variable; every panel query, with its template variables replaced by concrete values,
//! is valid `PromQL` (`promtool check rules` on a rule file made of the queries) and names
//! families swiftlet serves (or that are listed below as not served); the rule files pass
//! `promtool check rules` and their unit tests (`promtool test rules`); every alert has a
//! summary, a runbook in the README and a unit test that fires it on a bad node but not on
//! a healthy one.
//!
//! With the test bed: `every_dashboard_query_has_data_from_a_real_agent`, where a real
//! Prometheus scrapes a real agent running a short workload and every panel query returns
//! data, except the few panels of [`EXPECTED_EMPTY`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

/// The dashboards every release ships (uid → what it shows).
const DASHBOARDS: &[(&str, &str)] = &[
    ("swiftlet-kubelet", "the kubelet overview"),
    ("swiftlet-evented-pleg", "the evented PLEG"),
    ("swiftlet-pod-startup-sli", "the pod startup SLI"),
    ("swiftlet-node-pressure", "node pressure and eviction"),
    ("swiftlet-pod-resources", "per-pod resources from /metrics/cadvisor"),
];

/// Families the dashboards query that swiftlet does not serve, and why they are there.
const NOT_SERVED: &[(&str, &str)] = &[
    ("rest_client_requests_total", "upstream kubelet (client-go); for mixed fleets"),
    ("rest_client_request_duration_seconds", "upstream kubelet (client-go); for mixed fleets"),
    ("node_pressure_cpu_waiting_seconds_total", "node_exporter: swiftlet exports no PSI family"),
    ("node_pressure_memory_waiting_seconds_total", "node_exporter: swiftlet exports no PSI family"),
    ("node_pressure_io_waiting_seconds_total", "node_exporter: swiftlet exports no PSI family"),
];

/// Panels (dashboard uid, title) legitimately empty after the end-to-end workload, and why.
const EXPECTED_EMPTY: &[(&str, &str, &str)] = &[
    // Families swiftlet does not serve (NOT_SERVED): the panels are for fleets that still
    // run upstream kubelets, in a collapsed row that says so.
    ("swiftlet-kubelet", "REST client requests", "rest_client_* is not served by swiftlet"),
    ("swiftlet-kubelet", "REST client request duration p99", "rest_client_* is not served by swiftlet"),
    // PSI comes from node_exporter, which the test does not run.
    ("swiftlet-node-pressure", "PSI: some tasks stalled (node_exporter)", "no node_exporter in the test"),
    // Evictions: the test runs static pods only, which the eviction manager never evicts
    // (they are critical, as upstream), and makes no node pressure; the families appear
    // with the first eviction decision (covered by the eviction manager's unit tests).
    ("swiftlet-node-pressure", "Evictions by signal", "no eviction without node pressure"),
    ("swiftlet-node-pressure", "Eviction stats age p99", "no eviction without node pressure"),
    ("swiftlet-node-pressure", "Pressure signal → eviction decision p99", "no eviction without node pressure"),
    ("swiftlet-node-pressure", "Pressure signals that led to a decision", "no eviction without node pressure"),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn dashboards_dir() -> PathBuf {
    repo().join("dashboards")
}

/// The files of `dir` ending in `ext`, sorted.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    out
}

/// Every dashboard: (file name, parsed JSON).
fn dashboards() -> Vec<(String, Value)> {
    files(&dashboards_dir(), "json")
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), json)
        })
        .collect()
}

/// Every panel of a dashboard that is not a row, including those inside collapsed rows.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            if p["type"] != "row" {
                out.push(p);
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn variables(dashboard: &Value) -> Vec<&Value> {
    dashboard["templating"]["list"].as_array().into_iter().flatten().collect()
}

/// One panel query.
#[derive(Debug, Clone)]
struct Query {
    dashboard: String,
    panel: String,
    ref_id: String,
    expr: String,
}

fn queries(dashboard: &Value) -> Vec<Query> {
    let uid = dashboard["uid"].as_str().unwrap_or_default().to_string();
    panels(dashboard)
        .into_iter()
        .flat_map(|p| {
            let uid = uid.clone();
            p["targets"].as_array().into_iter().flatten().map(move |t| Query {
                dashboard: uid.clone(),
                panel: p["title"].as_str().unwrap_or_default().to_string(),
                ref_id: t["refId"].as_str().unwrap_or_default().to_string(),
                expr: t["expr"].as_str().unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// Values for Grafana's built-in interval variables and the single-valued query variables
/// (the multi-valued ones become their `allValue`, textboxes their value).
struct Values<'a> {
    rate_interval: &'a str,
    range: &'a str,
    single: &'a BTreeMap<String, String>,
}

/// `expr` with every template variable replaced, as Grafana would with "All" selected.
/// Multi-valued variables must be used as regexes (`=~"$x"`), since "All" is `.+`.
fn substitute(expr: &str, dashboard: &Value, values: &Values<'_>) -> Result<String, String> {
    let vars: BTreeMap<&str, &Value> =
        variables(dashboard).into_iter().map(|v| (v["name"].as_str().unwrap_or(""), v)).collect();
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').ok_or_else(|| format!("unclosed ${{ in {expr}"))?;
            (&braced[..end], end + 2)
        } else {
            let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
            (&after[..end], end)
        };
        if name.is_empty() {
            // A regex anchor, not a variable.
            out.push('$');
            rest = after;
            continue;
        }
        let value = match name {
            "__rate_interval" | "__interval" => values.rate_interval.to_string(),
            "__range" => values.range.to_string(),
            _ => {
                let v = vars.get(name).ok_or_else(|| format!("undefined variable ${name} in {expr}"))?;
                let multi = v["multi"].as_bool().unwrap_or(false) || v["includeAll"].as_bool().unwrap_or(false);
                if multi {
                    if !(out.ends_with("=~\"") || out.ends_with("!~\"")) {
                        return Err(format!("multi-valued ${name} used outside a regex matcher in {expr}"));
                    }
                    v["allValue"].as_str().ok_or_else(|| format!("${name} has no allValue"))?.to_string()
                } else if v["type"] == "query" {
                    values.single.get(name).cloned().ok_or_else(|| format!("no value for ${name}"))?
                } else {
                    v["current"]["value"]
                        .as_str()
                        .or_else(|| v["query"].as_str())
                        .ok_or_else(|| format!("${name} has no value"))?
                        .to_string()
                }
            }
        };
        out.push_str(&value);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A variable's `label_values(selector, label)` as a `PromQL` query of the same series.
fn variable_query(v: &Value) -> Option<String> {
    let def = v["definition"].as_str().or_else(|| v["query"]["query"].as_str())?;
    let inner = def.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some(format!("count by ({}) ({})", label.trim(), selector.trim()))
}

/// The metric names an expression selects (identifiers followed by `{`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut in_string = false;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'"' {
            in_string = !in_string;
        } else if !in_string && (c.is_ascii_alphabetic() || c == b'_') {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':') {
                i += 1;
            }
            if bytes.get(i) == Some(&b'{') {
                out.insert(expr[start..i].to_string());
            }
            continue;
        }
        i += 1;
    }
    out
}

/// The swiftlet families a rule expression names: `kubelet_*`, `swiftlet_*` and `process_*`
/// identifiers outside strings that are not label names (recorded series have colons).
fn rule_metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_string = false;
    let mut token = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if !in_string && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            token.push(c);
            continue;
        }
        let is_label = c == '=' || c == '!';
        if !token.is_empty()
            && !is_label
            && !token.contains(':')
            && ["kubelet_", "swiftlet_", "process_"].iter().any(|p| token.starts_with(p))
        {
            out.insert(token.clone());
        }
        token.clear();
        if c == '"' {
            in_string = !in_string;
        }
    }
    out
}

/// Runs promtool; an error carries its output.
fn promtool(args: &[&str]) -> Result<String> {
    let out = Command::new("promtool").args(args).output().context("running promtool (apt-get install prometheus)")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "promtool {}: {}\n{text}", args.join(" "), out.status);
    Ok(text)
}

/// Writes `exprs` as recording rules into `dir` and runs `promtool check rules` on them.
fn check_promql(dir: &Path, exprs: &[(String, String)]) -> Result<()> {
    let mut yaml = String::from("groups:\n- name: dashboard-queries\n  rules:\n");
    for (i, (what, expr)) in exprs.iter().enumerate() {
        let what = what.replace('\n', " ");
        writeln!(yaml, "  # {what}\n  - record: dashboard:query:{i}\n    expr: {}", serde_json::to_string(expr)?)?;
    }
    let file = dir.join("queries.yaml");
    std::fs::write(&file, yaml)?;
    promtool(&["check", "rules", file.to_str().unwrap()]).map(drop).map_err(|e| {
        // Name the queries promtool complains about.
        let text = e.to_string();
        let named: Vec<String> = exprs
            .iter()
            .enumerate()
            .filter(|(i, _)| text.contains(&format!("\"dashboard:query:{i}\"")))
            .map(|(_, (what, expr))| format!("{what}: {expr}"))
            .collect();
        anyhow::anyhow!("{e}\ninvalid: {named:#?}")
    })
}

fn single_values_for_ci() -> BTreeMap<String, String> {
    [("job", "kubelet"), ("cadvisor_job", "cadvisor")].into_iter().map(|(k, v)| (k.into(), v.into())).collect()
}

#[test]
fn every_dashboard_is_grafana_json_on_the_datasource_variable() {
    let all = dashboards();
    let uids: BTreeSet<&str> = all.iter().map(|(_, d)| d["uid"].as_str().unwrap_or_default()).collect();
    for (uid, what) in DASHBOARDS {
        assert!(uids.contains(uid), "no dashboard {uid} ({what})");
    }
    assert_eq!(uids.len(), all.len(), "dashboard uids must be unique");
    let ds = |v: &Value| v["uid"] == "${datasource}" && v["type"] == "prometheus";
    for (file, d) in &all {
        assert!(d["schemaVersion"].as_u64().unwrap_or(0) >= 39, "{file}: schemaVersion {}", d["schemaVersion"]);
        assert!(d["title"].as_str().is_some_and(|t| t.starts_with("swiftlet / ")), "{file}: title");
        assert!(d["id"].is_null(), "{file}: an exported dashboard has no id");
        let vars = variables(d);
        let datasource =
            vars.iter().find(|v| v["name"] == "datasource").unwrap_or_else(|| panic!("{file}: no $datasource"));
        assert_eq!(
            (datasource["type"].as_str(), datasource["query"].as_str()),
            (Some("datasource"), Some("prometheus"))
        );
        for name in ["job", "node", "instance"] {
            assert!(vars.iter().any(|v| v["name"] == name), "{file}: no ${name}");
        }
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert!(ds(&v["datasource"]), "{file}: variable {} on {}", v["name"], v["datasource"]);
            assert!(variable_query(v).is_some(), "{file}: variable {} is not label_values(selector, label)", v["name"]);
        }
        let mut ids = BTreeSet::new();
        for p in panels(d) {
            let title = p["title"].as_str().unwrap_or_default();
            assert!(!title.is_empty(), "{file}: a panel without a title");
            assert!(
                ids.insert(p["id"].as_u64().unwrap_or_else(|| panic!("{file}: {title}: no id"))),
                "{file}: {title}: id"
            );
            assert!(p["gridPos"]["w"].as_u64().is_some(), "{file}: {title}: gridPos");
            assert!(ds(&p["datasource"]), "{file}: {title}: datasource {}", p["datasource"]);
            assert!(p["description"].as_str().is_some_and(|s| !s.is_empty()), "{file}: {title}: description");
            let targets = p["targets"].as_array().filter(|t| !t.is_empty());
            let targets = targets.unwrap_or_else(|| panic!("{file}: {title}: no targets"));
            for t in targets {
                assert!(ds(&t["datasource"]), "{file}: {title}: target datasource {}", t["datasource"]);
                let expr = t["expr"].as_str().unwrap_or_default();
                assert!(!expr.trim().is_empty(), "{file}: {title}: empty expr");
                // The pod start quantiles over time show the traces their observations
                // belong to.
                if p["type"] == "timeseries"
                    && expr.contains("histogram_quantile")
                    && expr.contains("kubelet_pod_start")
                {
                    assert_eq!(t["exemplar"], true, "{file}: {title}: exemplars on the pod start quantiles");
                }
            }
        }
    }
}

#[test]
fn every_panel_query_is_valid_promql() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let single = single_values_for_ci();
    let values = Values { rate_interval: "5m", range: "1h", single: &single };
    let mut exprs = Vec::new();
    for (file, d) in dashboards() {
        for q in queries(&d) {
            let expr = substitute(&q.expr, &d, &values).map_err(|e| anyhow::anyhow!("{file}: {}: {e}", q.panel))?;
            ensure!(!expr.contains('$'), "{file}: {}: unreplaced variable in {expr}", q.panel);
            exprs.push((format!("{file}: {} ({})", q.panel, q.ref_id), expr));
        }
        for v in variables(&d) {
            if let Some(query) = variable_query(v) {
                let expr =
                    substitute(&query, &d, &values).map_err(|e| anyhow::anyhow!("{file}: ${}: {e}", v["name"]))?;
                exprs.push((format!("{file}: variable {}", v["name"]), expr));
            }
        }
    }
    ensure!(exprs.len() > 50, "only {} queries", exprs.len());
    check_promql(dir.path(), &exprs)?;
    // The check does reject invalid PromQL.
    let broken = [("broken".to_string(), "sum by (le (rate(x[5m]))".to_string())];
    ensure!(check_promql(dir.path(), &broken).is_err(), "promtool accepted invalid PromQL");
    Ok(())
}

/// The sources of the agent, where every family it serves is named as a string literal.
fn agent_sources() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push_str(&std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let mut out = String::new();
    walk(&repo().join("agent/src"), &mut out);
    out
}

/// The sample names of the upstream kubelet's endpoints (the 1.28 inventories): a counter
/// or gauge by its name, a histogram by its `_bucket`, `_count` and `_sum` series.
fn upstream_samples() -> (BTreeSet<String>, BTreeSet<String>) {
    let dir = repo().join("tests/fixtures/reference/kubelet-1.28");
    let (mut families, mut samples) = (BTreeSet::new(), BTreeSet::new());
    for file in files(&dir, "txt") {
        for line in std::fs::read_to_string(&file).unwrap().lines().filter(|l| !l.starts_with('#')) {
            let mut cols = line.split('\t');
            let (Some(name), Some(kind)) = (cols.next(), cols.next()) else { continue };
            families.insert(name.to_string());
            match kind {
                "histogram" => samples.extend(["_bucket", "_count", "_sum"].map(|s| format!("{name}{s}"))),
                "summary" => samples.extend(["", "_count", "_sum"].map(|s| format!("{name}{s}"))),
                _ => {
                    samples.insert(name.to_string());
                }
            }
        }
    }
    (families, samples)
}

#[test]
fn queries_name_served_families() {
    let sources = agent_sources();
    let literal = |name: &str| sources.contains(&format!("\"{name}\""));
    let (upstream_families, upstream_samples) = upstream_samples();
    let without_total = swiftlet::metrics::COUNTERS_WITHOUT_TOTAL;
    // Whether swiftlet serves a sample of this name: the family is named in its sources
    // (prometheus-client appends `_total` to counters, so they are registered without it),
    // and a family upstream has too is queried by upstream's sample names.
    let served = |name: &str| {
        if name == "up" || without_total.contains(&name) {
            return true;
        }
        if name.strip_suffix("_total").is_some_and(|base| without_total.contains(&base)) {
            // The `_total` name (see below).
            return true;
        }
        let family = ["_bucket", "_count", "_sum"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        let named = literal(name) || literal(family) || name.strip_suffix("_total").is_some_and(literal);
        let upstream = [family.to_string(), name.to_string(), format!("{name}_total")]
            .iter()
            .any(|f| upstream_families.contains(f));
        named && (!upstream || upstream_samples.contains(name))
    };
    let mut problems = Vec::new();
    let mut not_served_panels = BTreeSet::new();
    let mut all = Vec::new();
    for (file, d) in dashboards() {
        all.extend(queries(&d).into_iter().map(|q| (file.clone(), q.clone(), metric_names(&q.expr))));
    }
    // The rules' expressions too (they name `kubelet_*` families, mostly without `{`).
    for file in files(&dashboards_dir().join("rules"), "yaml") {
        for g in yaml(&file)["groups"].as_array().into_iter().flatten() {
            for r in g["rules"].as_array().into_iter().flatten() {
                let expr = r["expr"].as_str().unwrap_or_default().to_string();
                let what = r["record"].as_str().or_else(|| r["alert"].as_str()).unwrap_or_default().to_string();
                let names = rule_metric_names(&expr);
                let q = Query { dashboard: "rules".into(), panel: what, ref_id: String::new(), expr };
                all.push((file.file_name().unwrap().to_string_lossy().into_owned(), q, names));
            }
        }
    }
    for (file, q, names) in all {
        // Upstream's counters without `_total`: a query must take both names (README,
        // "Counter names").
        for base in without_total {
            let total = format!("{base}_total");
            if names.contains(*base) != names.contains(&total) {
                problems.push(format!("{file}: {}: query both {base} and {total}", q.panel));
            }
        }
        for name in names {
            let family = ["_bucket", "_count", "_sum"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
            if NOT_SERVED.iter().any(|(n, _)| *n == family) {
                not_served_panels.insert((q.dashboard.clone(), q.panel.clone()));
            } else if !served(&name) {
                problems.push(format!("{file}: {}: {name} is not served by swiftlet", q.panel));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    // A panel on a family swiftlet does not serve is expected empty, and says why.
    for (dashboard, panel) in &not_served_panels {
        assert!(
            EXPECTED_EMPTY.iter().any(|(d, p, _)| d == dashboard && p == panel),
            "{dashboard}: {panel} queries a family swiftlet does not serve but is not in EXPECTED_EMPTY"
        );
    }
    // The upstream families are the kubelet's (1.28 inventory).
    let reference = std::fs::read_to_string(repo().join("tests/fixtures/reference/kubelet-1.28/metrics.txt")).unwrap();
    for (name, why) in NOT_SERVED.iter().filter(|(_, why)| why.starts_with("upstream")) {
        assert!(
            reference.lines().any(|l| l.split('\t').next() == Some(name)),
            "{name} ({why}) is not a kubelet family"
        );
    }
}

#[test]
fn expected_empty_panels_exist() {
    let all = dashboards();
    for (uid, title, why) in EXPECTED_EMPTY {
        let d = all.iter().find(|(_, d)| d["uid"] == *uid).map(|(_, d)| d);
        let found = d.is_some_and(|d| panels(d).iter().any(|p| p["title"] == *title));
        assert!(found, "EXPECTED_EMPTY names a panel that does not exist: {uid}: {title} ({why})");
    }
}

#[test]
fn rules_pass_promtool_check_and_unit_tests() -> Result<()> {
    let rules = dashboards_dir().join("rules");
    let rule_files = files(&rules, "yaml");
    ensure!(rule_files.len() >= 2, "rule files: {rule_files:?}");
    let mut args = vec!["check", "rules"];
    args.extend(rule_files.iter().map(|p| p.to_str().unwrap()));
    promtool(&args)?;
    let tests = files(&rules.join("tests"), "yaml");
    ensure!(!tests.is_empty(), "no rule unit tests");
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(|p| p.to_str().unwrap()));
    let out = promtool(&args)?;
    ensure!(out.contains("SUCCESS"), "{out}");

    // The example scrape configuration, with a token file that exists and the rules.
    let dir = tempfile::tempdir()?;
    let token = dir.path().join("token");
    std::fs::write(&token, "token")?;
    let example = std::fs::read_to_string(dashboards_dir().join("provisioning/prometheus-scrape.yaml"))?;
    let config = example
        .replace("/var/run/secrets/kubernetes.io/serviceaccount/token", token.to_str().unwrap())
        .replace("rules/*.yaml", rules.join("*.yaml").to_str().unwrap());
    ensure!(config != example, "prometheus-scrape.yaml changed shape: {example}");
    let file = dir.path().join("prometheus.yml");
    std::fs::write(&file, config)?;
    promtool(&["check", "config", file.to_str().unwrap()])?;
    Ok(())
}

fn yaml(path: &Path) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every alerting rule of the rule files.
fn alerts() -> Vec<Value> {
    files(&dashboards_dir().join("rules"), "yaml")
        .iter()
        .flat_map(|p| {
            let y = yaml(p);
            y["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect::<Vec<_>>()
        })
        .filter(|r| r["alert"].is_string())
        .collect()
}

#[test]
fn every_alert_has_a_summary_a_runbook_and_a_unit_test() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let unit_tests: Vec<Value> = files(&dashboards_dir().join("rules/tests"), "yaml")
        .iter()
        .flat_map(|p| yaml(p)["tests"].as_array().cloned().unwrap_or_default())
        .collect();
    let alerts = alerts();
    assert!(alerts.len() >= 8, "{} alerts", alerts.len());
    for rule in &alerts {
        let name = rule["alert"].as_str().unwrap();
        let a = &rule["annotations"];
        for key in ["summary", "description"] {
            assert!(a[key].as_str().is_some_and(|s| !s.trim().is_empty()), "{name}: no {key}");
        }
        assert!(
            ["critical", "warning", "info"].contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
            "{name}: severity"
        );
        let anchor = name.to_lowercase();
        assert!(
            a["runbook_url"].as_str().is_some_and(|u| u.ends_with(&format!("README.md#{anchor}"))),
            "{name}: runbook_url {}",
            a["runbook_url"]
        );
        assert!(readme.lines().any(|l| l.trim() == format!("#### {name}")), "{name}: no runbook heading in the README");
        // A unit test where the alert fires on a node, and does not on another node of
        // the same input (the healthy one).
        let fires_only_on_the_bad_node = unit_tests.iter().any(|t| {
            let cases: Vec<&Value> =
                t["alert_rule_test"].as_array().into_iter().flatten().filter(|c| c["alertname"] == name).collect();
            let firing: BTreeSet<String> = cases
                .iter()
                .flat_map(|c| c["exp_alerts"].as_array().into_iter().flatten())
                .filter_map(|e| e["exp_labels"]["instance"].as_str().map(str::to_string))
                .collect();
            let instances: BTreeSet<String> = t["input_series"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| {
                    let series = s["series"].as_str()?;
                    let at = series.find("instance=\"")? + "instance=\"".len();
                    Some(series[at..].split('"').next()?.to_string())
                })
                .collect();
            !firing.is_empty() && instances.iter().any(|i| !firing.contains(i))
        });
        assert!(fires_only_on_the_bad_node, "{name}: no unit test that fires it on one node and not on a healthy one");
    }
}

// ---------------------------------------------------------------------------------------
// End to end (needs the test bed)

mod e2e {
    use super::*;
    use swiftlet_tests::prometheus::Prometheus;
    use swiftlet_tests::{Agent, testbed_lock};

    const BUSYBOX: &str = "localhost/busybox:latest";

    /// A static pod of one busybox container (`command` as a YAML flow sequence).
    fn pod(name: &str, command: &str, memory_limit: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: {command}\n    resources:\n      limits: {{memory: {memory_limit}}}\n"
        )
    }

    /// `manifest` with one volume `v` of `source` (a YAML flow mapping) mounted at `/v`.
    fn with_volume(manifest: &str, source: &str) -> String {
        format!("{manifest}    volumeMounts: [{{name: v, mountPath: /v}}]\n  volumes:\n  - name: v\n    {source}\n")
    }

    fn container(p: &Value) -> &Value {
        p["status"]["containerStatuses"].as_array().and_then(|a| a.first()).unwrap_or(&Value::Null)
    }

    /// An instant query: the result vector.
    async fn query(client: &reqwest::Client, web: u16, q: &str) -> Result<Vec<Value>> {
        let v: Value = client
            .get(format!("http://127.0.0.1:{web}/api/v1/query"))
            .query(&[("query", q)])
            .send()
            .await?
            .json()
            .await?;
        ensure!(v["status"] == "success", "{q}: {v}");
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Every panel query of every dashboard (and every variable query and recording rule)
    /// returns data from a real Prometheus scraping a real agent, after a short workload:
    /// a steady pod, a crash-looping one, one OOM-killed over and over and one whose
    /// command does not exist (runtime and container start errors). Pod starts are traced,
    /// and the SLI histogram's exemplars in Prometheus carry the start traces' ids.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_dashboard_query_has_data_from_a_real_agent() -> Result<()> {
        let _g = testbed_lock().await;
        let (collector, cri, agent) = Agent::traced().await?;
        let serve = r#"["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]"#;
        agent.write_manifest("steady.yaml", &pod("steady", serve, "64Mi"))?;
        agent.write_manifest("crashloop.yaml", &pod("crashloop", r#"["sh", "-c", "sleep 2; exit 3"]"#, "64Mi"))?;
        agent.write_manifest("oom.yaml", &pod("oom", r#"["sh", "-c", "tail /dev/zero"]"#, "24Mi"))?;
        agent.write_manifest("badcmd.yaml", &pod("badcmd", r#"["/no/such/binary"]"#, "64Mi"))?;
        // Volume operations: the steady pod's emptyDir set up, and a hostPath that never
        // passes its type check (a failed `volume_mount` at every try).
        agent.write_manifest("volumes.yaml", &with_volume(&pod("volumes", serve, "64Mi"), "emptyDir: {}"))?;
        agent.write_manifest(
            "badvolume.yaml",
            &with_volume(
                &pod("badvolume", serve, "64Mi"),
                "hostPath: {path: /nonexistent/swiftlet-dashboards, type: Directory}",
            ),
        )?;
        agent.wait_pod("steady", Duration::from_mins(1), |p| !container(p)["state"]["running"].is_null()).await?;
        agent
            .wait_pod("crashloop", Duration::from_mins(1), |p| container(p)["restartCount"].as_i64().unwrap_or(0) >= 1)
            .await?;
        agent
            .wait_pod("oom", Duration::from_mins(1), |p| {
                container(p)["lastState"]["terminated"]["reason"] == "OOMKilled"
            })
            .await?;
        let deadline = std::time::Instant::now() + Duration::from_mins(1);
        while agent.metric_sum("kubelet_started_containers_errors_total", "container_type=\"container\"").await? < 1.0 {
            ensure!(
                std::time::Instant::now() < deadline,
                "badcmd never failed to start: {}",
                swiftlet_tests::tail(&agent.log(), 30)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }

        // Prometheus: the four endpoints as four jobs, exemplars on, the repo's rules loaded.
        let mut head = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n",
        );
        for f in files(&dashboards_dir().join("rules"), "yaml") {
            writeln!(head, "- {}", f.display())?;
        }
        let prometheus = Prometheus::start(
            &agent.dir.path().join("prometheus"),
            &head,
            agent.host(),
            agent.https_port,
            &["--enable-feature=exemplar-storage"],
        )?;
        let result = check_every_query(prometheus.web, &collector).await;
        // Stop our own Prometheus (by pid) whatever happened.
        prometheus.stop(result)?;
        agent.shutdown(&cri).await
    }

    async fn check_every_query(web: u16, collector: &swiftlet::telemetry::test_collector::TestCollector) -> Result<()> {
        let client = reqwest::Client::new();
        let deadline = std::time::Instant::now() + Duration::from_mins(1);
        loop {
            let up = query(&client, web, "sum(up)").await.unwrap_or_default();
            let n = up.first().and_then(|r| r["value"][1].as_str()).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            if n >= 4.0 {
                break;
            }
            ensure!(std::time::Instant::now() < deadline, "the four endpoints were not all up: {up:?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }

        // The single-valued variables, as Grafana would resolve them.
        let mut single = BTreeMap::new();
        for (name, q) in
            [("job", "count by (job) (kubelet_node_name)"), ("cadvisor_job", "count by (job) (machine_memory_bytes)")]
        {
            let r = query(&client, web, q).await?;
            let value = r.first().and_then(|r| r["metric"]["job"].as_str()).with_context(|| format!("${name}: {q}"))?;
            single.insert(name.to_string(), value.to_string());
        }
        assert_eq!(single["job"], "kubelet");
        assert_eq!(single["cadvisor_job"], "cadvisor");
        // 1 s scrapes: Grafana's $__rate_interval would be 4 s; 30 s is a few scrapes wide
        // at any time of the run.
        let values = Values { rate_interval: "30s", range: "10m", single: &single };

        // (what, expr): the panel queries not expected empty, the variables, the recorded series.
        let mut pending: Vec<(String, String)> = Vec::new();
        for (file, d) in dashboards() {
            for q in queries(&d) {
                if EXPECTED_EMPTY.iter().any(|(uid, title, _)| *uid == q.dashboard && *title == q.panel) {
                    continue;
                }
                let expr = substitute(&q.expr, &d, &values).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
                pending.push((format!("{file}: {} ({})", q.panel, q.ref_id), expr));
            }
            for v in variables(&d) {
                if let Some(query) = variable_query(v) {
                    let expr = substitute(&query, &d, &values).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
                    pending.push((format!("{file}: variable {}", v["name"]), expr));
                }
            }
        }
        let mut records = BTreeSet::new();
        for f in files(&dashboards_dir().join("rules"), "yaml") {
            for g in yaml(&f)["groups"].as_array().into_iter().flatten() {
                for r in g["rules"].as_array().into_iter().flatten() {
                    if let Some(name) = r["record"].as_str() {
                        records.insert(name.to_string());
                    }
                }
            }
        }
        pending.extend(records.into_iter().map(|r| (format!("recording rule {r}"), r)));

        // Series appear with the scrapes and rule evaluations: retry until each has data.
        let deadline = std::time::Instant::now() + Duration::from_mins(2);
        loop {
            let mut still = Vec::new();
            for (what, expr) in pending {
                if query(&client, web, &expr).await?.is_empty() {
                    still.push((what, expr));
                }
            }
            pending = still;
            if pending.is_empty() {
                break;
            }
            if std::time::Instant::now() > deadline {
                let list: Vec<String> = pending.iter().map(|(w, e)| format!("{w}: {e}")).collect();
                bail!("{} queries returned nothing:\n{}", list.len(), list.join("\n"));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }

        // Exemplars: the SLI histogram's, scraped as OpenMetrics, carry the start traces'
        // ids (a start trace is exported when its pod is ready).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let traces: BTreeSet<String> =
                collector.spans().into_iter().filter(|s| s.name == "podStartup").map(|s| s.trace_id).collect();
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
            let v: Value = client
                .get(format!("http://127.0.0.1:{web}/api/v1/query_exemplars"))
                .query(&[
                    ("query", "kubelet_pod_start_sli_duration_seconds_bucket"),
                    ("start", &(now - 3600).to_string()),
                    ("end", &(now + 60).to_string()),
                ])
                .send()
                .await?
                .json()
                .await?;
            let ids: BTreeSet<String> = v["data"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|s| s["exemplars"].as_array().into_iter().flatten())
                .filter_map(|e| e["labels"]["trace_id"].as_str().map(str::to_string))
                .collect();
            if ids.iter().any(|id| traces.contains(id)) {
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "no exemplar of kubelet_pod_start_sli_duration_seconds_bucket is a start trace: exemplars {ids:?}, traces {traces:?}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Ok(())
    }
}
