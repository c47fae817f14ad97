//! `/containerLogs/{ns}/{pod}/{container}` (upstream `getContainerLogs`,
//! `GetKubeletContainerLogs`, `validateContainerLogStatus`).
//!
//! The query is a `v1.PodLogOptions`: `follow`, `previous`, `timestamps` (on unless `0` or
//! `false`, as the API's parameter codec reads booleans), `tailLines` (or the old `tail`,
//! where `all` means every line), `limitBytes`, `sinceSeconds`, `sinceTime` (RFC 3339) and
//! `stream` (`Stdout`, `Stderr`, `All`). A value that does not decode is 400 `Unable to
//! decode query.`; options that do not validate (negative `tailLines`, `limitBytes` or
//! `sinceSeconds` below 1, both `since*`, `tailLines` with one stream) are 422 `Invalid
//! request.`; an unknown pod or container is 404.
//!
//! The container instance comes from the pod's status as upstream: the running or last
//! terminated one, or with `previous` the one before (`lastState.terminated.containerID`;
//! none is 400 `previous terminated container "c" in pod "p" not found`). Its log file is
//! the CRI status' `logPath`, read by [`crate::logs::reader`] and sent chunk by chunk.
//! Errors before the first byte (the container's status, opening the file) are 400 with
//! upstream's words; later ones end the body.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use tokio::sync::mpsc;

use super::PodsProvider;
use super::streaming::{find_pod, query_pairs, text};
use crate::container::RuntimeService;
use crate::logs::reader::{LogOptions, LogReader, Streams};

/// What `/containerLogs` needs.
#[derive(Clone)]
pub(crate) struct LogsState {
    pub(crate) pods: Arc<dyn PodsProvider>,
    pub(crate) runtime: Arc<dyn RuntimeService>,
}

/// The query of `/containerLogs`, decoded (`v1.PodLogOptions`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct PodLogOptions {
    pub(crate) follow: bool,
    pub(crate) previous: bool,
    pub(crate) timestamps: bool,
    pub(crate) tail_lines: Option<i64>,
    pub(crate) limit_bytes: Option<i64>,
    pub(crate) since_seconds: Option<i64>,
    pub(crate) since_time: Option<jiff::Timestamp>,
    pub(crate) stream: Option<String>,
}

/// Why a query was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum QueryError {
    /// 400 `Unable to decode query.`
    Decode(String),
    /// 422 `Invalid request.`
    Invalid(String),
}

impl PodLogOptions {
    /// Decodes and validates the query (upstream's parameter codec and
    /// `ValidatePodLogOptions`).
    pub(crate) fn from_query(query: Option<&str>) -> Result<Self, QueryError> {
        let mut pairs = query_pairs(query);
        // The old `tail` parameter: `all` is every line.
        if let Some((_, tail)) = pairs.iter().find(|(k, _)| k == "tail").cloned() {
            pairs.retain(|(k, _)| k != "tailLines" && k != "tail");
            if tail != "all" {
                pairs.push(("tailLines".to_owned(), tail));
            }
        }
        let first = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        // The API's conversion of a query value to a bool: only `0` and `false` are false.
        let boolean = |name| first(name).is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"));
        let int = |name: &str| -> Result<Option<i64>, QueryError> {
            first(name).map(|v| v.parse::<i64>().map_err(|e| QueryError::Decode(format!("{name}: {e}")))).transpose()
        };
        let since_time = first("sinceTime")
            .map(|v| v.parse::<jiff::Timestamp>().map_err(|e| QueryError::Decode(format!("sinceTime: {e}"))))
            .transpose()?;
        let opts = Self {
            follow: boolean("follow"),
            previous: boolean("previous"),
            timestamps: boolean("timestamps"),
            tail_lines: int("tailLines")?,
            limit_bytes: int("limitBytes")?,
            since_seconds: int("sinceSeconds")?,
            since_time,
            stream: first("stream").map(str::to_owned),
        };
        opts.validate()?;
        Ok(opts)
    }

    fn validate(&self) -> Result<(), QueryError> {
        let invalid = |m: &str| Err(QueryError::Invalid(m.to_owned()));
        if self.tail_lines.is_some_and(|t| t < 0) {
            return invalid("tailLines: must be greater than or equal to 0");
        }
        if self.limit_bytes.is_some_and(|b| b < 1) {
            return invalid("limitBytes: must be greater than 0");
        }
        if self.since_seconds.is_some() && self.since_time.is_some() {
            return invalid("at most one of `sinceTime` or `sinceSeconds` may be specified");
        }
        if self.since_seconds.is_some_and(|s| s < 1) {
            return invalid("sinceSeconds: must be greater than 0");
        }
        match self.stream.as_deref() {
            Some("Stdout" | "Stderr") if self.tail_lines.is_some() => {
                invalid("tailLines and specific stream are mutually exclusive for now")
            }
            None | Some("All" | "Stdout" | "Stderr") => Ok(()),
            Some(_) => invalid("stream: supported values: \"All\", \"Stderr\", \"Stdout\""),
        }
    }

    /// The reader's options at `now` (upstream `NewLogOptions`: the later of the two
    /// `since`s).
    pub(crate) fn to_log_options(&self, now: jiff::Timestamp) -> LogOptions {
        let since_seconds = self.since_seconds.and_then(|s| now.checked_sub(jiff::SignedDuration::from_secs(s)).ok());
        let since = match (since_seconds, self.since_time) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        LogOptions {
            tail_lines: self.tail_lines.map(|t| t as u64),
            limit_bytes: self.limit_bytes.map(|b| b as u64),
            since,
            follow: self.follow,
            timestamps: self.timestamps,
            streams: match self.stream.as_deref() {
                Some("Stdout") => Streams::Stdout,
                Some("Stderr") => Streams::Stderr,
                _ => Streams::All,
            },
        }
    }
}

/// The status of container `name` in `pod`: regular, init or ephemeral.
fn container_status<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    let status = pod.status.as_ref()?;
    [&status.container_statuses, &status.init_container_statuses, &status.ephemeral_container_statuses]
        .into_iter()
        .flatten()
        .flatten()
        .find(|c| c.name == name)
}

/// Whether `pod`'s spec has a container `name` (upstream `GetContainerSpec`).
fn has_container(pod: &Pod, name: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers.iter().any(|c| c.name == name)
            || s.init_containers.iter().flatten().any(|c| c.name == name)
            || s.ephemeral_containers.iter().flatten().any(|c| c.name == name)
    })
}

/// The runtime's id of the container instance whose logs to read (upstream
/// `validateContainerLogStatus`), or why there is none.
pub(crate) fn log_container_id(pod: &Pod, name: &str, previous: bool) -> Result<String, String> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let Some(status) = container_status(pod, name) else {
        return Err(format!("container {name:?} in pod {pod_name:?} is not available"));
    };
    let state = status.state.clone().unwrap_or_default();
    let last = status.last_state.as_ref().and_then(|l| l.terminated.as_ref());
    let last_id = last.and_then(|t| t.container_id.clone()).filter(|id| !id.is_empty());
    let terminated = || format!("container {name:?} in pod {pod_name:?} is terminated");
    let id = if previous {
        last_id.ok_or_else(|| format!("previous terminated container {name:?} in pod {pod_name:?} not found"))?
    } else if state.running.is_some() {
        status.container_id.clone().unwrap_or_default()
    } else if let Some(t) = &state.terminated {
        match t.container_id.clone().filter(|id| !id.is_empty()) {
            Some(id) => id,
            None => last_id.ok_or_else(terminated)?,
        }
    } else if last.is_some() {
        last_id.ok_or_else(terminated)?
    } else if let Some(w) = &state.waiting {
        let reason = w.reason.as_deref().unwrap_or_default();
        return Err(match reason {
            "ErrImagePull" => {
                format!("container {name:?} in pod {pod_name:?} is waiting to start: image can't be pulled")
            }
            "ImagePullBackOff" => {
                format!("container {name:?} in pod {pod_name:?} is waiting to start: trying and failing to pull image")
            }
            _ => format!("container {name:?} in pod {pod_name:?} is waiting to start: {reason}"),
        });
    } else {
        return Err(format!("container {name:?} in pod {pod_name:?} is waiting to start - no logs yet"));
    };
    // `containerd://<id>`: the runtime wants the id alone.
    Ok(id.split_once("://").map_or(id.as_str(), |(_, id)| id).to_owned())
}

/// `/containerLogs/{ns}/{pod}/{container}`.
pub(crate) async fn container_logs(
    State(state): State<LogsState>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let opts = match PodLogOptions::from_query(query.as_deref()) {
        Ok(o) => o,
        Err(QueryError::Decode(why)) => {
            tracing::debug!(%why, "containerLogs query");
            return text(StatusCode::BAD_REQUEST, r#"{"message": "Unable to decode query."}"#);
        }
        Err(QueryError::Invalid(why)) => {
            tracing::debug!(%why, "containerLogs query");
            return text(StatusCode::UNPROCESSABLE_ENTITY, r#"{"message": "Invalid request."}"#);
        }
    };
    let Some(pod) = find_pod(state.pods.as_ref(), &namespace, &pod_name) else {
        return text(StatusCode::NOT_FOUND, format!("pod {pod_name:?} does not exist"));
    };
    if !has_container(&pod, &container) {
        return text(StatusCode::NOT_FOUND, format!("container {container:?} not found in pod {pod_name:?}"));
    }
    let id = match log_container_id(&pod, &container, opts.previous) {
        Ok(id) => id,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let status = match state.runtime.container_status(&id).await {
        Ok(s) => s,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("failed to get container status {id:?}: {e}")),
    };
    let reader = match LogReader::open(
        std::path::Path::new(&status.log_path),
        &id,
        opts.to_log_options(jiff::Timestamp::now()),
        state.runtime.clone(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(reader.run(tx));
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response()
}

#[cfg(test)]
mod tests;
