//! `metav1.Status` errors as the real API server writes them: the same codes, reasons,
//! messages and `details` (apimachinery `pkg/api/errors`), so client code that matches on
//! `reason` or `code` behaves as it would against a real cluster.

use serde_json::{Value, json};

use super::resources::ResourceInfo;

/// The optimistic-lock message of apimachinery's `OptimisticLockErrorMsg`.
pub const OPTIMISTIC_LOCK_MSG: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// A failed request: what the server answers with a `Status` body.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct StatusError {
    /// The HTTP status code (also `Status.code`).
    pub code: u16,
    /// `Status.reason` (`NotFound`, `Conflict`, ...).
    pub reason: String,
    /// `Status.message`.
    pub message: String,
    /// `Status.details`, when the real server sets them.
    pub details: Option<Value>,
}

impl StatusError {
    pub(crate) fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self { code, reason: reason.into(), message: message.into(), details: None }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The `Status` object of this error.
    #[must_use]
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }

    fn resource_details(info: &ResourceInfo, name: &str) -> Value {
        let mut d = json!({ "name": name, "kind": info.plural });
        if !info.group.is_empty() {
            d["group"] = json!(info.group);
        }
        d
    }

    pub(crate) fn not_found(info: &ResourceInfo, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{name}\" not found", info.group_resource()))
            .with_details(Self::resource_details(info, name))
    }

    pub(crate) fn namespace_not_found(ns: &str) -> Self {
        Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
            .with_details(json!({ "name": ns, "kind": "namespaces" }))
    }

    pub(crate) fn already_exists(info: &ResourceInfo, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", info.group_resource()))
            .with_details(Self::resource_details(info, name))
    }

    pub(crate) fn conflict(info: &ResourceInfo, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {} \"{name}\": {why}", info.group_resource()),
        )
        .with_details(Self::resource_details(info, name))
    }

    /// `NewInvalid`: 422 with one cause per field error (`field`, `FieldValue...` reason).
    pub(crate) fn invalid(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Self {
        let list = errors.iter().map(FieldError::to_string).collect::<Vec<_>>();
        let msg = if list.len() == 1 {
            format!("{kind} \"{name}\" is invalid: {}", list[0])
        } else {
            format!("{kind} \"{name}\" is invalid: [{}]", list.join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({ "reason": e.kind.reason(), "message": e.detail_message(), "field": e.field }))
            .collect();
        let mut d = json!({ "name": name, "kind": kind, "causes": causes });
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        Self::new(422, "Invalid", msg).with_details(d)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(crate) fn forbidden(info: &ResourceInfo, name: &str, why: &str) -> Self {
        Self::new(403, "Forbidden", format!("{} \"{name}\" is forbidden: {why}", info.group_resource()))
            .with_details(Self::resource_details(info, name))
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
            .with_details(json!({}))
    }

    pub(crate) fn no_such_resource() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource").with_details(json!({}))
    }

    pub(crate) fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, \
                 application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// `NewResourceExpired`: 410 with reason `Expired`.
    pub(crate) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub(crate) fn internal(message: &str) -> Self {
        Self::new(500, "InternalError", format!("Internal error occurred: {message}"))
            .with_details(json!({ "causes": [{ "message": message }] }))
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// `NewTooLargeResourceVersionError`: what the watch cache answers for a resourceVersion
    /// it has not reached.
    pub(crate) fn too_large_resource_version(requested: u64, current: u64) -> Self {
        Self::new(504, "Timeout", format!("Too large resource version: {requested}, current: {current}")).with_details(
            json!({ "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }], "retryAfterSeconds": 1 }),
        )
    }

    /// A failure injected by the test (see [`super::Failure`]).
    pub(crate) fn injected(code: u16) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            410 => "Expired",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        Self::new(code, reason, format!("injected failure ({code})"))
    }
}

/// The kinds of `field.Error` the double reports (apimachinery `util/validation/field`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FieldErrorKind {
    Required,
    Invalid,
    Forbidden,
    Duplicate,
    NotSupported,
    NotFound,
}

impl FieldErrorKind {
    fn reason(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::Forbidden => "FieldValueForbidden",
            Self::Duplicate => "FieldValueDuplicate",
            Self::NotSupported => "FieldValueNotSupported",
            Self::NotFound => "FieldValueNotFound",
        }
    }
}

/// One validation error, printed as the real `field.Error` is.
#[derive(Clone, Debug)]
pub(crate) struct FieldError {
    pub kind: FieldErrorKind,
    pub field: String,
    pub value: Option<Value>,
    pub detail: String,
}

impl FieldError {
    pub(crate) fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { kind: FieldErrorKind::Required, field: field.into(), value: None, detail: detail.into() }
    }
    pub(crate) fn invalid(field: impl Into<String>, value: Value, detail: impl Into<String>) -> Self {
        Self { kind: FieldErrorKind::Invalid, field: field.into(), value: Some(value), detail: detail.into() }
    }
    pub(crate) fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { kind: FieldErrorKind::Forbidden, field: field.into(), value: None, detail: detail.into() }
    }
    pub(crate) fn duplicate(field: impl Into<String>, value: Value) -> Self {
        Self { kind: FieldErrorKind::Duplicate, field: field.into(), value: Some(value), detail: String::new() }
    }

    /// `field.NotFound`: the value names nothing that exists.
    pub(crate) fn not_found(field: impl Into<String>, value: Value) -> Self {
        Self { kind: FieldErrorKind::NotFound, field: field.into(), value: Some(value), detail: String::new() }
    }

    /// `field.NotSupported`: the value and the supported ones.
    pub(crate) fn not_supported(field: impl Into<String>, value: Value, supported: &[&str]) -> Self {
        let list = supported.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
        Self {
            kind: FieldErrorKind::NotSupported,
            field: field.into(),
            value: Some(value),
            detail: format!("supported values: {list}"),
        }
    }

    fn detail_message(&self) -> String {
        let head = match self.kind {
            FieldErrorKind::Required => "Required value".to_string(),
            FieldErrorKind::Forbidden => "Forbidden".to_string(),
            FieldErrorKind::Duplicate => format!("Duplicate value: {}", self.value.clone().unwrap_or(Value::Null)),
            FieldErrorKind::Invalid => {
                format!("Invalid value: {}", self.value.clone().unwrap_or(Value::Null))
            }
            FieldErrorKind::NotSupported => {
                format!("Unsupported value: {}", self.value.clone().unwrap_or(Value::Null))
            }
            FieldErrorKind::NotFound => format!("Not found: {}", self.value.clone().unwrap_or(Value::Null)),
        };
        if self.detail.is_empty() { head } else { format!("{head}: {}", self.detail) }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail_message())
    }
}
