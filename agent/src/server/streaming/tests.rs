//! The streaming handlers over real sockets: the router of [`Endpoints`] served on plain
//! HTTP in front of a fake streaming server (an axum server that accepts the upgrade and
//! answers in upper case), with the fake runtime handing out its URLs.

use std::net::SocketAddr;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::TcpStream;

use super::*;
use crate::container::fake::{FakeRuntime, StreamingCall, exec_response};
use crate::server::{DebuggingHandlers, Endpoints, FakePods};

/// The requests the fake streaming server saw: (path, headers).
type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

/// A streaming server: `/refuse/...` answers 403 "no such session"; anything else is
/// upgraded (echoing the subprotocol asked for first) and echoes in upper case.
async fn fake_streaming_server() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |mut request: Request| {
        let record = record.clone();
        async move {
            record.lock().unwrap().push((request.uri().path().to_owned(), request.headers().clone()));
            if request.uri().path().starts_with("/refuse") {
                return (StatusCode::FORBIDDEN, "no such session").into_response();
            }
            let protocol = request
                .headers()
                .get(header::SEC_WEBSOCKET_PROTOCOL)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(',').next())
                .map(|p| p.trim().to_owned());
            let upgrade = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                let mut io = TokioIo::new(upgrade.await.unwrap());
                let mut buf = [0u8; 1024];
                loop {
                    let n = io.read(&mut buf).await.unwrap();
                    if n == 0 {
                        io.shutdown().await.unwrap();
                        return;
                    }
                    io.write_all(&buf[..n].to_ascii_uppercase()).await.unwrap();
                }
            });
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            let h = response.headers_mut();
            h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
            h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            if let Some(p) = protocol {
                h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_str(&p).unwrap());
            }
            response
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

fn pod(name: &str, uid: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }))
    .unwrap()
}

/// A fake runtime with pod `web` (UID `u1`): a ready sandbox and a running `main`.
async fn runtime_with_pod() -> (Arc<FakeRuntime>, String, String) {
    let rt = Arc::new(FakeRuntime::default());
    let labels: std::collections::HashMap<String, String> =
        [(labels::POD_UID.to_owned(), "u1".to_owned()), (labels::CONTAINER_NAME.to_owned(), "main".to_owned())].into();
    let sandbox_config =
        api::PodSandboxConfig { labels: [(labels::POD_UID.to_owned(), "u1".to_owned())].into(), ..Default::default() };
    let sb = rt.run_pod_sandbox(sandbox_config.clone(), String::new()).await.unwrap();
    let config = api::ContainerConfig { labels, ..Default::default() };
    let id = rt.create_container(&sb, config, sandbox_config).await.unwrap();
    rt.start_container(&id).await.unwrap();
    (rt, sb, id)
}

/// The debugging routes of an [`Endpoints`] over `rt`, served on plain HTTP.
async fn serve_routes(rt: Arc<FakeRuntime>, idle: Duration) -> SocketAddr {
    let endpoints = Endpoints::new(Arc::new(FakePods::new(vec![pod("web", "u1")])), Arc::new(Registry::default()))
        .debugging_handlers(DebuggingHandlers {
            runtime: rt,
            enable_debugging_handlers: true,
            enable_system_log_handler: false,
            streaming_connection_idle_timeout: idle,
            system_log_dir: "/nonexistent".into(),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, endpoints.routes).await.unwrap() });
    addr
}

/// A pod's container on a fake runtime whose streaming server is a
/// [`fake_streaming_server`], with the debugging routes over it.
struct Proxied {
    backend: SocketAddr,
    seen: Seen,
    rt: Arc<FakeRuntime>,
    sandbox: String,
    id: String,
    /// The debugging routes.
    addr: SocketAddr,
}

async fn proxied() -> Proxied {
    let (backend, seen) = fake_streaming_server().await;
    let (rt, sandbox, id) = runtime_with_pod().await;
    rt.set_streaming_url(&format!("http://{backend}"));
    let addr = serve_routes(rt.clone(), Duration::from_mins(1)).await;
    Proxied { backend, seen, rt, sandbox, id, addr }
}

/// Sends a raw HTTP/1.1 request; returns the connection and the response head
/// (status, headers lower-cased).
async fn raw_request(addr: SocketAddr, head: &str) -> (BufReader<TcpStream>, u16, Vec<(String, String)>) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).await.unwrap();
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').unwrap();
        headers.push((k.to_ascii_lowercase(), v.trim().to_owned()));
    }
    (reader, status, headers)
}

fn upgrade_head(path: &str, extra: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n"
    )
}

async fn plain(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let head = format!("{method} {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
    let (mut reader, status, _) = raw_request(addr, &head).await;
    let mut body = String::new();
    reader.read_to_string(&mut body).await.unwrap();
    (status, body)
}

#[tokio::test]
async fn exec_is_proxied_to_the_runtime_and_spliced() {
    let Proxied { backend, seen, rt, id, addr, .. } = proxied().await;
    let head = upgrade_head(
        "/exec/default/web/main?command=sh&command=-c&command=echo%20hi&input=1&output=1&tty=1&error=1",
        "Sec-WebSocket-Protocol: v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.c2VjcmV0, v4.channel.k8s.io\r\n\
         X-Stream-Protocol-Version: v4.channel.k8s.io\r\nAuthorization: Bearer secret\r\n",
    );
    let (mut conn, status, headers) = raw_request(addr, &head).await;
    assert_eq!(status, 101);
    assert!(headers.contains(&("sec-websocket-protocol".into(), "v5.channel.k8s.io".into())), "{headers:?}");
    assert!(headers.contains(&("upgrade".into(), "websocket".into())), "{headers:?}");
    assert!(headers.iter().any(|(k, v)| k == "connection" && v.eq_ignore_ascii_case("upgrade")), "{headers:?}");
    conn.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    conn.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HELLO");
    // Closing our side closes the runtime's, and then ours.
    conn.get_mut().shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest)).await.unwrap().unwrap();
    assert!(rest.is_empty());

    // The runtime was asked for the container with the options (no stderr with a TTY)...
    let calls = rt.streaming_calls();
    let StreamingCall::Exec(request) = &calls[0] else { panic!("{calls:?}") };
    assert_eq!(request.container_id, id);
    assert_eq!(request.cmd, ["sh", "-c", "echo hi"]);
    assert!(request.stdin && request.stdout && request.tty && !request.stderr);
    // ...and its server got the client's headers but not its credentials.
    let seen = seen.lock().unwrap();
    let (path, headers) = &seen[0];
    assert_eq!(path, &format!("/exec/{id}"));
    assert_eq!(headers["x-stream-protocol-version"], "v4.channel.k8s.io");
    assert_eq!(headers["sec-websocket-protocol"], "v5.channel.k8s.io, v4.channel.k8s.io");
    assert_eq!(headers["sec-websocket-key"], "dGhlIHNhbXBsZSBub25jZQ==");
    assert_eq!(headers["host"], backend.to_string());
    assert!(!headers.contains_key("authorization"));
}

#[tokio::test]
async fn attach_and_port_forward_reach_the_runtime() {
    let Proxied { seen, rt, sandbox, id, addr, .. } = proxied().await;

    let (_conn, status, _) = raw_request(addr, &upgrade_head("/attach/default/web/u1/main?output=1", "")).await;
    assert_eq!(status, 101);
    // WebSocket port forwarding names the ports in the query.
    let (mut conn, status, _) = raw_request(addr, &upgrade_head("/portForward/default/web?port=8080,9090", "")).await;
    assert_eq!(status, 101);
    conn.write_all(b"x").await.unwrap();
    let mut buf = [0u8; 1];
    conn.read_exact(&mut buf).await.unwrap();
    // SPDY clients do not.
    let spdy = "POST /portForward/default/web/u1 HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\n\
                Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n";
    let (_conn, status, _) = raw_request(addr, spdy).await;
    assert_eq!(status, 101);

    let calls = rt.streaming_calls();
    assert_eq!(
        calls[0],
        StreamingCall::Attach(api::AttachRequest { container_id: id.clone(), stdout: true, ..Default::default() })
    );
    assert_eq!(calls[1], StreamingCall::PortForward { sandbox_id: sandbox.clone(), ports: vec![8080, 9090] });
    assert_eq!(calls[2], StreamingCall::PortForward { sandbox_id: sandbox.clone(), ports: vec![] });
    let seen = seen.lock().unwrap();
    assert_eq!(seen[2].0, format!("/portforward/{sandbox}"));
    assert_eq!(seen[2].1["upgrade"], "SPDY/3.1");
    assert_eq!(seen[2].1["x-stream-protocol-version"], "portforward.k8s.io");
}

#[tokio::test]
async fn refusals_are_upstreams() {
    let Proxied { backend, rt, addr, .. } = proxied().await;
    let status_and_body = |head: String| async move {
        let (mut conn, status, _) = raw_request(addr, &head).await;
        let mut body = vec![0u8; 200];
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut body)).await.unwrap().unwrap();
        (status, String::from_utf8_lossy(&body[..n]).into_owned())
    };
    // Not an upgrade.
    let (status, body) = plain(addr, "GET", "/exec/default/web/main?command=ls&output=1").await;
    assert_eq!((status, body.as_str()), (400, "Upgrade request required"));
    for (path, want) in [
        // No stream asked for.
        ("/exec/default/web/main?command=ls", (400, "you must specify at least 1 of stdin, stdout, stderr")),
        ("/exec/default/nope/main?command=ls&output=1", (404, "pod does not exist")),
        ("/exec/default/web/other-uid/main?output=1", (404, "pod not found")),
        ("/attach/default/web/sidecar?output=1", (404, "container not found (\"sidecar\")")),
        ("/portForward/default/web", (400, "query parameter \"port\" is required")),
    ] {
        let (status, body) = status_and_body(upgrade_head(path, "")).await;
        assert_eq!((status, body.as_str()), want, "{path}");
    }
    let (status, _) = status_and_body(upgrade_head("/portForward/default/web?port=http", "")).await;
    assert_eq!(status, 400);
    // The runtime's streaming server refuses: its answer goes back.
    rt.set_streaming_url(&format!("http://{backend}/refuse"));
    let (status, body) = status_and_body(upgrade_head("/exec/default/web/main?output=1", "")).await;
    assert_eq!((status, body.as_str()), (403, "no such session"));
}

#[tokio::test]
async fn run_answers_the_output() {
    let (rt, _, id) = runtime_with_pod().await;
    rt.push_exec_response(&id, Ok(exec_response(0, "out\n", "err\n")));
    rt.push_exec_response(&id, Ok(exec_response(2, "", "no such file\n")));
    let addr = serve_routes(rt.clone(), Duration::from_mins(1)).await;
    assert_eq!(plain(addr, "POST", "/run/default/web/main?cmd=cat%20/etc/hostname").await, (200, "out\nerr\n".into()));
    assert_eq!(
        plain(addr, "POST", "/run/default/web/u1/main?cmd=cat%20/x").await,
        (500, "command 'cat /x' exited with 2: no such file\n".into())
    );
    assert_eq!(plain(addr, "POST", "/run/default/nope/main?cmd=ls").await.0, 404);
    assert_eq!(plain(addr, "GET", "/run/default/web/main?cmd=ls").await.0, 405);
    let calls = rt.exec_calls();
    assert_eq!(calls[0].cmd, ["cat", "/etc/hostname"]);
    assert_eq!(calls[0].timeout, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn an_idle_splice_is_closed() {
    let (a, _a_peer) = tokio::io::duplex(64);
    let (b, _b_peer) = tokio::io::duplex(64);
    let started = tokio::time::Instant::now();
    assert_eq!(splice(a, b, Duration::from_secs(30)).await.unwrap(), Spliced::Idle);
    assert_eq!(started.elapsed(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn traffic_keeps_a_splice_open() {
    let (a, mut a_peer) = tokio::io::duplex(64);
    let (b, mut b_peer) = tokio::io::duplex(64);
    let task = tokio::spawn(splice(a, b, Duration::from_secs(30)));
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(20)).await;
        a_peer.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        b_peer.read_exact(&mut buf).await.unwrap();
    }
    assert!(!task.is_finished(), "80 s of traffic every 20 s");
    drop(a_peer);
    drop(b_peer);
    assert_eq!(task.await.unwrap().unwrap(), Spliced::Closed);
}

#[test]
fn stream_options_and_ports_are_validated() {
    let q = |s: &str| query_pairs(Some(s));
    assert_eq!(
        StreamOptions::from_query(&q("input=1&output=1&error=1")),
        Ok(StreamOptions { stdin: true, stdout: true, stderr: true, tty: false })
    );
    // Upstream's names only: `stdout` is not `output`.
    assert!(StreamOptions::from_query(&q("stdin=1&stdout=1&stderr=1")).is_err());
    // `true` is not `1` (the API server sends `1`).
    assert!(StreamOptions::from_query(&q("output=true")).is_err());
    assert_eq!(
        StreamOptions::from_query(&q("error=1&tty=1")),
        Err("you must specify at least 1 of stdin, stdout, stderr".into()),
        "a TTY has no stderr"
    );
    assert_eq!(port_forward_ports(&q("port=80&port=81,82"), true), Ok(vec![80, 81, 82]));
    assert_eq!(port_forward_ports(&q(""), false), Ok(vec![]));
    assert_eq!(port_forward_ports(&q("port="), true), Err("query parameter \"port\" cannot be empty".into()));
    assert!(port_forward_ports(&q("port=0"), true).unwrap_err().contains("must be > 0"));
    assert!(port_forward_ports(&q("port=70000"), true).unwrap_err().contains("unable to parse"));
    assert_eq!(ContainerPath::from_segments(vec!["a".into(), "b".into()]).map(|p| p.container), None);
}
