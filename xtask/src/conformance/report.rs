//! What one run of the suite said of each spec, read from ginkgo's JSON report, and the
//! side-by-side table of two agents' runs.
//!
//! Ginkgo's report lists every spec of the suite; those its focus and skip filters left
//! out are `skipped` with no message and are not shown. A spec that skipped itself at run
//! time (`e2eskipper.Skipf`: a missing capability, a provider the suite does not know)
//! is `skipped` with its reason as the failure message, and is shown with it.

use std::{collections::BTreeMap, fmt::Write as _};

use anyhow::{Context as _, Result};
use serde_json::Value;

/// The outcome of one spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// Failed, panicked, timed out, aborted or interrupted: the state and the first line
    /// of the failure.
    Failed(String),
    /// Skipped at run time, with the reason.
    Skipped(String),
}

impl Outcome {
    fn cell(&self) -> String {
        match self {
            Self::Passed => "pass".to_owned(),
            Self::Failed(why) => format!("FAIL: {}", one_line(why)),
            Self::Skipped(why) => format!("skip: {}", one_line(why)),
        }
    }
}

fn one_line(text: &str) -> String {
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let mut out: String = line.chars().take(140).collect();
    if line.chars().count() > 140 {
        out.push('…');
    }
    out.replace('|', "\\|")
}

/// Each spec that ran or skipped itself, by its full text.
pub fn outcomes(report: &str) -> Result<BTreeMap<String, Outcome>> {
    let suites: Vec<Value> = serde_json::from_str(report).context("parsing ginkgo's JSON report")?;
    let mut out = BTreeMap::new();
    for spec in suites.iter().filter_map(|s| s["SpecReports"].as_array()).flatten() {
        if spec["LeafNodeType"] != "It" {
            continue;
        }
        let mut name: Vec<&str> =
            spec["ContainerHierarchyTexts"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        name.push(spec["LeafNodeText"].as_str().unwrap_or_default());
        let message = spec["Failure"]["Message"].as_str().unwrap_or_default();
        let outcome = match spec["State"].as_str().unwrap_or_default() {
            "passed" => Outcome::Passed,
            "skipped" if message.is_empty() => continue,
            "skipped" => Outcome::Skipped(message.to_owned()),
            "pending" => continue,
            state => Outcome::Failed(format!("{state}: {message}")),
        };
        out.insert(name.join(" "), outcome);
    }
    Ok(out)
}

/// Counts of one agent's outcomes: passed, failed, skipped.
pub fn counts(outcomes: &BTreeMap<String, Outcome>) -> (usize, usize, usize) {
    outcomes.values().fold((0, 0, 0), |(p, f, s), o| match o {
        Outcome::Passed => (p + 1, f, s),
        Outcome::Failed(_) => (p, f + 1, s),
        Outcome::Skipped(_) => (p, f, s + 1),
    })
}

/// The specs that pass on `kubelet` and not on `swiftlet`: what the issue's target
/// forbids.
pub fn regressions<'a>(swiftlet: &'a BTreeMap<String, Outcome>, kubelet: &BTreeMap<String, Outcome>) -> Vec<&'a str> {
    kubelet
        .iter()
        .filter(|(_, o)| **o == Outcome::Passed)
        .filter_map(|(name, _)| {
            let ours = swiftlet.get_key_value(name.as_str())?;
            (*ours.1 != Outcome::Passed).then_some(ours.0.as_str())
        })
        .collect()
}

/// The Markdown report: counts per agent, then every spec, each agent's outcome beside
/// the other's (the specs whose outcomes differ first).
pub fn table(runs: &[(&str, &BTreeMap<String, Outcome>)]) -> String {
    let mut out = String::from("| agent | passed | failed | skipped |\n|---|---:|---:|---:|\n");
    for (agent, outcomes) in runs {
        let (p, f, s) = counts(outcomes);
        let _ = writeln!(out, "| {agent} | {p} | {f} | {s} |");
    }
    let mut names: Vec<&String> = runs.iter().flat_map(|(_, o)| o.keys()).collect();
    names.sort();
    names.dedup();
    let differs = |name: &String| {
        let cells: Vec<Option<&Outcome>> = runs.iter().map(|(_, o)| o.get(name)).collect();
        cells.windows(2).any(|w| w[0].map(std::mem::discriminant) != w[1].map(std::mem::discriminant))
    };
    names.sort_by_key(|n| !differs(n));
    let _ = write!(out, "\n| spec |");
    for (agent, _) in runs {
        let _ = write!(out, " {agent} |");
    }
    let _ = write!(out, "\n|---|");
    for _ in runs {
        out.push_str("---|");
    }
    out.push('\n');
    for name in names {
        let mark = if runs.len() > 1 && differs(name) { "**≠** " } else { "" };
        let _ = write!(out, "| {mark}{} |", one_line(name));
        for (_, outcomes) in runs {
            let _ = write!(out, " {} |", outcomes.get(name).map_or_else(|| "—".to_owned(), Outcome::cell));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"[{"SuiteDescription": "Kubernetes e2e suite", "SpecReports": [
        {"LeafNodeType": "BeforeSuite", "State": "passed"},
        {"LeafNodeType": "It", "ContainerHierarchyTexts": ["[sig-node] Probing container"],
         "LeafNodeText": "should be restarted with a exec \"cat /tmp/health\" liveness probe [NodeConformance]",
         "State": "passed"},
        {"LeafNodeType": "It", "ContainerHierarchyTexts": ["[sig-node] Pods"], "LeafNodeText": "should get a host IP",
         "State": "failed", "Failure": {"Message": "timed out waiting for the condition\nmore"}},
        {"LeafNodeType": "It", "ContainerHierarchyTexts": ["[sig-node] AppArmor"], "LeafNodeText": "should enforce",
         "State": "skipped", "Failure": {"Message": "Only supported for node OS distro [gci ubuntu]"}},
        {"LeafNodeType": "It", "ContainerHierarchyTexts": ["[sig-apps] Deployment"], "LeafNodeText": "filtered out",
         "State": "skipped"}
    ]}]"#;

    #[test]
    fn the_report_gives_each_spec_that_ran_or_skipped_itself() {
        let got = outcomes(REPORT).unwrap();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(
            got["[sig-node] Probing container should be restarted with a exec \"cat /tmp/health\" liveness probe \
                 [NodeConformance]"],
            Outcome::Passed
        );
        assert_eq!(
            got["[sig-node] Pods should get a host IP"],
            Outcome::Failed("failed: timed out waiting for the condition\nmore".into())
        );
        assert!(matches!(&got["[sig-node] AppArmor should enforce"], Outcome::Skipped(why) if why.contains("distro")));
        assert_eq!(counts(&got), (1, 1, 1));
    }

    #[test]
    fn the_table_puts_what_differs_first_and_names_the_regressions() {
        let kubelet = outcomes(REPORT).unwrap();
        let mut swiftlet = kubelet.clone();
        let probe = swiftlet.keys().find(|k| k.contains("Probing")).unwrap().clone();
        swiftlet.insert(probe.clone(), Outcome::Failed("failed: restart count 0".into()));
        assert_eq!(regressions(&swiftlet, &kubelet), vec![probe.as_str()]);
        assert!(regressions(&kubelet, &kubelet).is_empty());
        let text = table(&[("swiftlet", &swiftlet), ("kubelet", &kubelet)]);
        assert!(text.contains("| swiftlet | 0 | 2 | 1 |"), "{text}");
        assert!(text.contains("| kubelet | 1 | 1 | 1 |"), "{text}");
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("| ")).skip(3).collect();
        assert!(rows[1].starts_with("| **≠** [sig-node] Probing container"), "{text}");
        assert!(rows[1].ends_with("| FAIL: failed: restart count 0 | pass |"), "{text}");
        assert!(text.contains("| FAIL: failed: timed out waiting for the condition | FAIL:"), "{text}");
    }
}
