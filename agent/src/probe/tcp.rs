//! TCP probes (upstream `pkg/probe/tcp`) and the dialer every probe connection uses
//! (upstream `probe.ProbeDialer`).
//!
//! A probe connects to `host:port` within the timeout and closes the connection: success
//! with no output, or a failure with Go's dial error (`dial tcp 10.0.0.5:80: connect:
//! connection refused`, `dial tcp 10.0.0.5:80: i/o timeout`). Probe sockets get
//! `SO_LINGER` of one second, as upstream, so a probe storm does not leave sockets in
//! `TIME_WAIT` for a minute. An empty host dials the local system, as Go does.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

use super::{Outcome, ProbeResponse, format};

/// Connects to `host:port` (resolving a name; each address in turn) with upstream's
/// probe socket options. The error is Go's dial error text.
pub(crate) async fn dial(host: &str, port: u16) -> Result<TcpStream, String> {
    let addrs: Vec<SocketAddr> = if host.is_empty() {
        vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)]
    } else if let Ok(ip) = host.parse::<IpAddr>() {
        vec![SocketAddr::new(ip, port)]
    } else {
        tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| format!("dial tcp: lookup {host}: {}", format::io_error(&e)))?
            .collect()
    };
    let mut last = format!("dial tcp: lookup {host}: no such host");
    for addr in addrs {
        match connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = format!("dial tcp {addr}: connect: {}", format::io_error(&e)),
        }
    }
    Err(last)
}

async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    // Upstream's ProbeDialer: a one-second linger instead of the default close (see
    // kubernetes#89898). The socket is closed with nothing left to send, so the close
    // does not block.
    #[expect(deprecated, reason = "upstream sets SO_LINGER on probe sockets; nothing is unsent at close")]
    socket.set_linger(Some(Duration::from_secs(1)))?;
    socket.connect(addr).await
}

/// Runs a TCP probe (upstream `DoTCPProbe`). Never an error: a failed connect is a
/// failure with the dial error.
pub async fn probe(host: &str, port: u16, timeout: Duration) -> ProbeResponse {
    match tokio::time::timeout(timeout, dial(host, port)).await {
        Ok(Ok(stream)) => {
            drop(stream);
            Ok(Outcome::success(""))
        }
        Ok(Err(e)) => Ok(Outcome::failure(e)),
        Err(_) => Ok(Outcome::failure(format!("dial tcp {}: i/o timeout", format::join_host_port(host, port)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::ProbeResult;

    #[tokio::test]
    async fn an_open_port_succeeds() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
        assert_eq!(probe("127.0.0.1", port, Duration::from_secs(1)).await.unwrap(), Outcome::success(""));
        accept.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_closed_port_fails_with_the_dial_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let out = probe("127.0.0.1", port, Duration::from_secs(1)).await.unwrap();
        assert_eq!(out, Outcome::failure(format!("dial tcp 127.0.0.1:{port}: connect: connection refused")));
    }

    #[tokio::test]
    async fn localhost_names_resolve() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let out = probe("localhost", port, Duration::from_secs(1)).await.unwrap();
        // `localhost` may resolve to ::1 first; some address must answer.
        assert_eq!(out.result, ProbeResult::Success, "{out:?}");
        drop(listener);
    }

    /// A listener whose accept queue is full drops further SYNs, so a connect hangs.
    #[tokio::test]
    async fn a_hanging_connect_times_out() {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        // Connections that were never accepted stay queued, closed or not.
        let mut timed_out = None;
        for _ in 0..16 {
            let out = probe("127.0.0.1", addr.port(), Duration::from_millis(300)).await.unwrap();
            if out.result == ProbeResult::Failure {
                timed_out = Some(out);
                break;
            }
        }
        let out = timed_out.expect("the accept queue fills up");
        assert_eq!(out.output, format!("dial tcp 127.0.0.1:{}: i/o timeout", addr.port()));
    }
}
