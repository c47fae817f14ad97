//! Exec probes (upstream `pkg/probe/exec`) and the command runner they share with
//! lifecycle hooks (upstream `RunInContainer` over the CRI client's `ExecSync`).
//!
//! [`run_in_container`] returns stdout followed by stderr, and turns the runtime's answer
//! into upstream's errors: a non-zero exit code is [`ExecError::Exit`]
//! (`command 'sh -c exit 1' exited with 1: <stderr>`), a `DeadlineExceeded` from the
//! runtime (or our own deadline) is [`ExecError::TimedOut`]
//! (`command timed out: "sleep 10" timed out after 1s`). [`probe`] makes exit 0 a success,
//! another exit code a failure with the output (at most 10 KiB, as upstream's limited
//! writer), a timeout a failure with the timeout message (`ExecProbeTimeout` is GA), and
//! any other error an error with result `Unknown`.

use std::time::Duration;

use super::{Outcome, ProbeError, ProbeResponse, ProbeResult, format};
use crate::container::{self, RuntimeService};

/// How much of a command's output an exec probe keeps (upstream `maxReadLength`).
pub const MAX_OUTPUT: usize = 10 * 1024;

/// Why a command run in a container did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The command ran and exited with a non-zero code.
    #[error("command '{command}' exited with {code}: {stderr}")]
    Exit { command: String, code: i32, stderr: String },
    /// The command did not finish within its timeout.
    #[error("command timed out: {} timed out after {}", format::quote(.command), format::duration(*.timeout))]
    TimedOut { command: String, timeout: Duration },
    /// The runtime could not run it (no such container, no such binary, runtime down,
    /// ...): a gRPC status reads as upstream's Go client prints it
    /// (`rpc error: code = Unknown desc = failed to exec in container: ...`).
    #[error("{}", .0.go_text())]
    Runtime(container::Error),
}

/// Runs `cmd` in the container through `ExecSync` (upstream `RunInContainer`): returns
/// stdout followed by stderr (also on failure) and whether it succeeded. A zero `timeout`
/// means none (lifecycle hooks).
pub async fn run_in_container(
    runtime: &dyn RuntimeService,
    container_id: &str,
    cmd: &[String],
    timeout: Duration,
) -> (Vec<u8>, Result<(), ExecError>) {
    match runtime.exec_sync(container_id, cmd.to_vec(), timeout).await {
        Ok(resp) => {
            let result = if resp.exit_code == 0 {
                Ok(())
            } else {
                Err(ExecError::Exit {
                    command: cmd.join(" "),
                    code: resp.exit_code,
                    stderr: String::from_utf8_lossy(&resp.stderr).into_owned(),
                })
            };
            let mut output = resp.stdout;
            output.extend_from_slice(&resp.stderr);
            (output, result)
        }
        Err(e) if is_deadline(&e) => (Vec::new(), Err(ExecError::TimedOut { command: cmd.join(" "), timeout })),
        Err(e) => (Vec::new(), Err(ExecError::Runtime(e))),
    }
}

/// Whether the runtime (or our deadline on the call) ran out of time.
fn is_deadline(e: &container::Error) -> bool {
    match e {
        container::Error::Timeout { .. } => true,
        container::Error::Rpc { status, .. } => status.code() == tonic::Code::DeadlineExceeded,
        _ => false,
    }
}

/// Runs an exec probe: `cmd` in the container with the probe's `timeout`.
pub async fn probe(
    runtime: &dyn RuntimeService,
    container_id: &str,
    cmd: &[String],
    timeout: Duration,
) -> ProbeResponse {
    let (mut output, result) = run_in_container(runtime, container_id, cmd, timeout).await;
    output.truncate(MAX_OUTPUT);
    let output = String::from_utf8_lossy(&output).into_owned();
    tracing::trace!(container_id, ?cmd, %output, "exec probe response");
    match result {
        Ok(()) => Ok(Outcome::success(output)),
        Err(ExecError::Exit { .. }) => Ok(Outcome::failure(output)),
        Err(e @ ExecError::TimedOut { .. }) => Ok(Outcome::failure(e.to_string())),
        Err(e @ ExecError::Runtime(_)) => Err(ProbeError { result: ProbeResult::Unknown, message: e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::container::fake::{FakeRuntime, exec_deadline_exceeded, exec_response};

    fn cmd(parts: &[&str]) -> Vec<String> {
        parts.iter().map(ToString::to_string).collect()
    }

    #[tokio::test]
    async fn exit_codes_make_the_result() {
        let rt = FakeRuntime::default();
        rt.push_exec_response("c1", Ok(exec_response(0, "ok\n", "warn\n")));
        rt.push_exec_response("c1", Ok(exec_response(1, "out ", "bad")));
        let c = cmd(&["cat", "/tmp/healthy"]);
        let secs = Duration::from_secs(3);
        assert_eq!(probe(&rt, "c1", &c, secs).await.unwrap(), Outcome::success("ok\nwarn\n"));
        assert_eq!(probe(&rt, "c1", &c, secs).await.unwrap(), Outcome::failure("out bad"));
        let calls = rt.exec_calls();
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].container_id.as_str(), &calls[0].cmd, calls[0].timeout), ("c1", &c, secs));
    }

    #[tokio::test]
    async fn a_timeout_is_a_failure_with_upstreams_message() {
        let rt = FakeRuntime::default();
        rt.push_exec_response("c1", Err(exec_deadline_exceeded()));
        rt.push_exec_response(
            "c1",
            Err(container::Error::Timeout { operation: "exec_sync", timeout: Duration::from_secs(121) }),
        );
        let c = cmd(&["sh", "-c", "sleep 10"]);
        for _ in 0..2 {
            let out = probe(&rt, "c1", &c, Duration::from_secs(1)).await.unwrap();
            assert_eq!(out, Outcome::failure(r#"command timed out: "sh -c sleep 10" timed out after 1s"#));
        }
    }

    #[tokio::test]
    async fn runtime_errors_are_unknown_errors() {
        let rt = FakeRuntime::default();
        let err = probe(&rt, "missing", &cmd(&["true"]), Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.result, ProbeResult::Unknown);
        assert!(err.message.contains("missing not found"), "{err}");
    }

    /// containerd's answer to the exec of a binary the image does not have, as the probe
    /// error reads: the gRPC status in Go's words, as upstream's event shows it.
    #[tokio::test]
    async fn a_failed_exec_reads_as_the_go_grpc_status() {
        let desc = "failed to exec in container: failed to start exec \"e1\": OCI runtime exec failed: exec failed: \
                    unable to start container process: exec: \"/no-such-binary\": stat /no-such-binary: no such file \
                    or directory: unknown";
        let rt = FakeRuntime::default();
        rt.push_exec_response(
            "c1",
            Err(container::Error::Rpc { operation: "exec_sync", status: tonic::Status::unknown(desc) }),
        );
        let err = probe(&rt, "c1", &cmd(&["/no-such-binary"]), Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.result, ProbeResult::Unknown);
        assert_eq!(err.message, format!("rpc error: code = Unknown desc = {desc}"));
        // Other codes by grpc-go's names.
        for (status, code) in [
            (tonic::Status::not_found("x"), "NotFound"),
            (tonic::Status::cancelled("x"), "Canceled"),
            (tonic::Status::unavailable("x"), "Unavailable"),
        ] {
            rt.push_exec_response("c1", Err(container::Error::Rpc { operation: "exec_sync", status }));
            let err = probe(&rt, "c1", &cmd(&["true"]), Duration::from_secs(1)).await.unwrap_err();
            assert_eq!(err.message, format!("rpc error: code = {code} desc = x"));
        }
    }

    #[tokio::test]
    async fn output_is_limited_to_10_kib() {
        let rt = FakeRuntime::default();
        let big = "x".repeat(11 * 1024);
        rt.push_exec_response("c1", Ok(exec_response(0, &big, "")));
        let out = probe(&rt, "c1", &cmd(&["big"]), Duration::from_secs(1)).await.unwrap();
        assert_eq!(out.output.len(), MAX_OUTPUT);
    }

    #[tokio::test]
    async fn run_in_container_reports_upstreams_exit_error() {
        let rt = FakeRuntime::default();
        rt.set_exec_handler(|_, cmd, timeout| {
            assert_eq!(timeout, Duration::ZERO);
            Ok(exec_response(2, "", &format!("{} failed", cmd[0])))
        });
        let runtime: Arc<dyn RuntimeService> = Arc::new(rt);
        let (out, result) =
            run_in_container(runtime.as_ref(), "c1", &cmd(&["sh", "-c", "exit 2"]), Duration::ZERO).await;
        assert_eq!(out, b"sh failed");
        assert_eq!(result.unwrap_err().to_string(), "command 'sh -c exit 2' exited with 2: sh failed");
    }
}
