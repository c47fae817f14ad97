//! Webhook authentication and authorization through the API server, as the kubelet's
//! delegating authenticator/authorizer (`k8s.io/apiserver/plugin/pkg/authenticator/token/webhook`,
//! `.../authorizer/webhook`):
//!
//! - [`TokenReviewAuthenticator`]: `POST /apis/authentication.k8s.io/v1/tokenreviews` with
//!   the bearer token and no audiences (the kubelet sets none, so the API server checks
//!   the token against its own audiences). `status.authenticated` gives the user
//!   (`username`, `uid`, `groups`, `extra`); not authenticated with a `status.error` is an
//!   error (401, not cached), without one a rejected token (401, cached).
//! - [`SubjectAccessReviewAuthorizer`]: `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`
//!   with the user, uid, groups and extra, and `resourceAttributes` {verb, version `v1`,
//!   resource `nodes`, subresource, name: the node}. `status.allowed` allows; anything
//!   else (denied or no opinion) is a denial.
//!
//! Both retry what upstream retries (`webhook.DefaultShouldRetry`: 429, 500, 504, and
//! failures to reach the server; here 503 too) with upstream's backoff (500 ms, ×1.5,
//! 20 % jitter, 5 attempts), all within [`REVIEW_TIMEOUT`] (upstream's
//! `TokenAccessReviewTimeout`; upstream's authorizer has none, here it has the same). They
//! go through the agent's API client, so `kubeAPIQPS` applies to them as upstream.
//! The caching is [`super::cache`]'s. Tokens are never logged: errors name the review,
//! not the token.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use super::auth::{Authorizer, Decision, RequestAttributes, ReviewError, TokenAuthenticator, UserInfo};

/// Time a review may take, retries included.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

const TOKEN_REVIEW: &str = "TokenReview";
const SUBJECT_ACCESS_REVIEW: &str = "SubjectAccessReview";

/// Upstream `DefaultAuthWebhookRetryBackoff`: first delay, factor, jitter, attempts.
const RETRY_INITIAL: Duration = Duration::from_millis(500);
const RETRY_FACTOR: f64 = 1.5;
const RETRY_JITTER: f64 = 0.2;
const RETRY_ATTEMPTS: u32 = 5;

/// Whether a failed review is worth another attempt.
fn retryable(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 429 | 500 | 503 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Runs `attempt` until it succeeds, fails for good, runs out of attempts or of
/// [`REVIEW_TIMEOUT`].
async fn with_retries<T, F, Fut>(review: &'static str, mut attempt: F) -> Result<T, ReviewError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + REVIEW_TIMEOUT;
    let timeout = ReviewError::Timeout { review, timeout: REVIEW_TIMEOUT };
    let mut delay = RETRY_INITIAL;
    for attempt_number in 1..=RETRY_ATTEMPTS {
        let error = match tokio::time::timeout_at(deadline, attempt()).await {
            Err(_) => return Err(timeout),
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => error,
        };
        if attempt_number == RETRY_ATTEMPTS || !retryable(&error) {
            return Err(ReviewError::Api { review, source: error.into() });
        }
        tracing::debug!(review, %error, attempt = attempt_number, "retrying the review");
        let jittered = delay.mul_f64(1.0 + RETRY_JITTER * rand::random::<f64>());
        if Instant::now() + jittered >= deadline {
            return Err(timeout);
        }
        tokio::time::sleep(jittered).await;
        delay = delay.mul_f64(RETRY_FACTOR);
    }
    unreachable!("the last attempt returns")
}

/// Bearer tokens checked with `TokenReview` (see the module docs). Wrap it in a
/// [`super::CachedTokenAuthenticator`].
#[derive(Clone)]
pub struct TokenReviewAuthenticator {
    client: kube::Client,
}

impl std::fmt::Debug for TokenReviewAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuthenticator").finish_non_exhaustive()
    }
}

impl TokenReviewAuthenticator {
    /// Reviews tokens through `client`.
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

/// The user a `TokenReview` answered with, or what it said.
fn token_review_outcome(review: TokenReview) -> Result<Option<UserInfo>, ReviewError> {
    let status = review.status.unwrap_or_default();
    if status.authenticated == Some(true) {
        let user = status.user.unwrap_or_default();
        return Ok(Some(UserInfo {
            name: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        }));
    }
    match status.error.filter(|e| !e.is_empty()) {
        Some(message) => Err(ReviewError::Rejected { review: TOKEN_REVIEW, message }),
        None => Ok(None),
    }
}

#[async_trait::async_trait]
impl TokenAuthenticator for TokenReviewAuthenticator {
    async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let request = TokenReview {
            spec: TokenReviewSpec { token: token.to_owned(), audiences: None },
            ..TokenReview::default()
        };
        let params = PostParams::default();
        let answer = with_retries(TOKEN_REVIEW, || api.create(&params, &request)).await?;
        token_review_outcome(answer)
    }
}

/// Decisions asked of the API server with `SubjectAccessReview` (see the module docs).
/// Wrap it in a [`super::CachedAuthorizer`].
#[derive(Clone)]
pub struct SubjectAccessReviewAuthorizer {
    client: kube::Client,
}

impl std::fmt::Debug for SubjectAccessReviewAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectAccessReviewAuthorizer").finish_non_exhaustive()
    }
}

impl SubjectAccessReviewAuthorizer {
    /// Asks through `client`.
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

/// The review the kubelet sends for `attributes`.
fn subject_access_review(attributes: &RequestAttributes) -> SubjectAccessReview {
    let user = &attributes.user;
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
            groups: Some(user.groups.clone()).filter(|g| !g.is_empty()),
            extra: Some(user.extra.clone()).filter(|e| !e.is_empty()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(attributes.verb.clone()),
                version: Some("v1".to_owned()),
                resource: Some("nodes".to_owned()),
                subresource: Some(attributes.subresource.clone()),
                name: Some(attributes.name.clone()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

#[async_trait::async_trait]
impl Authorizer for SubjectAccessReviewAuthorizer {
    async fn authorize(&self, attributes: &RequestAttributes) -> Result<Decision, ReviewError> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let request = subject_access_review(attributes);
        let params = PostParams::default();
        let answer = with_retries(SUBJECT_ACCESS_REVIEW, || api.create(&params, &request)).await?;
        let status = answer.status.unwrap_or_default();
        if status.allowed {
            return Ok(Decision::Allow);
        }
        let mut reason = status.reason.unwrap_or_default();
        if let Some(error) = status.evaluation_error.filter(|e| !e.is_empty()) {
            reason = format!("{reason} (evaluation error: {error})");
        }
        let verdict = if status.denied == Some(true) { "denied" } else { "no opinion" };
        Ok(Decision::Deny(format!("{verdict}: {reason}")))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo as ApiUserInfo};

    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status::failure("boom", "InternalError").with_code(code)))
    }

    #[tokio::test(start_paused = true)]
    async fn retries_transient_failures_with_backoff() {
        let calls = AtomicU32::new(0);
        let started = Instant::now();
        let result = with_retries(TOKEN_REVIEW, || {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            async move { if call < 2 { Err(api_error(500)) } else { Ok(call) } }
        })
        .await;
        assert_eq!(result.unwrap(), 2);
        let waited = started.elapsed();
        // 500 ms and 750 ms, each with up to 20 % jitter.
        assert!(waited >= Duration::from_millis(1250) && waited <= Duration::from_millis(1500), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn does_not_retry_permanent_failures() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = with_retries(SUBJECT_ACCESS_REVIEW, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(api_error(403)) }
        })
        .await;
        assert!(matches!(result, Err(ReviewError::Api { review: "SubjectAccessReview", .. })), "{result:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_five_attempts_or_the_timeout() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = with_retries(TOKEN_REVIEW, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(api_error(429)) }
        })
        .await;
        assert!(matches!(result, Err(ReviewError::Api { .. })), "{result:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 5);

        let started = Instant::now();
        let result: Result<(), _> = with_retries(TOKEN_REVIEW, std::future::pending).await;
        assert!(matches!(result, Err(ReviewError::Timeout { .. })), "{result:?}");
        assert_eq!(started.elapsed(), REVIEW_TIMEOUT);
    }

    #[test]
    fn token_reviews_map_to_users_or_errors() {
        let review = |status: TokenReviewStatus| TokenReview { status: Some(status), ..TokenReview::default() };
        let user = token_review_outcome(review(TokenReviewStatus {
            authenticated: Some(true),
            user: Some(ApiUserInfo {
                username: Some("system:serviceaccount:ns:sa".into()),
                uid: Some("u-1".into()),
                groups: Some(vec!["system:serviceaccounts".into(), "system:authenticated".into()]),
                extra: Some([("k".to_owned(), vec!["v".to_owned()])].into()),
            }),
            ..TokenReviewStatus::default()
        }))
        .unwrap()
        .unwrap();
        assert_eq!(user.name, "system:serviceaccount:ns:sa");
        assert_eq!(user.uid, "u-1");
        assert_eq!(user.groups, ["system:serviceaccounts", "system:authenticated"]);
        assert_eq!(user.extra["k"], ["v"]);

        assert_eq!(token_review_outcome(review(TokenReviewStatus::default())).unwrap(), None);
        let error = token_review_outcome(review(TokenReviewStatus {
            error: Some("token has expired".into()),
            ..TokenReviewStatus::default()
        }))
        .unwrap_err();
        assert_eq!(error.to_string(), "TokenReview: token has expired");
    }

    #[test]
    fn subject_access_reviews_carry_the_user_and_the_node_subresource() {
        let attributes = RequestAttributes {
            user: UserInfo {
                name: "alice".into(),
                uid: String::new(),
                groups: vec!["system:authenticated".into()],
                extra: [("scopes".to_owned(), vec!["a".to_owned()])].into(),
            },
            verb: "create".into(),
            name: "node-1".into(),
            subresource: "proxy".into(),
            path: "/exec/ns/p/c".into(),
        };
        let json = serde_json::to_value(subject_access_review(&attributes)).unwrap();
        assert_eq!(
            json["spec"],
            serde_json::json!({
                "user": "alice",
                "groups": ["system:authenticated"],
                "extra": {"scopes": ["a"]},
                "resourceAttributes": {
                    "verb": "create", "version": "v1", "resource": "nodes", "subresource": "proxy", "name": "node-1"
                }
            })
        );
        assert_eq!(json["apiVersion"], "authorization.k8s.io/v1");
        assert_eq!(json["kind"], "SubjectAccessReview");
    }
}
