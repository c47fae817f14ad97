//! The values of `authorization.mode` (`KubeletConfiguration`): the configuration's
//! defaults and validation and the HTTPS server's authorizer read the same two strings.

/// `authorization.mode` that allows every authenticated request.
pub const AUTHORIZATION_MODE_ALWAYS_ALLOW: &str = "AlwaysAllow";
/// `authorization.mode` that asks the API server (`SubjectAccessReview`).
pub const AUTHORIZATION_MODE_WEBHOOK: &str = "Webhook";
