//! `CertificateSigningRequests` (`certificates.k8s.io/v1`): the registry strategy
//! (`pkg/registry/certificates/certificates/strategy.go`) and validation
//! (`pkg/apis/certificates/validation`), and the kubelet signers' checks
//! (`pkg/apis/certificates/v1/helpers.go`) the CSR controller applies.
//!
//! On create the requester's identity goes into `spec.username/uid/groups/extra` and
//! status is cleared. The main resource never changes spec or status (changes are
//! dropped, as upstream); `/status` changes status but the Approved/Denied conditions,
//! and may set `status.certificate` once; `/approval` changes only the conditions.

use std::net::IpAddr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer as _;

use super::auth::UserInfo;
use super::meta;
use super::registry::Part;
use super::status::{FieldError, StatusError};

/// The storage key of the resource.
pub(crate) const STORAGE: &str = "certificatesigningrequests.certificates.k8s.io";

/// The signer of kubelet client certificates.
pub(crate) const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The signer of kubelet serving certificates.
pub(crate) const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// Every usage the API knows (`allValidUsages`).
const VALID_USAGES: &[&str] = &[
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// The parts of a PKCS#10 request the server and the signer look at.
#[derive(Debug, Clone)]
pub(crate) struct ParsedCsr {
    /// The subject, DER-encoded.
    pub subject: Vec<u8>,
    /// The public key, a DER `SubjectPublicKeyInfo`.
    pub spki: Vec<u8>,
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub emails: Vec<String>,
    pub uris: Vec<String>,
}

/// `ParseCSR` and `CheckSignature`: the first PEM block must be a `CERTIFICATE REQUEST`
/// whose signature verifies with its own key.
pub(crate) fn parse_csr(pem: &[u8]) -> Result<ParsedCsr, String> {
    let block = match x509_parser::pem::parse_x509_pem(pem) {
        Ok((_, p)) if p.label == "CERTIFICATE REQUEST" => p,
        _ => return Err("PEM block type must be CERTIFICATE REQUEST".into()),
    };
    let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
        .map_err(|e| format!("x509: malformed certificate request: {e}"))?;
    csr.verify_signature().map_err(|e| format!("x509: invalid signature on certificate request: {e}"))?;
    let info = &csr.certification_request_info;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| a.as_str().unwrap_or_default().to_string();
    let mut out = ParsedCsr {
        subject: info.subject.as_raw().to_vec(),
        spki: info.subject_pki.raw.to_vec(),
        common_name: info.subject.iter_common_name().last().map(text).unwrap_or_default(),
        organizations: info.subject.iter_organization().map(text).collect(),
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        emails: Vec::new(),
        uris: Vec::new(),
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        let ParsedExtension::SubjectAlternativeName(san) = ext else { continue };
        for name in &san.general_names {
            match name {
                GeneralName::DNSName(d) => out.dns_names.push((*d).to_string()),
                GeneralName::RFC822Name(e) => out.emails.push((*e).to_string()),
                GeneralName::URI(u) => out.uris.push((*u).to_string()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => out.ip_addresses.push(IpAddr::from(<[u8; 4]>::try_from(*b).expect("4 bytes"))),
                    16 => out.ip_addresses.push(IpAddr::from(<[u8; 16]>::try_from(*b).expect("16 bytes"))),
                    _ => return Err("x509: certificate request contained IP address of length".into()),
                },
                _ => {}
            }
        }
    }
    Ok(out)
}

/// `spec.request` (a JSON `[]byte`: base64) as bytes.
pub(crate) fn request_bytes(obj: &Value) -> Result<Vec<u8>, StatusError> {
    let b64 = obj.pointer("/spec/request").and_then(Value::as_str).unwrap_or("");
    STANDARD.decode(b64).map_err(|e| {
        StatusError::bad_request(format!(
            "CertificateSigningRequest in version \"v1\" cannot be handled as a CertificateSigningRequest: \
             illegal base64 data in spec.request: {e}"
        ))
    })
}

/// `spec.usages`.
pub(crate) fn usages(obj: &Value) -> Vec<String> {
    obj.pointer("/spec/usages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|u| u.as_str().unwrap_or("").to_string())
        .collect()
}

/// `PrepareForCreate`: who asked, and no status.
pub(crate) fn prepare_for_create(obj: &mut Value, requester: Option<&UserInfo>) -> Result<(), StatusError> {
    request_bytes(obj)?;
    let root = meta::ensure_object(obj);
    let spec = meta::ensure_object(root.entry("spec").or_insert_with(|| json!({})));
    for f in ["username", "uid", "groups", "extra"] {
        spec.remove(f);
    }
    if let Some(u) = requester {
        spec.insert("username".into(), json!(u.username));
        if !u.uid.is_empty() {
            spec.insert("uid".into(), json!(u.uid));
        }
        spec.insert("groups".into(), json!(u.groups));
        if !u.extra.is_empty() {
            spec.insert("extra".into(), json!(u.extra));
        }
    }
    root.insert("status".into(), json!({}));
    Ok(())
}

fn conditions(obj: &Value) -> Vec<Value> {
    obj.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn of_type(conds: &[Value], t: &str) -> Vec<Value> {
    conds.iter().filter(|c| c["type"] == t).cloned().collect()
}

/// Whether the CSR has a condition of type `t` (status True, the only one allowed).
pub(crate) fn has_condition(obj: &Value, t: &str) -> bool {
    conditions(obj).iter().any(|c| c["type"] == t)
}

fn certificate(obj: &Value) -> &str {
    obj.pointer("/status/certificate").and_then(Value::as_str).unwrap_or("")
}

/// `validateCertificate`: PEM `CERTIFICATE` blocks only, each a certificate, at least one.
fn validate_certificate(b64: &str) -> Result<(), String> {
    if b64.is_empty() {
        return Ok(());
    }
    let data = STANDARD.decode(b64).map_err(|e| e.to_string())?;
    let mut blocks = 0;
    for pem in x509_parser::pem::Pem::iter_from_buffer(&data) {
        let Ok(pem) = pem else { break };
        if pem.label != "CERTIFICATE" {
            return Err(format!("only CERTIFICATE PEM blocks are allowed, found {:?}", pem.label));
        }
        x509_parser::parse_x509_certificate(&pem.contents).map_err(|e| format!("x509: {e}"))?;
        blocks += 1;
    }
    if blocks == 0 {
        return Err("must contain at least one CERTIFICATE PEM block".into());
    }
    Ok(())
}

/// `ValidateCertificateSigningRequestSignerName`.
fn validate_signer_name(name: &str) -> Vec<FieldError> {
    let f = "spec.signerName";
    if name.is_empty() {
        return vec![FieldError::required(f, "signerName must be provided")];
    }
    let Some((domain, path)) = name.split_once('/').filter(|(_, p)| !p.contains('/')) else {
        return vec![FieldError::invalid(
            f,
            json!(name),
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        )];
    };
    let mut errs = Vec::new();
    let labels: Vec<&str> = domain.split('.').collect();
    if let Some(bad) = labels.iter().find(|l| !meta::is_dns1123_label(l)) {
        errs.push(FieldError::invalid(f, json!(domain), format!("validating label \"{bad}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character")));
    }
    if labels.len() < 2 {
        errs.push(FieldError::invalid(
            f,
            json!(domain),
            "should be a domain with at least two segments separated by dots",
        ));
    }
    if let Some(bad) = path.split('.').find(|l| !meta::is_dns1123_subdomain(l)) {
        errs.push(FieldError::invalid(f, json!(path), format!("validating label \"{bad}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")));
    }
    errs
}

/// What an update path may change (`certificateValidationOptions`).
#[derive(Clone, Copy, Default)]
struct Opts {
    allow_approval: bool,
    allow_certificate: bool,
    /// The certificate is the stored one (`allowArbitraryCertificate`).
    certificate_unchanged: bool,
}

/// `validateCertificateSigningRequest`.
fn validate(obj: &Value, opts: Opts) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let request = obj.pointer("/spec/request").cloned().unwrap_or(Value::Null);
    let parsed = STANDARD
        .decode(request.as_str().unwrap_or(""))
        .map_err(|e| e.to_string())
        .and_then(|b| parse_csr(&b).map(|_| ()));
    if let Err(e) = parsed {
        errs.push(FieldError::invalid("spec.request", request, e));
    }
    let usages = usages(obj);
    if usages.is_empty() {
        errs.push(FieldError::required("spec.usages", "usages must be provided"));
    }
    for (i, u) in usages.iter().enumerate() {
        if !VALID_USAGES.contains(&u.as_str()) {
            errs.push(FieldError::not_supported(format!("spec.usages[{i}]"), json!(u), VALID_USAGES));
        }
        if usages[..i].contains(u) {
            errs.push(FieldError::duplicate(format!("spec.usages[{i}]"), json!(u)));
        }
    }
    errs.extend(validate_signer_name(meta::str_at(obj, &["spec", "signerName"])));
    if let Some(s) = obj.pointer("/spec/expirationSeconds").and_then(Value::as_i64)
        && s < 600
    {
        errs.push(FieldError::invalid(
            "spec.expirationSeconds",
            json!(s),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    let (mut approved, mut denied) = (false, false);
    let conds = conditions(obj);
    for (i, c) in conds.iter().enumerate() {
        let path = format!("status.conditions[{i}]");
        let t = c["type"].as_str().unwrap_or("");
        if t.is_empty() {
            errs.push(FieldError::required(format!("{path}.type"), ""));
        }
        let status = c["status"].as_str().unwrap_or("");
        let allowed: &[&str] =
            if matches!(t, "Approved" | "Denied" | "Failed") { &["True"] } else { &["False", "True", "Unknown"] };
        if status.is_empty() {
            errs.push(FieldError::required(format!("{path}.status"), ""));
        } else if !allowed.contains(&status) {
            errs.push(FieldError::not_supported(format!("{path}.status"), json!(status), allowed));
        }
        match t {
            "Approved" => approved = true,
            "Denied" => denied = true,
            _ => {}
        }
        if (t == "Approved" && denied) || (t == "Denied" && approved) {
            errs.push(FieldError::invalid(
                format!("{path}.type"),
                json!(t),
                "Approved and Denied conditions are mutually exclusive",
            ));
        }
        if conds[..i].iter().any(|o| o["type"] == t) {
            errs.push(FieldError::duplicate(format!("{path}.type"), json!(t)));
        }
    }
    if !opts.certificate_unchanged
        && let Err(e) = validate_certificate(certificate(obj))
    {
        errs.push(FieldError::invalid("status.certificate", json!("<certificate data>"), e));
    }
    errs
}

/// `ValidateCertificateSigningRequestCreate` (names are free: `ValidateCertificateRequestName`).
pub(crate) fn validate_create(obj: &Value) -> Vec<FieldError> {
    validate(obj, Opts::default())
}

/// `populateConditionTimestamps`.
fn populate_timestamps(new: &mut Value, old: &Value) {
    let now = meta::now();
    let old_conds = conditions(old);
    let Some(conds) = new.pointer_mut("/status/conditions").and_then(Value::as_array_mut) else { return };
    for c in conds.iter_mut().filter(|c| c.is_object()) {
        if c.get("lastUpdateTime").is_none_or(|t| t.is_null() || t == "") {
            c["lastUpdateTime"] = json!(now);
        }
        if c.get("lastTransitionTime").is_none_or(|t| t.is_null() || t == "") {
            let prev = old_conds
                .iter()
                .find(|o| o["type"] == c["type"] && o["status"] == c["status"])
                .and_then(|o| o.get("lastTransitionTime").filter(|t| t.as_str().is_some_and(|s| !s.is_empty())));
            c["lastTransitionTime"] = prev.cloned().unwrap_or_else(|| json!(now));
        }
    }
}

fn set_status_field(obj: &mut Value, field: &str, v: Option<Value>) {
    let status = meta::ensure_object(meta::ensure_object(obj).entry("status").or_insert_with(|| json!({})));
    match v {
        Some(v) => status.insert(field.into(), v),
        None => status.remove(field),
    };
}

/// The strategies' `PrepareForUpdate` and `ValidateUpdate` for `part`.
pub(crate) fn prepare_and_validate_update(part: Part, new: &mut Value, old: &Value) -> Vec<FieldError> {
    let restore = |new: &mut Value, f: &str| match old.get(f) {
        Some(v) => meta::ensure_object(new).insert(f.into(), v.clone()),
        None => meta::ensure_object(new).remove(f),
    };
    let mut opts = Opts::default();
    match part {
        Part::Status => {
            restore(new, "spec");
            // The Approved/Denied instances stay as they were (if their count did not change).
            let mut conds = conditions(new);
            let old_conds = conditions(old);
            for t in ["Approved", "Denied"] {
                let new_i: Vec<usize> = (0..conds.len()).filter(|i| conds[*i]["type"] == t).collect();
                let old_c = of_type(&old_conds, t);
                if new_i.len() == old_c.len() {
                    for (i, c) in new_i.into_iter().zip(old_c) {
                        conds[i] = c;
                    }
                }
            }
            if new.pointer("/status/conditions").is_some() {
                set_status_field(new, "conditions", Some(json!(conds)));
            }
            populate_timestamps(new, old);
            opts.allow_certificate = true;
        }
        Part::Approval => {
            populate_timestamps(new, old);
            let conds = new.pointer("/status/conditions").cloned();
            restore(new, "spec");
            restore(new, "status");
            set_status_field(new, "conditions", conds);
            opts.allow_approval = true;
        }
        _ => {
            restore(new, "spec");
            restore(new, "status");
        }
    }
    opts.certificate_unchanged = certificate(new) == certificate(old);
    let mut errs = validate(new, opts);
    let (new_conds, old_conds) = (conditions(new), conditions(old));
    for t in ["Approved", "Denied", "Failed"] {
        let (n, o) = (of_type(&new_conds, t), of_type(&old_conds, t));
        if n.len() < o.len() {
            errs.push(FieldError::forbidden(
                "status.conditions",
                format!("updates may not remove a condition of type {t:?}"),
            ));
        } else if !opts.allow_approval && t != "Failed" {
            if n.len() > o.len() {
                errs.push(FieldError::forbidden(
                    "status.conditions",
                    format!("updates may not add a condition of type {t:?}"),
                ));
            } else if n != o {
                errs.push(FieldError::forbidden(
                    "status.conditions",
                    format!("updates may not modify a condition of type {t:?}"),
                ));
            }
        }
    }
    if !opts.certificate_unchanged {
        if !opts.allow_certificate {
            errs.push(FieldError::forbidden("status.certificate", "updates may not set certificate content"));
        } else if !certificate(old).is_empty() {
            errs.push(FieldError::forbidden(
                "status.certificate",
                "updates may not modify existing certificate content",
            ));
        }
    }
    errs
}

/// The kubelet signers' checks (`ValidateKubeletClientCSR`, `ValidateKubeletServingCSR`):
/// None for other signers (not recognized), Some(Err) when the request breaks them.
pub(crate) fn validate_kubelet_csr(signer: &str, csr: &ParsedCsr, usages: &[String]) -> Option<Result<(), String>> {
    let set: std::collections::BTreeSet<&str> = usages.iter().map(String::as_str).collect();
    let is = |want: &[&str]| set == want.iter().copied().collect();
    let check = || {
        if csr.organizations != ["system:nodes"] {
            return Err("subject organization is not system:nodes".to_string());
        }
        if signer == KUBELET_CLIENT_SIGNER {
            if !csr.dns_names.is_empty() {
                return Err("DNS subjectAltNames are not allowed".into());
            }
            if !csr.emails.is_empty() {
                return Err("Email subjectAltNames are not allowed".into());
            }
            if !csr.ip_addresses.is_empty() {
                return Err("IP subjectAltNames are not allowed".into());
            }
            if !csr.uris.is_empty() {
                return Err("URI subjectAltNames are not allowed".into());
            }
            if !csr.common_name.starts_with("system:node:") {
                return Err("subject common name does not begin with system:node:".into());
            }
            if !is(&["client auth", "digital signature", "key encipherment"])
                && !is(&["client auth", "digital signature"])
            {
                return Err("usages did not match [client auth digital signature key encipherment]".into());
            }
        } else {
            if csr.dns_names.is_empty() && csr.ip_addresses.is_empty() {
                return Err("DNS or IP subjectAltName is required".into());
            }
            if !csr.emails.is_empty() {
                return Err("Email subjectAltNames are not allowed".into());
            }
            if !csr.uris.is_empty() {
                return Err("URI subjectAltNames are not allowed".into());
            }
            if !is(&["digital signature", "key encipherment", "server auth"])
                && !is(&["digital signature", "server auth"])
            {
                return Err("usages did not match [digital signature key encipherment server auth]".into());
            }
            if !csr.common_name.starts_with("system:node:") {
                return Err("subject common name does not begin with system:node:".into());
            }
        }
        Ok(())
    };
    matches!(signer, KUBELET_CLIENT_SIGNER | KUBELET_SERVING_SIGNER).then(check)
}
