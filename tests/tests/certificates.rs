//! End-to-end tests of the agent's client certificate: TLS bootstrap with a bootstrap
//! token (`--bootstrap-kubeconfig`) and rotation (`rotateCertificates`), against the
//! project's test API server with client-certificate authentication and its stand-in
//! for kube-controller-manager's CSR approver and signer.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Result, bail};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use swiftlet_tests::apiserver::{CsrController, Options, TestApiServer, UserInfo};
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, testbed_lock};

const NODE: &str = "e2e-node";
const NODE_USER: &str = "system:node:e2e-node";
const BOOTSTRAP_TOKEN: &str = "abcdef.0123456789abcdef";

async fn api_server(controller: CsrController) -> Result<TestApiServer> {
    let mut tokens = HashMap::new();
    tokens.insert(BOOTSTRAP_TOKEN.to_owned(), UserInfo::new("system:bootstrap:abcdef", &["system:bootstrappers"]));
    Ok(TestApiServer::start(Options { tls: true, tokens, csr_controller: controller, ..Options::default() }).await?)
}

fn approve_and_sign() -> CsrController {
    CsrController::ApproveAndSign { duration: Duration::from_hours(1) }
}

/// Waits until `pred` holds for the server's CSRs; returns them.
async fn wait_csrs(
    api: &TestApiServer,
    secs: u64,
    pred: impl Fn(&[CertificateSigningRequest]) -> bool,
) -> Result<Vec<CertificateSigningRequest>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let csrs = api.list::<CertificateSigningRequest>(None);
        if pred(&csrs) {
            return Ok(csrs);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("CSRs not as expected within {secs} s: {csrs:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn approved(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"))
        && status.and_then(|s| s.certificate.as_ref()).is_some()
}

async fn node_ready(api: &TestApiServer) -> Result<()> {
    api.wait_for::<Node>(None, NODE, Duration::from_mins(1), |n| {
        n.and_then(|n| n.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").cloned())
            .is_some_and(|c| c.status == "True")
    })
    .await?;
    Ok(())
}

/// The answered requests after `seq` (every HTTP request here is the agent's: the test's
/// own reads and the CSR controller go to the store directly).
fn agent_requests(api: &TestApiServer, after_seq: u64) -> Vec<swiftlet_tests::apiserver::RecordedRequest> {
    api.requests().into_iter().filter(|r| r.seq > after_seq && r.status != 0).collect()
}

/// Waits for the client pair's `-current.pem` link in `pki`.
async fn wait_link(agent: &Agent, pki: &Path) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while link_target(pki).is_err() {
        if tokio::time::Instant::now() > deadline {
            bail!("no kubelet-client-current.pem; log:\n{}", agent.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Waits until the agent renews its Lease (a PUT answered 200) after request `seq`.
async fn wait_lease_renewal(api: &TestApiServer, seq: u64) -> Result<()> {
    api.wait_for::<Lease>(Some("kube-node-lease"), NODE, Duration::from_secs(30), |_| {
        agent_requests(api, seq).iter().any(|r| r.path.contains("/leases/") && r.method == "PUT" && r.status == 200)
    })
    .await?;
    Ok(())
}

fn link_target(pki: &Path) -> Result<std::path::PathBuf> {
    Ok(std::fs::read_link(pki.join("kubelet-client-current.pem"))?)
}

#[tokio::test]
async fn bootstrap_token_gets_a_client_certificate_and_the_node_joins_with_it() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let api = api_server(approve_and_sign()).await?;
    let files = tempfile::tempdir()?;
    let bootstrap = api.write_kubeconfig_with_token(files.path(), "bootstrap-kubelet.conf", BOOTSTRAP_TOKEN)?;
    let kubeconfig = files.path().join("kubelet.conf");
    let mut agent = Agent::start(AgentOptions {
        kubeconfig: Some(kubeconfig.clone()),
        extra_flags: vec![format!("--bootstrap-kubeconfig={}", bootstrap.display())],
        ..AgentOptions::default()
    })
    .await?;
    node_ready(&api).await?;

    // One request, from the bootstrap token's user, for the node's client certificate.
    let csrs = api.list::<CertificateSigningRequest>(None);
    assert_eq!(csrs.len(), 1, "{csrs:#?}");
    let csr = &csrs[0];
    assert!(csr.metadata.name.as_deref().unwrap_or_default().starts_with("node-csr-"), "{csr:#?}");
    assert_eq!(csr.spec.username.as_deref(), Some("system:bootstrap:abcdef"));
    assert_eq!(csr.spec.signer_name, "kubernetes.io/kube-apiserver-client-kubelet");
    assert_eq!(csr.spec.usages.as_deref(), Some(&["digital signature".to_owned(), "client auth".to_owned()][..]));
    assert!(approved(csr), "{csr:#?}");

    // The pair is in the cert dir behind the link, the kubeconfig points at it, the
    // pending key is gone.
    let pki = agent.dir.path().join("pki");
    let target = link_target(&pki)?;
    assert!(target.file_name().unwrap().to_string_lossy().starts_with("kubelet-client-2"), "{target:?}");
    let written = std::fs::read_to_string(&kubeconfig)?;
    let current = pki.join("kubelet-client-current.pem").display().to_string();
    assert!(written.contains(&format!("client-certificate: {current}")), "{written}");
    assert!(written.contains(&format!("client-key: {current}")), "{written}");
    assert!(!written.contains(BOOTSTRAP_TOKEN), "{written}");
    assert!(!pki.join("kubelet-client.key.tmp").exists());

    // Everything the agent sent after bootstrap was the node's own, by its certificate.
    let node_posts: Vec<_> =
        agent_requests(&api, 0).into_iter().filter(|r| r.method == "POST" && r.path == "/api/v1/nodes").collect();
    assert!(!node_posts.is_empty());
    assert!(node_posts.iter().all(|r| r.user.as_deref() == Some(NODE_USER)), "{node_posts:#?}");

    // Restarted, the agent keeps its valid certificate: no second request.
    agent.stop()?;
    let seq = api.requests().last().map_or(0, |r| r.seq);
    agent.spawn().await?;
    wait_lease_renewal(&api, seq).await?;
    assert_eq!(api.list::<CertificateSigningRequest>(None).len(), 1);
    assert_eq!(link_target(&pki)?, target);
    let after = agent_requests(&api, seq);
    assert!(after.iter().all(|r| r.user.as_deref() == Some(NODE_USER) && r.status != 401), "{after:#?}");

    agent.shutdown(&cri).await?;
    Ok(())
}

#[tokio::test]
async fn a_denied_bootstrap_request_stops_the_agent_with_the_reason() -> Result<()> {
    let _g = testbed_lock().await;
    let api =
        api_server(CsrController::Deny { reason: "NotThisNode".into(), message: "this node is not expected".into() })
            .await?;
    let files = tempfile::tempdir()?;
    let bootstrap = api.write_kubeconfig_with_token(files.path(), "bootstrap-kubelet.conf", BOOTSTRAP_TOKEN)?;
    let kubeconfig = files.path().join("kubelet.conf");
    let started = Agent::start(AgentOptions {
        kubeconfig: Some(kubeconfig.clone()),
        extra_flags: vec![format!("--bootstrap-kubeconfig={}", bootstrap.display())],
        ..AgentOptions::default()
    })
    .await;
    // The agent exited before it made anything but the cgroup root the harness made.
    swiftlet_tests::remove_cgroup_tree(&format!("/swiftlet-e2e-{}", std::process::id()));
    let Err(e) = started else { bail!("the agent started without a certificate") };
    let text = format!("{e:#}");
    assert!(text.contains("denied") && text.contains("NotThisNode"), "{text}");
    assert!(!kubeconfig.exists(), "no kubeconfig is written without a certificate");
    Ok(())
}

#[tokio::test]
async fn the_client_certificate_is_rotated_before_it_expires_and_used_at_once() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    // The first rotation is refused: the agent counts the error and retries.
    let api = api_server(CsrController::Deny { reason: "NotYet".into(), message: "try again".into() }).await?;
    let files = tempfile::tempdir()?;
    // Issued 100 s ago for 120 s: rotation is due at 70-90 % of the lifetime, between 16 s
    // ago and 8 s from now, and the retries have 12 s or more before it expires.
    let expires = SystemTime::now() + Duration::from_secs(20);
    let (cert, key) = api.issue_client_cert_between(
        NODE_USER,
        &["system:nodes"],
        SystemTime::now() - Duration::from_secs(100),
        expires,
    )?;
    let kubeconfig = api.write_kubeconfig_with_client_cert(files.path(), "kubelet.conf", &cert, &key)?;
    let agent = Agent::start(AgentOptions {
        kubeconfig: Some(kubeconfig),
        extra_config: "rotateCertificates: true\n".into(),
        ..AgentOptions::default()
    })
    .await?;
    node_ready(&api).await?;
    let ttl = agent.metric("kubelet_certificate_manager_client_ttl_seconds").await?;
    assert!((0.0..=20.0).contains(&ttl), "{ttl}");

    // The rotation's first request is denied, and counted.
    let denied = wait_csrs(&api, 20, |csrs| !csrs.is_empty()).await?;
    assert_eq!(denied[0].spec.username.as_deref(), Some(NODE_USER), "requested with the node's own certificate");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while agent.metric("kubelet_certificate_manager_client_expiration_renew_errors").await? < 1.0 {
        if tokio::time::Instant::now() > deadline {
            bail!("no renew error counted; log:\n{}", agent.log());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Approved now: the retry gets the certificate.
    api.set_csr_controller(approve_and_sign());
    wait_csrs(&api, 15, |csrs| csrs.iter().any(approved)).await?;
    let pki = agent.dir.path().join("pki");
    wait_link(&agent, &pki).await?;
    let ttl = agent.metric("kubelet_certificate_manager_client_ttl_seconds").await?;
    assert!(ttl > 3000.0, "{ttl}");

    // Past the first certificate's end, the agent's requests still get through: they
    // carry the new certificate (the server checks the certificate on every request).
    let expiry_wait = expires.duration_since(SystemTime::now()).unwrap_or_default() + Duration::from_secs(1);
    tokio::time::sleep(expiry_wait).await;
    let seq = api.requests().last().map_or(0, |r| r.seq);
    wait_lease_renewal(&api, seq).await?;
    let after = agent_requests(&api, seq);
    assert!(after.iter().all(|r| r.status != 401 && r.user.as_deref() == Some(NODE_USER)), "{after:#?}");
    node_ready(&api).await?;

    agent.shutdown(&cri).await?;
    Ok(())
}

#[tokio::test]
async fn server_tls_bootstrap_serves_a_certificate_from_the_cluster_ca() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let api = api_server(approve_and_sign()).await?;
    let agent = Agent::start(AgentOptions {
        kubeconfig: Some(api.kubeconfig_path().to_path_buf()),
        extra_config: "serverTLSBootstrap: true\n".into(),
        ..AgentOptions::default()
    })
    .await?;
    let csrs = wait_csrs(&api, 30, |csrs| csrs.iter().any(approved)).await?;
    let csr = &csrs[0];
    assert_eq!(csr.spec.signer_name, "kubernetes.io/kubelet-serving");
    assert_eq!(csr.spec.usages.as_deref(), Some(&["digital signature".to_owned(), "server auth".to_owned()][..]));

    // A client that trusts only the cluster CA reaches the HTTPS API by the node's name.
    let ca = reqwest::Certificate::from_pem(api.cluster_ca_pem().as_bytes())?;
    let https = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(ca)
        .resolve(NODE, std::net::SocketAddr::from(([127, 0, 0, 1], agent.https_port)))
        .timeout(Duration::from_secs(5))
        .build()?;
    let url = format!("https://{NODE}:{}/healthz", agent.https_port);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let answer = loop {
        match https.get(&url).send().await {
            Ok(answer) => break answer,
            Err(e) if tokio::time::Instant::now() > deadline => bail!("{e:#}; log:\n{}", agent.log()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    assert_eq!(answer.status(), 200);
    let pki = agent.dir.path().join("pki");
    assert!(std::fs::read_link(pki.join("kubelet-server-current.pem")).is_ok());
    let ttl = agent.metric("kubelet_certificate_manager_server_ttl_seconds").await?;
    assert!(ttl > 3000.0, "{ttl}");
    // The renewal error counter under upstream's name (no `_total`), which the alert reads.
    let (_, metrics) = agent.get("/metrics").await?;
    assert!(metrics.lines().any(|l| l == "kubelet_server_expiration_renew_errors 0"), "{metrics}");

    agent.shutdown(&cri).await?;
    Ok(())
}

#[tokio::test]
async fn with_rotation_a_token_kubeconfig_gets_a_certificate_and_then_uses_it() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let api = api_server(approve_and_sign()).await?;
    let agent = Agent::start(AgentOptions {
        kubeconfig: Some(api.kubeconfig_path().to_path_buf()),
        extra_config: "rotateCertificates: true\n".into(),
        ..AgentOptions::default()
    })
    .await?;
    let csrs = wait_csrs(&api, 30, |csrs| csrs.iter().any(approved)).await?;
    assert_eq!(csrs[0].spec.username.as_deref(), Some("admin"), "requested with the kubeconfig's token");
    let pki = agent.dir.path().join("pki");
    wait_link(&agent, &pki).await?;
    // From then on the agent is the node, by its certificate.
    let seq = api.requests().last().map_or(0, |r| r.seq);
    wait_lease_renewal(&api, seq).await?;
    let after = agent_requests(&api, seq);
    assert!(after.iter().all(|r| r.user.as_deref() == Some(NODE_USER)), "{after:#?}");

    agent.shutdown(&cri).await?;
    Ok(())
}

/// The serving certificate manager against the test API server, without an agent: it
/// requests nothing before the node has an IP address, and a new certificate when the
/// node's addresses change.
#[tokio::test]
async fn the_serving_certificate_follows_the_node_addresses() -> Result<()> {
    use k8s_openapi::api::core::v1::NodeAddress;
    use swiftlet::certificate::rotation::{CertManager, SERVING};
    use swiftlet::certificate::store::FileStore;

    let api = api_server(approve_and_sign()).await?;
    let (cert, key) = api.issue_client_cert(NODE_USER, &["system:nodes"], Duration::from_hours(1))?;
    let client = api.client_with_cert(&cert, &key).await?;
    let dir = tempfile::tempdir()?;
    let address = |type_: &str, address: &str| NodeAddress { type_: type_.into(), address: address.into() };
    let (addresses, observed) = tokio::sync::watch::channel(vec![address("Hostname", NODE)]);
    let manager =
        CertManager::new(SERVING, FileStore::new(dir.path(), SERVING.prefix, None), NODE, Some(observed), None);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(manager.clone().run(client, shutdown.clone()));

    let mut pairs = manager.subscribe();
    let wait_names = async |pairs: &mut tokio::sync::watch::Receiver<_>, names: &[&str]| -> Result<()> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let covered = |p: &Option<std::sync::Arc<swiftlet::certificate::store::Pair>>| {
            p.as_ref().is_some_and(|p| p.names == names)
        };
        tokio::time::timeout(Duration::from_secs(20), pairs.wait_for(covered)).await??;
        Ok(())
    };
    // Only once the node has an IP: one request, for its name and that IP.
    addresses.send_replace(vec![address("Hostname", NODE), address("InternalIP", "10.0.0.5")]);
    wait_names(&mut pairs, &[NODE, "10.0.0.5"]).await?;
    let csrs = api.list::<CertificateSigningRequest>(None);
    assert_eq!(csrs.len(), 1, "nothing was requested without an IP: {csrs:#?}");

    // The address changes: a new certificate for the new one, at once.
    addresses.send_replace(vec![address("Hostname", NODE), address("InternalIP", "10.0.0.6")]);
    wait_names(&mut pairs, &[NODE, "10.0.0.6"]).await?;
    assert_eq!(api.list::<CertificateSigningRequest>(None).len(), 2);
    shutdown.cancel();
    task.await?;
    Ok(())
}
