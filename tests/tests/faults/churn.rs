//! Pods in churn (issue 26's fault matrix): a warm-up round of 50 static pods, then 3
//! rounds of 50, each created, run and deleted together on a standalone agent. The
//! agent's memory and descriptors come back to their figures after the warm-up with no
//! trend from round to round, and nothing of any pod is left behind (see
//! `swiftlet_tests::chaos`). `cargo xtask chaos churn` runs the same scenario with
//! 1,000 pods after the warm-up.

use anyhow::Result;
use swiftlet_tests::chaos::{self, ChurnPlan};
use swiftlet_tests::testbed_lock;

#[tokio::test]
async fn pods_in_churn_leave_nothing_and_the_agents_memory_back_at_its_baseline() -> Result<()> {
    let _g = testbed_lock().await;
    let report = chaos::churn(ChurnPlan::CI).await?;
    println!("{}", report.summary());
    report.check()
}
