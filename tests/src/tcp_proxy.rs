//! A TCP proxy on 127.0.0.1 in front of a server (the real kube-apiserver), for fault
//! tests: it forwards bytes both ways until told to [`TcpProxy::stall`] (connections stay
//! open, nothing moves: a hung server or a black-holed network) or to
//! [`TcpProxy::cut`] (every open connection is closed at once: a server restart or a
//! load balancer dropping connections). TLS passes through untouched.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Result;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The proxy; dropping it stops it and closes every connection.
#[derive(Debug)]
pub struct TcpProxy {
    pub addr: SocketAddr,
    stalled: watch::Sender<bool>,
    /// Bumped by [`TcpProxy::cut`]: connections of an older generation close.
    generation: watch::Sender<u64>,
    accepted: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    refusing: Arc<AtomicBool>,
    /// Per open connection: freezes it for good (see [`TcpProxy::black_hole`]).
    frozen: Arc<std::sync::Mutex<Vec<watch::Sender<bool>>>>,
    stop: CancellationToken,
}

impl TcpProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `target`.
    ///
    /// # Errors
    /// The port could not be bound.
    pub async fn start(target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stalled, _) = watch::channel(false);
        let (generation, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let refusing = Arc::new(AtomicBool::new(false));
        let stop = CancellationToken::new();
        let (st, gen_, acc, refuse, stop2) =
            (stalled.clone(), generation.clone(), accepted.clone(), refusing.clone(), stop.clone());
        let refused_count = refused.clone();
        let frozen: Arc<std::sync::Mutex<Vec<watch::Sender<bool>>>> = Arc::default();
        let frozen_list = frozen.clone();
        tokio::spawn(async move {
            loop {
                let (client, _) = tokio::select! {
                    () = stop2.cancelled() => return,
                    r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
                };
                if refuse.load(Ordering::SeqCst) {
                    drop(client);
                    refused_count.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                acc.fetch_add(1, Ordering::SeqCst);
                let (stall_rx, gen_rx, stop3) = (st.subscribe(), gen_.subscribe(), stop2.clone());
                let (freeze, frozen_rx) = watch::channel(false);
                {
                    let mut list = frozen_list.lock().unwrap();
                    list.retain(|f| !f.is_closed());
                    list.push(freeze);
                }
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else { return };
                    let born = *gen_rx.borrow();
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = pump(cr, sw, stall_rx.clone(), frozen_rx.clone());
                    let down = pump(sr, cw, stall_rx, frozen_rx);
                    let mut gen_rx = gen_rx;
                    tokio::select! {
                        () = stop3.cancelled() => {}
                        _ = async { tokio::join!(up, down) } => {}
                        _ = gen_rx.wait_for(|g| *g != born) => {}
                    }
                });
            }
        });
        Ok(Self { addr, stalled, generation, accepted, refused, refusing, frozen, stop })
    }

    /// Stops (true) or resumes (false) moving bytes on every connection, new ones too.
    pub fn stall(&self, on: bool) {
        self.stalled.send_replace(on);
    }

    /// Freezes every open connection for good, as a network that black-holes them would
    /// (a half-open connection: nothing moves, nothing closes); new connections work.
    pub fn black_hole(&self) {
        for f in self.frozen.lock().unwrap().iter() {
            f.send_replace(true);
        }
    }

    /// Closes every open connection.
    pub fn cut(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Closes new connections at once (true) or forwards them again (false).
    pub fn refuse(&self, on: bool) {
        self.refusing.store(on, Ordering::SeqCst);
    }

    /// Connections accepted and forwarded so far.
    #[must_use]
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed at once while refusing, so far.
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Copies `from` to `to`, pausing while `stalled` says so, for good once `frozen`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<bool>,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if stalled.wait_for(|s| !*s).await.is_err() || *frozen.borrow() {
            // Frozen: hold the connection open, move nothing, until the proxy stops.
            let _ = frozen.wait_for(|f| !*f).await;
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Data read just as a stall began is held until it ends.
        if stalled.wait_for(|s| !*s).await.is_err() || *frozen.borrow() {
            let _ = frozen.wait_for(|f| !*f).await;
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> Option<Vec<u8>> {
        s.write_all(msg).await.ok()?;
        let mut buf = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_millis(500), s.read_exact(&mut buf)).await.ok()?.ok()?;
        Some(buf)
    }

    #[tokio::test]
    async fn forwards_stalls_and_cuts() {
        let proxy = TcpProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(roundtrip(&mut s, b"one").await.as_deref(), Some(&b"one"[..]));

        proxy.stall(true);
        assert_eq!(roundtrip(&mut s, b"two").await, None, "nothing moves while stalled");
        proxy.stall(false);
        let mut late = vec![0u8; 3];
        tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut late)).await.unwrap().unwrap();
        assert_eq!(&late, b"two", "held bytes arrive once the stall ends");

        proxy.cut();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(1), s.read_to_end(&mut rest)).await.unwrap().unwrap();
        assert_eq!(n, 0, "a cut connection is closed");
        let mut again = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(roundtrip(&mut again, b"new").await.as_deref(), Some(&b"new"[..]));
        assert_eq!(proxy.accepted(), 2);

        proxy.refuse(true);
        let mut refused = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(roundtrip(&mut refused, b"x").await, None);
        assert_eq!((proxy.accepted(), proxy.refused()), (2, 1));
    }

    #[tokio::test]
    async fn a_black_hole_freezes_open_connections_and_not_new_ones() {
        let proxy = TcpProxy::start(echo_server().await).await.unwrap();
        let mut old = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(roundtrip(&mut old, b"one").await.as_deref(), Some(&b"one"[..]));
        proxy.black_hole();
        assert_eq!(roundtrip(&mut old, b"two").await, None, "nothing moves on a frozen connection");
        let mut new = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(roundtrip(&mut new, b"new").await.as_deref(), Some(&b"new"[..]));
        assert_eq!(roundtrip(&mut old, b"three").await, None, "and it stays frozen");
        // Frozen, not closed.
        let mut byte = [0u8; 1];
        assert!(tokio::time::timeout(Duration::from_millis(300), old.read(&mut byte)).await.is_err());
    }
}
