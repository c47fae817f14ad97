//! Keys, certificate requests and the `CertificateSigningRequest` API (client-go's
//! `util/certificate/csr` and `util/cert.MakeCSR`).

use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use kube::api::{Api, PostParams};
use rcgen::PublicKeyData as _;
use sha2::Digest as _;
use x509_parser::prelude::FromDer as _;

use super::{Error, NODES_GROUP, Result, node_common_name};

/// The signer of kubelets' client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The signer of kubelets' serving certificates.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// Usages asked for an ECDSA client key (upstream's `DefaultKubeletClientGetUsages`: key
/// encipherment only for RSA keys).
pub const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];

/// How long a request may wait for its certificate: 15 minutes during rotation
/// (client-go's `certificateWaitTimeout`), an hour at bootstrap (upstream's bootstrap).
pub const ROTATION_WAIT: Duration = Duration::from_mins(15);
/// See [`ROTATION_WAIT`].
pub const BOOTSTRAP_WAIT: Duration = Duration::from_hours(1);

/// A new ECDSA P-256 key, as upstream's certificate manager makes.
pub fn generate_key() -> Result<rcgen::KeyPair> {
    rcgen::KeyPair::generate().map_err(|e| Error::Generate(e.to_string()))
}

/// A PEM certificate request of `node`'s certificate for `key`, naming `names` (DNS
/// names and IP addresses: a serving certificate's; none for a client certificate).
pub fn node_request(key: &rcgen::KeyPair, node: &str, names: &[String]) -> Result<String> {
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(|e| Error::Generate(e.to_string()))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::OrganizationName, NODES_GROUP);
    params.distinguished_name.push(rcgen::DnType::CommonName, node_common_name(node));
    let request = params.serialize_request(key).map_err(|e| Error::Generate(e.to_string()))?;
    request.pem().map_err(|e| Error::Generate(e.to_string()))
}

/// The bootstrap request's name: `node-csr-` and a digest of the public key, subject and
/// usages (upstream's `digestedName`), so a restarted bootstrap with the same key finds
/// its own pending request instead of making another.
#[must_use]
pub fn digested_name(key: &rcgen::KeyPair, node: &str, usages: &[&str]) -> String {
    let encode = |data: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data);
    let mut hash = sha2::Sha512_256::new();
    let mut write = |data: &[u8]| {
        hash.update(encode(data).as_bytes());
        hash.update(b"|");
    };
    write(&key.subject_public_key_info());
    write(node_common_name(node).as_bytes());
    write(NODES_GROUP.as_bytes());
    for usage in usages {
        write(usage.as_bytes());
    }
    format!("node-csr-{}", encode(&hash.finalize()))
}

/// Creates the request (named `name`, else `csr-` and a generated suffix) and returns
/// its name and uid. When a request of that name exists already and asks for the same
/// key, signer and usages it is taken as ours (a restart during bootstrap); any other is
/// an error.
pub async fn submit(
    client: &kube::Client,
    name: Option<&str>,
    request_pem: &str,
    signer: &str,
    usages: &[&str],
) -> Result<(String, String)> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let mut csr = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(request_pem.as_bytes().to_vec()),
            signer_name: signer.to_owned(),
            usages: Some(usages.iter().map(|u| (*u).to_owned()).collect()),
            ..Default::default()
        },
        ..Default::default()
    };
    match name {
        Some(name) => csr.metadata.name = Some(name.to_owned()),
        None => csr.metadata.generate_name = Some("csr-".to_owned()),
    }
    let created = match api.create(&PostParams::default(), &csr).await {
        Ok(created) => created,
        Err(kube::Error::Api(status)) if status.is_already_exists() && name.is_some() => {
            let name = name.unwrap_or_default();
            let existing = api
                .get(name)
                .await
                .map_err(|source| Error::Api { what: format!("reading the existing request {name}"), source })?;
            if existing.spec.request.0 != csr.spec.request.0 && !same_key(&existing, request_pem) {
                return Err(Error::Refused {
                    name: name.to_owned(),
                    message: "exists already with another key".into(),
                });
            }
            if existing.spec.signer_name != signer || existing.spec.usages != csr.spec.usages {
                return Err(Error::Refused {
                    name: name.to_owned(),
                    message: "exists already with another signer or other usages".into(),
                });
            }
            // Ours from an earlier run, but what it was issued has expired since (the
            // cleaner deletes old requests after an hour; until then the name is taken):
            // replaced by a new request of the same name.
            if let Outcome::Issued(pem) = outcome(&existing)
                && expired(&pem)
            {
                tracing::info!(csr = %name, "the existing request's certificate has expired; requesting anew");
                api.delete(name, &kube::api::DeleteParams::default())
                    .await
                    .map_err(|source| Error::Api { what: format!("deleting the spent request {name}"), source })?;
                api.create(&PostParams::default(), &csr)
                    .await
                    .map_err(|source| Error::Api { what: "creating a certificate signing request".into(), source })?
            } else {
                existing
            }
        }
        Err(source) => return Err(Error::Api { what: "creating a certificate signing request".into(), source }),
    };
    let name = created.metadata.name.clone().unwrap_or_default();
    let uid = created.metadata.uid.clone().unwrap_or_default();
    Ok((name, uid))
}

/// Whether the first certificate of `pem` is past its `notAfter` (or does not parse).
fn expired(pem: &str) -> bool {
    let Some(Ok(der)) = rustls_pemfile::certs(&mut pem.as_bytes()).next() else { return true };
    x509_parser::parse_x509_certificate(&der).map_or(true, |(_, cert)| !cert.validity().is_valid())
}

/// Whether the existing request's public key is the one in `request_pem`.
fn same_key(existing: &CertificateSigningRequest, request_pem: &str) -> bool {
    let key_of = |pem: &[u8]| -> Option<Vec<u8>> {
        let der = rustls_pemfile::read_one_from_slice(pem).ok().flatten()?.0;
        let rustls_pemfile::Item::Csr(der) = der else { return None };
        let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref()).ok()?;
        Some(req.certification_request_info.subject_pki.raw.to_vec())
    };
    match (key_of(&existing.spec.request.0), key_of(request_pem.as_bytes())) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// What a request has come to.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Pending,
    /// Approved and signed: the certificate chain as PEM.
    Issued(String),
    /// Denied or failed: the condition's type, reason and message.
    Refused(String),
}

/// Where `csr` stands: issued once approved with a certificate; refused once denied or
/// failed (upstream's `WaitForCertificate`).
#[must_use]
pub fn outcome(csr: &CertificateSigningRequest) -> Outcome {
    let status = csr.status.as_ref();
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let holds = |type_: &str| conditions.iter().find(|c| c.type_ == type_ && c.status == "True");
    for type_ in ["Denied", "Failed"] {
        if let Some(c) = holds(type_) {
            return Outcome::Refused(format!(
                "{} (reason {:?}, message {:?})",
                type_.to_lowercase(),
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            ));
        }
    }
    let certificate = status.and_then(|s| s.certificate.as_ref()).map(|c| c.0.as_slice()).unwrap_or_default();
    if holds("Approved").is_some() && !certificate.is_empty() {
        return Outcome::Issued(String::from_utf8_lossy(certificate).into_owned());
    }
    Outcome::Pending
}

/// Waits until the request `name` (of `uid`) is issued, and returns the certificate.
pub async fn wait_for_certificate(client: &kube::Client, name: &str, uid: &str, limit: Duration) -> Result<String> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let settled = |csr: Option<&CertificateSigningRequest>| {
        csr.is_none_or(|c| c.metadata.uid.as_deref() != Some(uid) || outcome(c) != Outcome::Pending)
    };
    let waited = tokio::time::timeout(limit, kube::runtime::wait::await_condition(api, name, settled)).await;
    let refused = |message: &str| Error::Refused { name: name.to_owned(), message: message.to_owned() };
    match waited {
        Err(_) => Err(Error::Timeout { name: name.to_owned(), secs: limit.as_secs() }),
        Ok(Err(e)) => Err(refused(&format!("watching it: {e}"))),
        Ok(Ok(None)) => Err(refused("was deleted while waiting for its certificate")),
        Ok(Ok(Some(csr))) if csr.metadata.uid.as_deref() != Some(uid) => {
            Err(refused("was replaced by another request of the same name"))
        }
        Ok(Ok(Some(csr))) => match outcome(&csr) {
            Outcome::Issued(pem) => Ok(pem),
            Outcome::Refused(why) => Err(refused(&format!("was {why}"))),
            Outcome::Pending => Err(refused("still pending")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};

    fn with(conditions: &[(&str, &str)], cert: &str) -> CertificateSigningRequest {
        CertificateSigningRequest {
            status: Some(CertificateSigningRequestStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| CertificateSigningRequestCondition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            reason: Some("R".into()),
                            message: Some("M".into()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                certificate: (!cert.is_empty()).then(|| k8s_openapi::ByteString(cert.as_bytes().to_vec())),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn outcome_needs_approval_and_a_certificate_and_a_denial_wins() {
        assert_eq!(outcome(&CertificateSigningRequest::default()), Outcome::Pending);
        assert_eq!(outcome(&with(&[("Approved", "True")], "")), Outcome::Pending);
        assert_eq!(outcome(&with(&[("Approved", "False")], "PEM")), Outcome::Pending);
        assert_eq!(outcome(&with(&[("Approved", "True")], "PEM")), Outcome::Issued("PEM".into()));
        assert_eq!(
            outcome(&with(&[("Approved", "True"), ("Failed", "True")], "PEM")),
            Outcome::Refused("failed (reason \"R\", message \"M\")".into())
        );
        assert!(matches!(outcome(&with(&[("Denied", "True")], "")), Outcome::Refused(w) if w.starts_with("denied")));
    }

    #[test]
    fn an_expired_or_unreadable_certificate_counts_as_expired() {
        let (old, _) = crate::certificate::store::pair_pem("system:node:n1", -7200, -60);
        let (current, _) = crate::certificate::store::pair_pem("system:node:n1", -60, 3600);
        assert!(expired(&old));
        assert!(!expired(&current));
        assert!(expired("not a certificate"));
    }

    #[test]
    fn the_request_names_the_node_and_the_digest_follows_the_key() {
        let key = generate_key().unwrap();
        let pem = node_request(&key, "n1", &[]).unwrap();
        let der = rustls_pemfile::read_one_from_slice(pem.as_bytes()).unwrap().unwrap().0;
        let rustls_pemfile::Item::Csr(der) = der else { panic!("not a CSR: {pem}") };
        let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref()).unwrap();
        let subject = req.certification_request_info.subject.to_string();
        assert!(subject.contains("CN=system:node:n1") && subject.contains("O=system:nodes"), "{subject}");

        assert!(req.requested_extensions().is_none_or(|mut e| e.next().is_none()), "a client request names nothing");
        let serving = node_request(&key, "n1", &["n1".into(), "10.0.0.5".into()]).unwrap();
        let der = rustls_pemfile::read_one_from_slice(serving.as_bytes()).unwrap().unwrap().0;
        let rustls_pemfile::Item::Csr(der) = der else { panic!("not a CSR: {serving}") };
        let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref()).unwrap();
        let sans: Vec<String> = req
            .requested_extensions()
            .into_iter()
            .flatten()
            .filter_map(|e| match e {
                x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) => Some(san),
                _ => None,
            })
            .flat_map(|san| san.general_names.iter().map(|n| format!("{n}")))
            .collect();
        assert_eq!(sans, vec!["DNSName(n1)".to_owned(), "IPAddress(0a:00:00:05)".to_owned()]);

        let name = digested_name(&key, "n1", CLIENT_USAGES);
        assert!(name.starts_with("node-csr-") && name.len() > 40, "{name}");
        assert_eq!(name, digested_name(&key, "n1", CLIENT_USAGES));
        assert_ne!(name, digested_name(&key, "n2", CLIENT_USAGES));
        assert_ne!(name, digested_name(&generate_key().unwrap(), "n1", CLIENT_USAGES));
    }
}
