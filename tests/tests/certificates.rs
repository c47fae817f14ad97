//! End-to-end tests of the agent's certificates on the test bed's real control plane:
//! TLS bootstrap with a bootstrap token (`--bootstrap-kubeconfig`), a denied request,
//! rotation of the client certificate (`rotateCertificates`) with the controller-manager's
//! approver and signer, and serving certificates (`serverTLSBootstrap`), which the
//! controller-manager signs once an admin approves them, as in a kubeadm cluster.
//!
//! The controller-manager's CSR approver is cluster-wide: the rotation test takes its
//! auto-approval of node certificate renewals (kubeadm's
//! `kubeadm:node-autoapprove-certificate-rotation` binding) away for a while and puts it
//! back whatever happens ([`Unapproved`]); tests run one at a time.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams};
use swiftlet_tests::cluster::{Cluster, ClusterNode};
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, tail, testbed_lock};

/// The cluster's CSRs.
async fn csrs(cluster: &Cluster) -> Result<Vec<CertificateSigningRequest>> {
    Ok(Api::<CertificateSigningRequest>::all(cluster.client()).list(&ListParams::default()).await?.items)
}

fn name(csr: &CertificateSigningRequest) -> String {
    csr.metadata.name.clone().unwrap_or_default()
}

fn condition(csr: &CertificateSigningRequest, type_: &str) -> bool {
    csr.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == type_))
}

fn signed(csr: &CertificateSigningRequest) -> bool {
    condition(csr, "Approved") && csr.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some()
}

/// Waits until one of the cluster's CSRs satisfies `pred`; returns it.
async fn wait_csr(
    cluster: &Cluster,
    agent: &Agent,
    secs: u64,
    what: &str,
    pred: impl Fn(&CertificateSigningRequest) -> bool,
) -> Result<CertificateSigningRequest> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(c) = csrs(cluster).await?.into_iter().find(&pred) {
            return Ok(c);
        }
        ensure!(Instant::now() < deadline, "no CSR {what} within {secs} s\n{}", tail(&agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An agent that rotates its client certificate, node `node` on 127.0.0.1 (the node
/// container's address for an agent there), with the credentials of `kubeconfig`.
async fn rotating_agent(kubeconfig: PathBuf, node: &str) -> Result<Agent> {
    let ip = swiftlet_tests::node::node_target()?.map_or("127.0.0.1", |(n, _)| n.address.as_str());
    Agent::start(AgentOptions {
        kubeconfig: Some(kubeconfig),
        node_name: Some(node.to_owned()),
        extra_flags: vec![format!("--node-ip={ip}")],
        extra_config: "rotateCertificates: true\n".into(),
        ..AgentOptions::default()
    })
    .await
}

/// The node's Lease renewal time.
async fn renewed_at(cluster: &Cluster, node: &str) -> Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(cluster.client(), "kube-node-lease").get_opt(node).await?;
    Ok(lease.and_then(|l| l.spec?.renew_time).map(|t| t.0.to_string()))
}

/// Waits until the node renews its Lease after `since` (a renewal is the agent's own
/// write, with its current credentials).
async fn wait_lease_renewal(cluster: &Cluster, agent: &Agent, node: &str, since: Option<String>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = renewed_at(cluster, node).await?;
        if now.is_some() && now != since {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "the Lease was not renewed in 30 s\n{}", tail(&agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn link_target(pki: &Path) -> Result<std::path::PathBuf> {
    Ok(std::fs::read_link(pki.join("kubelet-client-current.pem"))?)
}

/// Waits for the client pair's `-current.pem` link in `pki`, other than `old`.
async fn wait_link(agent: &Agent, pki: &Path, old: Option<&Path>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while link_target(pki).ok().as_deref().is_none_or(|t| Some(t) == old) {
        ensure!(Instant::now() < deadline, "no new kubelet-client-current.pem\n{}", tail(&agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn kubectl_certificate(cluster: &Cluster, verb: &str, csr: &str) -> Result<()> {
    cluster.kubectl_ok(&["certificate", verb, csr])?;
    Ok(())
}

/// A node name of this run (`e2e-` names are swept by later joins if a test fails).
fn node_name(test: &str) -> String {
    format!("e2e-{test}-{:04x}", rand::random::<u16>())
}

/// Stops the agent, and deletes its Node.
async fn stop_unjoined(cluster: &Cluster, agent: Agent, cri: &Cri, node: &str) -> Result<()> {
    agent.shutdown(cri).await?;
    Api::<Node>::all(cluster.client()).delete(node, &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn bootstrap_writes_the_certificate_and_a_restart_keeps_it() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let before: Vec<String> = csrs(&cluster).await?.iter().map(name).collect();
    let mut node = cluster.join("bootstrap-certs", AgentOptions::default()).await?;

    // One request, from the bootstrap token's user, for the node's client certificate,
    // approved and signed by the controller-manager.
    let ours: Vec<_> = csrs(&cluster).await?.into_iter().filter(|c| !before.contains(&name(c))).collect();
    ensure!(ours.len() == 1, "{ours:#?}");
    let csr = &ours[0];
    assert!(name(csr).starts_with("node-csr-"), "{csr:#?}");
    let token_id = cluster.state.bootstrap_token.split('.').next().unwrap_or_default();
    assert_eq!(csr.spec.username.as_deref(), Some(format!("system:bootstrap:{token_id}").as_str()));
    assert_eq!(csr.spec.signer_name, "kubernetes.io/kube-apiserver-client-kubelet");
    assert_eq!(csr.spec.usages.as_deref(), Some(&["digital signature".to_owned(), "client auth".to_owned()][..]));
    assert!(signed(csr), "{csr:#?}");

    // The pair is in the cert dir behind the link, the kubeconfig points at it, the
    // pending key is gone.
    let pki = node.agent.dir.path().join("pki");
    let target = link_target(&pki)?;
    assert!(target.file_name().context("file name")?.to_string_lossy().starts_with("kubelet-client-2"), "{target:?}");
    let written = std::fs::read_to_string(node.kubeconfig())?;
    // The agent names its files by its own paths (the node's, in the node container).
    let current = swiftlet_tests::agent_path(&pki.join("kubelet-client-current.pem"))?.display().to_string();
    assert!(written.contains(&format!("client-certificate: {current}")), "{written}");
    assert!(written.contains(&format!("client-key: {current}")), "{written}");
    assert!(!written.contains(&cluster.state.bootstrap_token), "{written}");
    assert!(!pki.join("kubelet-client.key.tmp").exists());

    // Restarted, the agent keeps its valid certificate: no second request, and its
    // writes get through.
    let since = renewed_at(&cluster, &node.name).await?;
    node.agent.stop()?;
    node.agent.spawn().await?;
    wait_lease_renewal(&cluster, &node.agent, &node.name, since).await?;
    let after: Vec<_> = csrs(&cluster).await?.into_iter().filter(|c| !before.contains(&name(c))).collect();
    assert_eq!(after.len(), 1, "{after:#?}");
    assert_eq!(link_target(&pki)?, target);
    node.leave(&cri).await
}

/// A bootstrap token whose group the controller-manager does not auto-approve, and its
/// Secret and binding; removed when dropped.
struct ManualToken {
    cluster: Cluster,
    id: String,
    secret: String,
}

impl ManualToken {
    const GROUP: &str = "system:bootstrappers:e2e-manual";

    fn create(cluster: &Cluster) -> Result<Self> {
        let alphabet: Vec<char> = "abcdefghijklmnopqrstuvwxyz0123456789".chars().collect();
        let random = |n: usize| (0..n).map(|_| alphabet[rand::random_range(0..alphabet.len())]).collect::<String>();
        let token = Self { cluster: cluster.clone(), id: random(6), secret: random(16) };
        token.apply()?;
        Ok(token)
    }

    fn apply(&self) -> Result<()> {
        let yaml = format!(
            "apiVersion: v1
kind: Secret
metadata: {{name: bootstrap-token-{id}, namespace: kube-system, labels: {{swiftlet.dev/e2e: certificates}}}}
type: bootstrap.kubernetes.io/token
stringData: {{token-id: {id}, token-secret: {secret}, usage-bootstrap-authentication: \"true\", auth-extra-groups: \"{group}\"}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: e2e-manual-bootstrap, labels: {{swiftlet.dev/e2e: certificates}}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: \"system:node-bootstrapper\"}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: Group, name: \"{group}\"}}]
",
            id = self.id,
            secret = self.secret,
            group = Self::GROUP
        );
        self.cluster.kubectl_apply(&yaml)
    }

    fn token(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

impl Drop for ManualToken {
    fn drop(&mut self) {
        let _ = self.cluster.kubectl(&[
            "-n",
            "kube-system",
            "delete",
            "secret,clusterrolebinding",
            "-l",
            "swiftlet.dev/e2e=certificates",
        ]);
        let _ = self.cluster.kubectl(&["delete", "clusterrolebinding", "-l", "swiftlet.dev/e2e=certificates"]);
    }
}

#[tokio::test]
async fn a_denied_bootstrap_request_stops_the_agent_with_the_reason() -> Result<()> {
    let _g = testbed_lock().await;
    let cluster = Cluster::connect().await?;
    let token = ManualToken::create(&cluster)?;
    let files = swiftlet_tests::agent_tempdir("swiftlet-e2e-certs-")?;
    let bootstrap =
        cluster.write_kubeconfig(files.path(), "bootstrap.conf", &format!("    token: {}\n", token.token()))?;
    let kubeconfig = files.path().join("kubelet.conf");
    let started = tokio::spawn(Agent::start(AgentOptions {
        kubeconfig: Some(kubeconfig.clone()),
        node_name: Some(node_name("denied")),
        extra_flags: vec![format!("--bootstrap-kubeconfig={}", swiftlet_tests::agent_path(&bootstrap)?.display())],
        ..AgentOptions::default()
    }));
    // An admin denies the request (kubectl sets reason KubectlDeny).
    let user = format!("system:bootstrap:{}", token.id);
    let deadline = Instant::now() + Duration::from_mins(1);
    let csr = loop {
        if let Some(c) = csrs(&cluster).await?.into_iter().find(|c| c.spec.username.as_deref() == Some(user.as_str())) {
            break c;
        }
        ensure!(Instant::now() < deadline, "the agent asked for no certificate");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!condition(&csr, "Approved"), "auto-approved: {csr:#?}");
    kubectl_certificate(&cluster, "deny", &name(&csr))?;
    let started = started.await?;
    // The agent exited before it made anything but the cgroup root the harness made.
    swiftlet_tests::remove_cgroup_tree(&format!("/swiftlet-e2e-{}", std::process::id()));
    let Err(e) = started else { bail!("the agent started without a certificate") };
    let text = format!("{e:#}");
    assert!(text.contains("denied") && text.contains("KubectlDeny"), "{text}");
    assert!(!kubeconfig.exists(), "no kubeconfig is written without a certificate");
    Api::<CertificateSigningRequest>::all(cluster.client()).delete(&name(&csr), &DeleteParams::default()).await?;
    Ok(())
}

/// kubeadm's binding that lets the controller-manager approve node certificate renewals,
/// taken away while this lives and put back when it is dropped.
struct Unapproved {
    cluster: Cluster,
    saved: String,
}

impl Unapproved {
    const BINDING: &str = "kubeadm:node-autoapprove-certificate-rotation";

    fn take(cluster: &Cluster) -> Result<Self> {
        let saved = cluster.kubectl_ok(&["get", "clusterrolebinding", Self::BINDING, "-o", "json"])?;
        cluster.kubectl_ok(&["delete", "clusterrolebinding", Self::BINDING])?;
        Ok(Self { cluster: cluster.clone(), saved })
    }

    fn put_back(&self) -> Result<()> {
        let mut binding: serde_json::Value = serde_json::from_str(&self.saved)?;
        if let Some(m) = binding["metadata"].as_object_mut() {
            for k in ["resourceVersion", "uid", "creationTimestamp", "managedFields"] {
                m.remove(k);
            }
        }
        self.cluster.kubectl_apply(&binding.to_string())
    }
}

impl Drop for Unapproved {
    fn drop(&mut self) {
        if let Err(e) = self.put_back() {
            eprintln!("could not restore {}: {e:#}", Self::BINDING);
        }
    }
}

#[tokio::test]
async fn the_client_certificate_is_rotated_before_it_expires_and_used_at_once() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let node = node_name("rotate");
    let user = format!("system:node:{node}");
    // Issued 100 s ago for 120 s: rotation is due at 70-90 % of the lifetime, between 16 s
    // ago and 8 s from now, and the retries have 12 s or more before it expires.
    let expires = SystemTime::now() + Duration::from_secs(20);
    let (cert, key) =
        cluster.issue_client_cert(&user, &["system:nodes"], SystemTime::now() - Duration::from_secs(100), expires)?;
    let files = swiftlet_tests::agent_tempdir("swiftlet-e2e-certs-")?;
    let kubeconfig = cluster.write_cert_kubeconfig(files.path(), "kubelet.conf", &cert, &key)?;
    // The first renewal is not approved by the controller-manager: an admin denies it.
    let unapproved = Unapproved::take(&cluster)?;
    let agent = rotating_agent(kubeconfig, &node).await?;
    let ttl = agent.metric("kubelet_certificate_manager_client_ttl_seconds").await?;
    assert!((0.0..=20.0).contains(&ttl), "{ttl}");

    let first = wait_csr(&cluster, &agent, 20, "from the node", |c| c.spec.username.as_deref() == Some(&user)).await?;
    assert_eq!(first.spec.signer_name, "kubernetes.io/kube-apiserver-client-kubelet");
    kubectl_certificate(&cluster, "deny", &name(&first))?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while agent.metric("kubelet_certificate_manager_client_expiration_renew_errors").await? < 1.0 {
        ensure!(Instant::now() < deadline, "no renew error counted\n{}", tail(&agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Auto-approval back: the retry's request is approved and signed by the
    // controller-manager, and the agent takes the new pair.
    unapproved.put_back()?;
    drop(unapproved);
    let second = wait_csr(&cluster, &agent, 30, "approved for the node", |c| {
        c.spec.username.as_deref() == Some(&user) && signed(c)
    })
    .await?;
    assert!(condition(&second, "Approved") && name(&second) != name(&first));
    let pki = agent.dir.path().join("pki");
    wait_link(&agent, &pki, None).await?;
    let ttl = agent.metric("kubelet_certificate_manager_client_ttl_seconds").await?;
    assert!(ttl > 3000.0, "{ttl}");

    // Past the first certificate's end, the agent's writes still get through: they carry
    // the new certificate (the API server checks it on every request).
    let expiry_wait = expires.duration_since(SystemTime::now()).unwrap_or_default() + Duration::from_secs(1);
    tokio::time::sleep(expiry_wait).await;
    let since = renewed_at(&cluster, &node).await?;
    wait_lease_renewal(&cluster, &agent, &node, since).await?;
    let log = agent.log();
    let after_expiry: Vec<_> = log.lines().filter(|l| l.contains("Unauthorized")).collect();
    assert!(after_expiry.is_empty(), "{}", after_expiry.join("\n"));
    for c in [first, second] {
        Api::<CertificateSigningRequest>::all(cluster.client()).delete(&name(&c), &DeleteParams::default()).await?;
    }
    stop_unjoined(&cluster, agent, &cri, &node).await
}

#[tokio::test]
async fn server_tls_bootstrap_serves_a_certificate_from_the_cluster_ca() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let opts = AgentOptions { extra_config: "serverTLSBootstrap: true\n".into(), ..AgentOptions::default() };
    let node: ClusterNode = cluster.join("serving", opts).await?;
    let user = format!("system:node:{}", node.name);
    // The controller-manager does not approve serving certificates by itself: an admin
    // (here the test) does, as in a kubeadm cluster.
    let csr = wait_csr(&cluster, &node.agent, 30, "for serving", |c| {
        c.spec.username.as_deref() == Some(&user) && c.spec.signer_name == "kubernetes.io/kubelet-serving"
    })
    .await?;
    assert_eq!(csr.spec.usages.as_deref(), Some(&["digital signature".to_owned(), "server auth".to_owned()][..]));
    kubectl_certificate(&cluster, "approve", &name(&csr))?;
    wait_csr(&cluster, &node.agent, 30, "signed", |c| name(c) == name(&csr) && signed(c)).await?;

    // A client that trusts only the cluster CA reaches the HTTPS API by the node's name
    // (the API server's own kubelet client does so, with --kubelet-certificate-authority).
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&cluster.state.ca_cert)?)?;
    let pki = cluster.state.dir.join("pki");
    let mut admin = std::fs::read(pki.join("admin.crt"))?;
    admin.extend(std::fs::read(pki.join("admin.key"))?);
    let https = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(ca)
        .identity(reqwest::Identity::from_pem(&admin)?)
        .resolve(&node.name, std::net::SocketAddr::new(node.agent.host().parse()?, node.agent.https_port))
        .timeout(Duration::from_secs(5))
        .build()?;
    let url = format!("https://{}:{}/healthz", node.name, node.agent.https_port);
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        match https.get(&url).send().await {
            Ok(answer) => break answer,
            Err(e) if Instant::now() > deadline => bail!("{e:#}\n{}", tail(&node.agent.log(), 40)),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    assert_eq!(answer.status(), 200);
    let agent_pki = node.agent.dir.path().join("pki");
    assert!(std::fs::read_link(agent_pki.join("kubelet-server-current.pem")).is_ok());
    let ttl = node.agent.metric("kubelet_certificate_manager_server_ttl_seconds").await?;
    assert!(ttl > 3000.0, "{ttl}");
    // The renewal error counter under upstream's name (no `_total`), which the alert reads.
    let (_, metrics) = node.agent.get("/metrics").await?;
    assert!(metrics.lines().any(|l| l == "kubelet_server_expiration_renew_errors 0"), "{metrics}");
    Api::<CertificateSigningRequest>::all(cluster.client()).delete(&name(&csr), &DeleteParams::default()).await?;
    node.leave(&cri).await
}

#[tokio::test]
async fn with_rotation_a_token_kubeconfig_gets_a_certificate_and_then_uses_it() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    // The bootstrap token as a plain kubeconfig token (no --bootstrap-kubeconfig): the
    // certificate manager asks for a certificate with it.
    let files = swiftlet_tests::agent_tempdir("swiftlet-e2e-certs-")?;
    let kubeconfig = cluster.write_kubeconfig(
        files.path(),
        "kubelet.conf",
        &format!("    token: {}\n", cluster.state.bootstrap_token),
    )?;
    let node = node_name("token-rotate");
    let before: Vec<String> = csrs(&cluster).await?.iter().map(name).collect();
    let agent = rotating_agent(kubeconfig, &node).await?;
    let token_id = cluster.state.bootstrap_token.split('.').next().unwrap_or_default();
    let bootstrap_user = format!("system:bootstrap:{token_id}");
    let pki = agent.dir.path().join("pki");
    wait_link(&agent, &pki, None).await?;
    let csr = wait_csr(&cluster, &agent, 30, "signed", |c| {
        !before.contains(&name(c)) && c.spec.username.as_deref() == Some(&bootstrap_user) && signed(c)
    })
    .await?;
    // From then on the agent is the node, by its certificate: the node registers (only
    // the node itself may create it under NodeRestriction) and its Lease is renewed.
    let deadline = Instant::now() + Duration::from_mins(1);
    while Api::<Node>::all(cluster.client()).get_opt(&node).await?.is_none() {
        ensure!(Instant::now() < deadline, "the node never registered\n{}", tail(&agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_lease_renewal(&cluster, &agent, &node, None).await?;
    Api::<CertificateSigningRequest>::all(cluster.client()).delete(&name(&csr), &DeleteParams::default()).await?;
    stop_unjoined(&cluster, agent, &cri, &node).await
}

/// The serving certificate manager against the real API server, without an agent (as the
/// node itself, by a certificate from the cluster CA): it requests nothing before the
/// node has an IP address, and a new certificate when the node's addresses change.
#[tokio::test]
async fn the_serving_certificate_follows_the_node_addresses() -> Result<()> {
    use k8s_openapi::api::core::v1::NodeAddress;
    use swiftlet::certificate::rotation::{CertManager, SERVING};
    use swiftlet::certificate::store::FileStore;

    let _g = testbed_lock().await;
    let cluster = Cluster::connect().await?;
    let node = node_name("addresses");
    let user = format!("system:node:{node}");
    let now = SystemTime::now();
    let (cert, key) = cluster.issue_client_cert(&user, &["system:nodes"], now, now + Duration::from_hours(1))?;
    let files = tempfile::tempdir()?;
    let kubeconfig = cluster.write_cert_kubeconfig(files.path(), "node.conf", &cert, &key)?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::Client::try_from(config)?;
    let dir = tempfile::tempdir()?;
    let address = |type_: &str, address: &str| NodeAddress { type_: type_.into(), address: address.into() };
    let (addresses, observed) = tokio::sync::watch::channel(vec![address("Hostname", &node)]);
    let manager =
        CertManager::new(SERVING, FileStore::new(dir.path(), SERVING.prefix, None), &node, Some(observed), None);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(manager.clone().run(client, shutdown.clone()));
    let ours = async || -> Result<Vec<CertificateSigningRequest>> {
        Ok(csrs(&cluster).await?.into_iter().filter(|c| c.spec.username.as_deref() == Some(&user)).collect())
    };
    // Approves the node's pending requests until the manager holds a pair for `names`.
    let approve_until = async |names: &[&str]| -> Result<()> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut pairs = manager.subscribe();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if pairs.borrow_and_update().as_ref().is_some_and(|p| p.names == names) {
                return Ok(());
            }
            for c in ours().await? {
                if !condition(&c, "Approved") && !condition(&c, "Denied") {
                    kubectl_certificate(&cluster, "approve", &name(&c))?;
                }
            }
            ensure!(Instant::now() < deadline, "no serving pair for {names:?}");
            let _ = tokio::time::timeout(Duration::from_millis(200), pairs.changed()).await;
        }
    };
    // Only once the node has an IP: one request, for its name and that IP.
    addresses.send_replace(vec![address("Hostname", &node), address("InternalIP", "10.0.0.5")]);
    approve_until(&[&node, "10.0.0.5"]).await?;
    assert_eq!(ours().await?.len(), 1, "nothing was requested without an IP");

    // The address changes: a new certificate for the new one, at once.
    addresses.send_replace(vec![address("Hostname", &node), address("InternalIP", "10.0.0.6")]);
    approve_until(&[&node, "10.0.0.6"]).await?;
    let requests = ours().await?;
    assert_eq!(requests.len(), 2);
    shutdown.cancel();
    task.await?;
    for c in requests {
        Api::<CertificateSigningRequest>::all(cluster.client()).delete(&name(&c), &DeleteParams::default()).await?;
    }
    Ok(())
}
