//! The kube-controller-manager's CSR controllers, as a test control: the approver
//! (`pkg/controller/certificates/approver/sarapprove.go`, without its
//! `SubjectAccessReviews`: the test decides) and the signer
//! (`pkg/controller/certificates/signer`) for the kubelet signers, signing with the
//! cluster CA.
//!
//! It runs while the server runs, driven by the store's events (and a full pass at
//! start, on a change of [`CsrController`] and when it falls behind), and writes
//! through the `/approval` and `/status` rules, one write per step as the real
//! controllers: approval, then the certificate (or a `Failed` condition).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::certificates::{self, KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER, STORAGE};
use super::registry::{self, Ctx, Part};
use super::resources::{self, ResourceInfo};
use super::store::{Data, EventType};
use super::tls::{ClusterCa, Leaf};
use super::{Shared, meta};

/// What the stand-in kube-controller-manager does with pending CSRs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CsrController {
    /// Nothing: CSRs stay pending, as in a cluster without a controller-manager (the
    /// default).
    #[default]
    Off,
    /// Approve (`AutoApproved`) the pending CSRs of the kubelet signers
    /// (`kubernetes.io/kube-apiserver-client-kubelet`, `kubernetes.io/kubelet-serving`)
    /// and sign them with the cluster CA for `duration` at most (`--cluster-signing-
    /// duration`; `spec.expirationSeconds` may shorten it). Requests that break the
    /// signer's rules get a `Failed` condition. CSRs of other signers stay pending.
    /// (The real approver approves only kubelet client CSRs, after a
    /// `SubjectAccessReview`, and leaves ones that break the rules pending.)
    ApproveAndSign { duration: Duration },
    /// Deny every pending CSR, whatever its signer, with this reason and message.
    Deny { reason: String, message: String },
}

/// The signer's backdate of `NotBefore` (and of `NotAfter` for long-lived certificates).
const BACKDATE: i64 = 5 * 60;
/// Certificates shorter-lived than this are not backdated at the end (`Short`).
const SHORT: i64 = 8 * 3600;

fn info() -> &'static ResourceInfo {
    resources::find("certificates.k8s.io", "v1", "certificatesigningrequests").expect("served")
}

/// Runs until `cancel`.
pub(crate) async fn run(shared: Arc<Shared>, cancel: CancellationToken) {
    let mut ctl = shared.csr_controller.subscribe();
    let mut events = shared.store.lock().subscribe();
    let mut current = ctl.borrow_and_update().clone();
    reconcile_all(&shared, &current);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            r = ctl.changed() => {
                if r.is_err() {
                    return;
                }
                current = ctl.borrow_and_update().clone();
                reconcile_all(&shared, &current);
            }
            e = events.recv() => match e {
                Ok(ev) if ev.storage == STORAGE && ev.kind != EventType::Deleted => {
                    let name = meta::name(&ev.object).to_string();
                    reconcile(&mut shared.store.lock(), &shared.ca, &current, &name);
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => reconcile_all(&shared, &current),
                Err(RecvError::Closed) => return,
            },
        }
    }
}

fn reconcile_all(shared: &Shared, ctl: &CsrController) {
    if *ctl == CsrController::Off {
        return;
    }
    let mut d = shared.store.lock();
    let names: Vec<String> = d.iter(STORAGE, None).map(|o| meta::name(o).to_string()).collect();
    for n in names {
        reconcile(&mut d, &shared.ca, ctl, &n);
    }
}

/// Appends a condition through `part`'s rules.
fn add_condition(d: &mut Data, name: &str, part: Part, condition: Value) {
    let _ = registry::update(d, Ctx::default(), info(), None, name, part, false, |cur| {
        let mut next = cur.cloned().unwrap_or_default();
        let status = meta::ensure_object(meta::ensure_object(&mut next).entry("status").or_insert_with(|| json!({})));
        let conds = status.entry("conditions").or_insert_with(|| json!([]));
        if let Some(a) = conds.as_array_mut() {
            a.push(condition);
        }
        Ok(next)
    });
}

fn reconcile(d: &mut Data, ca: &ClusterCa, ctl: &CsrController, name: &str) {
    let Some(csr) = d.get(STORAGE, &(String::new(), name.to_string())) else { return };
    let has = |t: &str| certificates::has_condition(&csr, t);
    let signer = meta::str_at(&csr, &["spec", "signerName"]).to_string();
    let kubelet_signer = matches!(signer.as_str(), KUBELET_CLIENT_SIGNER | KUBELET_SERVING_SIGNER);
    let now = meta::now();
    if matches!(ctl, CsrController::ApproveAndSign { .. }) && !kubelet_signer {
        // Another signer's CSR: another controller's business.
        return;
    }
    match ctl {
        CsrController::Deny { reason, message } => {
            if !has("Approved") && !has("Denied") {
                let c = json!({ "type": "Denied", "status": "True", "reason": reason, "message": message,
                                "lastUpdateTime": now });
                add_condition(d, name, Part::Approval, c);
            }
        }
        CsrController::ApproveAndSign { duration } => {
            if !has("Approved") && !has("Denied") {
                let what = if signer == KUBELET_CLIENT_SIGNER { "client" } else { "serving" };
                let c = json!({ "type": "Approved", "status": "True", "reason": "AutoApproved",
                                "message": format!("Auto approving kubelet {what} certificate after SubjectAccessReview."),
                                "lastUpdateTime": now });
                // The signer sees the approval as its own event.
                add_condition(d, name, Part::Approval, c);
                return;
            }
            let issued = !meta::str_at(&csr, &["status", "certificate"]).is_empty();
            if has("Approved") && !has("Denied") && !has("Failed") && !issued {
                sign(d, ca, &csr, name, &signer, *duration);
            }
        }
        CsrController::Off => {}
    }
}

/// The signer's `handle`: a `Failed` condition for a request its signer does not accept,
/// otherwise the certificate.
fn sign(d: &mut Data, ca: &ClusterCa, csr: &Value, name: &str, signer: &str, duration: Duration) {
    let usages = certificates::usages(csr);
    let parsed = certificates::request_bytes(csr)
        .map_err(|e| e.message)
        .and_then(|b| certificates::parse_csr(&b))
        .and_then(|p| match certificates::validate_kubelet_csr(signer, &p, &usages) {
            Some(Err(e)) => Err(e),
            _ => Ok(p),
        });
    let p = match parsed {
        Ok(p) => p,
        Err(e) => {
            let c = json!({ "type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                            "message": e, "lastUpdateTime": meta::now() });
            add_condition(d, name, Part::Status, c);
            return;
        }
    };
    let now = jiff::Timestamp::now().as_second();
    let mut ttl = duration.as_secs() as i64;
    if let Some(s) = csr.pointer("/spec/expirationSeconds").and_then(Value::as_i64) {
        ttl = ttl.min(s);
    }
    let not_after = if ttl < SHORT { now + ttl } else { now + ttl - BACKDATE };
    let mut sans: Vec<rcgen::SanType> = Vec::new();
    for n in &p.dns_names {
        if let Ok(s) = n.clone().try_into() {
            sans.push(rcgen::SanType::DnsName(s));
        }
    }
    sans.extend(p.ip_addresses.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
    let (key_usages, extended_key_usages) = key_usages(&usages);
    let leaf = Leaf {
        subject: &p.subject,
        spki: &p.spki,
        sans,
        key_usages,
        extended_key_usages,
        not_before: now - BACKDATE,
        not_after,
    };
    let Ok(der) = ca.issue(&leaf) else { return };
    let pem = super::tls::pem("CERTIFICATE", &der);
    let _ = registry::update(d, Ctx::default(), info(), None, name, Part::Status, false, |cur| {
        let mut next = cur.cloned().unwrap_or_default();
        meta::ensure_object(meta::ensure_object(&mut next).entry("status").or_insert_with(|| json!({})))
            .insert("certificate".into(), json!(STANDARD.encode(pem)));
        Ok(next)
    });
}

/// `keyUsagesFromStrings`.
fn key_usages(usages: &[String]) -> (Vec<rcgen::KeyUsagePurpose>, Vec<rcgen::ExtendedKeyUsagePurpose>) {
    use rcgen::ExtendedKeyUsagePurpose as E;
    use rcgen::KeyUsagePurpose as K;
    let (mut ku, mut eku) = (Vec::new(), Vec::new());
    for u in usages {
        match u.as_str() {
            "signing" | "digital signature" => ku.push(K::DigitalSignature),
            "content commitment" => ku.push(K::ContentCommitment),
            "key encipherment" => ku.push(K::KeyEncipherment),
            "key agreement" => ku.push(K::KeyAgreement),
            "data encipherment" => ku.push(K::DataEncipherment),
            "cert sign" => ku.push(K::KeyCertSign),
            "crl sign" => ku.push(K::CrlSign),
            "encipher only" => ku.push(K::EncipherOnly),
            "decipher only" => ku.push(K::DecipherOnly),
            "any" => eku.push(E::Any),
            "server auth" => eku.push(E::ServerAuth),
            "client auth" => eku.push(E::ClientAuth),
            "code signing" => eku.push(E::CodeSigning),
            "email protection" | "s/mime" => eku.push(E::EmailProtection),
            "timestamping" => eku.push(E::TimeStamping),
            "ocsp signing" => eku.push(E::OcspSigning),
            _ => {}
        }
    }
    ku.dedup();
    eku.dedup();
    (ku, eku)
}
