//! gRPC probes (upstream `pkg/probe/grpc`): `grpc.health.v1.Health/Check` with the probe's
//! service name over a plaintext HTTP/2 connection, `User-Agent: kube-probe/<major>.<minor>`.
//!
//! One deadline covers connecting and the call. As upstream (a blocking dial), a refused
//! connection is retried until the deadline, so an unreachable server fails with
//! `timeout: failed to connect service "<addr>" within <timeout>: context deadline
//! exceeded`. Answers map as upstream: `SERVING` is success (`service healthy`), another
//! status a failure (`service unhealthy (responded with "NOT_SERVING")`), `Unimplemented`
//! and `DeadlineExceeded` get their own failure messages and any other status
//! `error: health rpc probe failed: rpc error: code = <Code> desc = <message>`. A gRPC
//! probe is never an error.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::{Outcome, ProbeResponse, format, tcp, user_agent};

/// First wait between connection attempts (grpc-go's base backoff is one second).
const INITIAL_BACKOFF: Duration = Duration::from_secs(1);

/// Runs a gRPC probe of `service` on `host:port` within `timeout`.
pub async fn probe(host: &str, service: &str, port: i32, timeout: Duration) -> ProbeResponse {
    let deadline = Instant::now() + timeout;
    let addr = format::join_host_port(host, port);
    let connect_timeout = || {
        Outcome::failure(format!(
            "timeout: failed to connect service {} within {}: context deadline exceeded",
            format::quote(&addr),
            format::duration(timeout)
        ))
    };
    let endpoint = match endpoint(&addr) {
        Ok(e) => e,
        Err(e) => {
            return Ok(Outcome::failure(format!("error: failed to connect service at {}: {e}", format::quote(&addr))));
        }
    };
    let Ok(port) = u16::try_from(port) else {
        return Ok(Outcome::failure(format!(
            "error: failed to connect service at {}: invalid port",
            format::quote(&addr)
        )));
    };
    let mut backoff = INITIAL_BACKOFF;
    let channel = loop {
        let host = host.to_string();
        let connector = tower::service_fn(move |_: Uri| {
            let host = host.clone();
            async move { tcp::dial(&host, port).await.map(TokioIo::new).map_err(std::io::Error::other) }
        });
        match tokio::time::timeout_at(deadline, endpoint.connect_with_connector(connector)).await {
            Ok(Ok(channel)) => break channel,
            Ok(Err(e)) => tracing::trace!(%addr, error = %e, "gRPC probe connection failed, retrying"),
            Err(_) => return Ok(connect_timeout()),
        }
        let wake = (Instant::now() + backoff).min(deadline);
        tokio::time::sleep_until(wake).await;
        if wake >= deadline {
            return Ok(connect_timeout());
        }
        backoff = backoff.mul_f64(1.6);
    };
    Ok(check(channel, service, deadline, timeout).await)
}

fn endpoint(addr: &str) -> Result<Endpoint, tonic::transport::Error> {
    Endpoint::from_shared(format!("http://{addr}"))?.user_agent(user_agent("probe"))
}

async fn check(channel: Channel, service: &str, deadline: Instant, timeout: Duration) -> Outcome {
    let rpc_timeout =
        || Outcome::failure(format!("timeout: health rpc did not complete within {}", format::duration(timeout)));
    let mut request = tonic::Request::new(HealthCheckRequest { service: service.to_string() });
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let response = match tokio::time::timeout_at(deadline, HealthClient::new(channel).check(request)).await {
        Err(_) => return rpc_timeout(),
        Ok(Ok(r)) => r.into_inner(),
        // Our deadline passed while the server's answer was on its way (a tonic server
        // answers its own expiry with `Cancelled`): grpc-go reports its own deadline.
        Ok(Err(_)) if Instant::now() >= deadline => return rpc_timeout(),
        Ok(Err(status)) => {
            return match status.code() {
                tonic::Code::Unimplemented => Outcome::failure(format!(
                    "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                    status.message()
                )),
                tonic::Code::DeadlineExceeded => rpc_timeout(),
                _ => Outcome::failure(format!(
                    "error: health rpc probe failed: {}",
                    crate::container::go_status_text(&status)
                )),
            };
        }
    };
    match ServingStatus::try_from(response.status) {
        Ok(ServingStatus::Serving) => Outcome::success("service healthy"),
        Ok(other) => {
            Outcome::failure(format!("service unhealthy (responded with {})", format::quote(other.as_str_name())))
        }
        Err(_) => Outcome::failure(format!(
            "service unhealthy (responded with {})",
            format::quote(&response.status.to_string())
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio_stream::wrappers::TcpListenerStream;
    use tokio_util::sync::CancellationToken;
    use tonic_health::pb::HealthCheckResponse;
    use tonic_health::pb::health_server::{Health, HealthServer};

    use super::*;
    use crate::probe::ProbeResult;

    /// Serves `service` on 127.0.0.1 until the token is dropped.
    async fn serve<S>(service: HealthServer<S>) -> (SocketAddr, tokio_util::sync::DropGuard)
    where
        S: Health,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let shutdown = stop.clone().cancelled_owned();
        tokio::spawn(tonic::transport::Server::builder().serve_with_incoming_shutdown(
            service,
            TcpListenerStream::new(listener),
            shutdown,
        ));
        (addr, stop.drop_guard())
    }

    /// A health service that answers slowly, or with a fixed error.
    struct Scripted {
        delay: Duration,
        error: Option<tonic::Status>,
    }

    #[tonic::async_trait]
    impl Health for Scripted {
        async fn check(
            &self,
            _request: tonic::Request<HealthCheckRequest>,
        ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
            tokio::time::sleep(self.delay).await;
            match &self.error {
                Some(status) => Err(status.clone()),
                None => Ok(tonic::Response::new(HealthCheckResponse { status: ServingStatus::Serving.into() })),
            }
        }

        type WatchStream = tokio_stream::Empty<Result<HealthCheckResponse, tonic::Status>>;

        async fn watch(
            &self,
            _request: tonic::Request<HealthCheckRequest>,
        ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
            Err(tonic::Status::unimplemented("watch"))
        }
    }

    #[tokio::test]
    async fn serving_statuses() {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter.set_service_status("up", tonic_health::ServingStatus::Serving).await;
        reporter.set_service_status("down", tonic_health::ServingStatus::NotServing).await;
        let (addr, _stop) = serve(service).await;
        let port = i32::from(addr.port());
        let second = Duration::from_secs(1);

        assert_eq!(probe("127.0.0.1", "up", port, second).await.unwrap(), Outcome::success("service healthy"));
        // The empty service name is the server's overall health, SERVING by default.
        assert_eq!(probe("127.0.0.1", "", port, second).await.unwrap(), Outcome::success("service healthy"));
        assert_eq!(
            probe("127.0.0.1", "down", port, second).await.unwrap(),
            Outcome::failure(r#"service unhealthy (responded with "NOT_SERVING")"#)
        );
        assert_eq!(
            probe("127.0.0.1", "nope", port, second).await.unwrap(),
            Outcome::failure(
                "error: health rpc probe failed: rpc error: code = NotFound desc = service not registered"
            )
        );
    }

    #[tokio::test]
    async fn a_slow_server_times_out() {
        let (addr, _stop) = serve(HealthServer::new(Scripted { delay: Duration::from_secs(5), error: None })).await;
        let out = probe("127.0.0.1", "", i32::from(addr.port()), Duration::from_millis(300)).await.unwrap();
        assert_eq!(out, Outcome::failure("timeout: health rpc did not complete within 300ms"));
    }

    #[tokio::test]
    async fn unimplemented_health_protocol() {
        let status = tonic::Status::unimplemented("unknown service grpc.health.v1.Health");
        let (addr, _stop) = serve(HealthServer::new(Scripted { delay: Duration::ZERO, error: Some(status) })).await;
        let out = probe("127.0.0.1", "", i32::from(addr.port()), Duration::from_secs(1)).await.unwrap();
        assert_eq!(
            out.output,
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): \
             unknown service grpc.health.v1.Health"
        );
    }

    #[tokio::test]
    async fn nothing_listening_fails_at_the_deadline() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let start = std::time::Instant::now();
        let out = probe("127.0.0.1", "", i32::from(port), Duration::from_millis(300)).await.unwrap();
        assert_eq!(out.result, ProbeResult::Failure);
        assert_eq!(
            out.output,
            format!(r#"timeout: failed to connect service "127.0.0.1:{port}" within 300ms: context deadline exceeded"#)
        );
        assert!(start.elapsed() >= Duration::from_millis(290));
    }
}
