//! End-to-end tests of the streaming endpoints against the real containerd of the test
//! bed (`cargo xtask testbed up`): `/exec`, `/attach` and `/portForward` proxied to
//! containerd's streaming server (the agent splices the upgraded connection byte for
//! byte) and driven by clients speaking kubectl's protocols: WebSocket
//! `v5`/`v4.channel.k8s.io` (kubectl's default since 1.30/1.31) and SPDY/3.1 with
//! `v4.channel.k8s.io` and `portforward.k8s.io` (what the API server speaks to kubelets;
//! [`swiftlet_tests::spdy`]; `SWIFTLET_SPDY_TRACE=1` prints every SPDY frame to stderr,
//! `=2` their bytes too); `/run`, and `/containerLogs` with `follow` and `previous`.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;
use swiftlet_tests::spdy::Spdy;
use swiftlet_tests::streaming::{self, WsChannels};
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, testbed_lock};

const BUSYBOX: &str = "localhost/busybox:latest";

/// Pod `stream`: `main` idles (exec), `echo` echoes its stdin (attach), `web` serves
/// `hello-from-httpd` on port 8080 (port forwarding).
const STREAM_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: stream
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: localhost/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
  - name: echo
    image: localhost/busybox:latest
    imagePullPolicy: IfNotPresent
    stdin: true
    command: ["sh", "-c", "while read l; do echo \"got $l\"; done"]
  - name: web
    image: localhost/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www && echo hello-from-httpd > /www/index.html && exec httpd -f -p 8080 -h /www"]
"#;

/// The full name of a static pod of `agent`.
fn full(agent: &Agent, name: &str) -> String {
    format!("{name}-{}", agent.node_name)
}

fn all_running(p: &Value) -> bool {
    p["status"]["containerStatuses"]
        .as_array()
        .is_some_and(|a| !a.is_empty() && a.iter().all(|c| !c["state"]["running"].is_null()))
}

async fn setup() -> Result<(Agent, Cri)> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let agent = Agent::start(AgentOptions::default()).await?;
    Ok((agent, cri))
}

/// An agent running pod `stream` (all containers running, httpd listening).
async fn setup_stream_pod() -> Result<(Agent, Cri)> {
    let (agent, cri) = setup().await?;
    agent.write_manifest("stream.yaml", STREAM_POD)?;
    if let Err(e) = agent.wait_pod("stream", Duration::from_mins(1), all_running).await {
        return Err(finish(agent, &cri, Err(e)).await.expect_err("finish returns the error it is given"));
    }
    // httpd listens a moment after its container starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok((agent, cri))
}

/// Shows the agent's log tail if `result` failed, and stops the agent.
async fn finish(agent: Agent, cri: &Cri, result: Result<()>) -> Result<()> {
    if let Err(e) = &result {
        eprintln!("{e:#}\n--- agent log tail ---\n{}", swiftlet_tests::tail(&agent.log(), 60));
    }
    agent.shutdown(cri).await?;
    result
}

/// The exec both clients run in `main`: reads a line, echoes it to stdout and stderr,
/// exits 3.
const EXEC_SCRIPT: &str = "read x; echo \"out:$x\"; echo \"err:$x\" >&2; exit 3";
/// The TTY exec: both ends are a terminal.
const TTY_SCRIPT: &str = "test -t 0 && test -t 1 && echo is-a-tty";
/// What port forwarding sends to httpd.
const HTTP_REQUEST: &[u8] = b"GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n";

/// httpd's answer to [`HTTP_REQUEST`].
fn check_http_response(response: &[u8]) {
    let response = String::from_utf8_lossy(response);
    assert!(response.starts_with("HTTP/1.") && response.contains(" 200 OK"), "{response}");
    assert!(response.contains("hello-from-httpd"), "{response}");
}

/// `command=` parameters of `args`, URL-encoded.
fn command(args: &[&str]) -> String {
    args.iter().map(|a| format!("command={}", url_encode(a))).collect::<Vec<_>>().join("&")
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Exec over WebSocket: stdin, stdout, stderr and the exit code; a TTY; a refusal.
async fn exec_websocket(agent: &Agent) -> Result<()> {
    let pod = full(agent, "stream");
    let path = format!("/exec/default/{pod}/main?{}&input=1&output=1&error=1", command(&["sh", "-c", EXEC_SCRIPT]));
    let mut ws = WsChannels::connect(agent.https_addr(), &path, &["v5.channel.k8s.io", "v4.channel.k8s.io"]).await?;
    assert!(["v5.channel.k8s.io", "v4.channel.k8s.io"].contains(&ws.protocol.as_str()), "{}", ws.protocol);
    ws.send(streaming::STDIN, b"hello\n").await?;
    if ws.protocol.starts_with("v5") {
        ws.close_channel(streaming::STDIN).await?;
    }
    let out = ws.collect(Duration::from_secs(30)).await?;
    assert_eq!(out.stdout, "out:hello\n", "{out:?}");
    assert_eq!(out.stderr, "err:hello\n", "{out:?}");
    assert_eq!(out.exit_code()?, 3, "{out:?}");

    // A TTY: the command sees a terminal; stderr is not separate.
    let path = format!("/exec/default/{pod}/main?{}&input=1&output=1&tty=1", command(&["sh", "-c", TTY_SCRIPT]));
    let mut ws = WsChannels::connect(agent.https_addr(), &path, &["v4.channel.k8s.io"]).await?;
    let out = ws.collect(Duration::from_secs(30)).await?;
    assert!(out.stdout.contains("is-a-tty\r\n"), "{out:?}");
    assert_eq!(out.exit_code()?, 0, "{out:?}");

    // Refusals: no stream, unknown container.
    let e = WsChannels::connect(
        agent.https_addr(),
        &format!("/exec/default/{pod}/main?command=ls"),
        &["v4.channel.k8s.io"],
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("400"), "{e}");
    let e = WsChannels::connect(
        agent.https_addr(),
        &format!("/exec/default/{pod}/nope?command=ls&output=1"),
        &["v4.channel.k8s.io"],
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("404"), "{e}");
    Ok(())
}

/// Attach over WebSocket to `echo`, which reads its stdin.
async fn attach_websocket(agent: &Agent) -> Result<()> {
    let pod = full(agent, "stream");
    let path = format!("/attach/default/{pod}/echo?input=1&output=1&error=1");
    let mut ws = WsChannels::connect(agent.https_addr(), &path, &["v5.channel.k8s.io", "v4.channel.k8s.io"]).await?;
    ws.send(streaming::STDIN, b"ping\n").await?;
    ws.stdout_until("got ping\n", Duration::from_secs(30)).await.context("no echo through attach")?;
    Ok(())
}

/// Port forwarding to busybox httpd, over WebSocket (`v4.channel.k8s.io`: per port a data
/// and an error channel, each opened by the server with the port in 2 bytes).
async fn port_forward(agent: &Agent) -> Result<()> {
    let pod = full(agent, "stream");
    let path = format!("/portForward/default/{pod}?port=8080");
    let mut ws = WsChannels::connect(agent.https_addr(), &path, &["v4.channel.k8s.io"]).await?;
    ws.send(0, HTTP_REQUEST).await?;
    let out = ws.collect(Duration::from_secs(30)).await?;
    let data = out.other.get(&0).cloned().unwrap_or_default();
    assert!(data.len() > 2, "{out:?}");
    assert_eq!(&data[..2], &8080u16.to_le_bytes(), "the data channel starts with the port");
    check_http_response(&data[2..]);
    Ok(())
}

/// What client-go's SPDY executor offers, newest first; containerd 1.6 speaks up to v4.
const SPDY_EXEC_PROTOCOLS: [&str; 4] =
    ["v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"];

/// Exec over SPDY/3.1 as kubectl through the API server does it: streams `error`,
/// `stdin`, `stdout`, `stderr` (each after the reply to the one before), stdin's EOF as
/// `FLAG_FIN`, the exit code from the v4 status on the error stream; then a TTY with its
/// `resize` stream; then refusals.
async fn exec_spdy(agent: &Agent) -> Result<()> {
    let pod = full(agent, "stream");
    let path = format!("/exec/default/{pod}/main?{}&input=1&output=1&error=1", command(&["sh", "-c", EXEC_SCRIPT]));
    let mut spdy = Spdy::connect(agent.https_addr(), "POST", &path, &SPDY_EXEC_PROTOCOLS).await?;
    assert_eq!(spdy.protocol, "v4.channel.k8s.io");
    let error = spdy.create_stream(&[("streamtype", "error")]).await?;
    let stdin = spdy.create_stream(&[("streamtype", "stdin")]).await?;
    let stdout = spdy.create_stream(&[("streamtype", "stdout")]).await?;
    let stderr = spdy.create_stream(&[("streamtype", "stderr")]).await?;
    spdy.write(stdin, b"spdy\n").await?;
    spdy.close_write(stdin).await?;
    // The server writes the status, resets the streams, says GOAWAY and closes.
    spdy.read_until(Duration::from_secs(30), |r| r.closed).await.context("exec over SPDY")?;
    let got = spdy.received();
    assert_eq!(got.text(stdout), "out:spdy\n", "{got:?}");
    assert_eq!(got.text(stderr), "err:spdy\n", "{got:?}");
    assert_eq!(got.exit_code(error)?, 3, "{got:?}");

    // A TTY: no stderr stream, a resize stream the server waits for, and the size it
    // carries reaches the terminal (`stty size` is "rows columns"; busybox's prints
    // nothing while the terminal has no size yet).
    let script = format!(
        "{TTY_SCRIPT}; i=0; until s=$(stty size 2>/dev/null); [ -n \"$s\" ] && [ \"$s\" != '0 0' ]; do \
         [ $i -lt 50 ] || break; sleep 0.1; i=$((i+1)); done; echo \"size $s\""
    );
    let path = format!("/exec/default/{pod}/main?{}&input=1&output=1&tty=1", command(&["sh", "-c", &script]));
    let mut spdy = Spdy::connect(agent.https_addr(), "POST", &path, &SPDY_EXEC_PROTOCOLS).await?;
    let error = spdy.create_stream(&[("streamtype", "error")]).await?;
    // stdin stays open, as a terminal's does (its EOF could hang the shell up).
    let _stdin = spdy.create_stream(&[("streamtype", "stdin")]).await?;
    let stdout = spdy.create_stream(&[("streamtype", "stdout")]).await?;
    let resize = spdy.create_stream(&[("streamtype", "resize")]).await?;
    spdy.write(resize, br#"{"Width":100,"Height":30}"#).await?;
    spdy.read_until(Duration::from_secs(30), |r| r.closed).await.context("TTY exec over SPDY")?;
    let got = spdy.received();
    let out = got.text(stdout);
    assert!(out.contains("is-a-tty\r\n"), "{got:?}");
    assert!(out.contains("size 30 100\r\n"), "the resize stream's size: {got:?}");
    assert_eq!(got.exit_code(error)?, 0, "{got:?}");

    // Refusals come before the upgrade, as plain HTTP.
    let e = Spdy::connect(
        agent.https_addr(),
        "POST",
        &format!("/exec/default/{pod}/main?command=ls"),
        &SPDY_EXEC_PROTOCOLS,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("400"), "{e}");
    let e = Spdy::connect(
        agent.https_addr(),
        "POST",
        &format!("/exec/default/{pod}/nope?command=ls&output=1"),
        &SPDY_EXEC_PROTOCOLS,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("404"), "{e}");
    Ok(())
}

/// Attach over SPDY/3.1 to `echo`, which reads its stdin; the session stays up until the
/// client goes (`GOAWAY`).
async fn attach_spdy(agent: &Agent) -> Result<()> {
    let pod = full(agent, "stream");
    let path = format!("/attach/default/{pod}/echo?input=1&output=1&error=1");
    let mut spdy = Spdy::connect(agent.https_addr(), "POST", &path, &SPDY_EXEC_PROTOCOLS).await?;
    let _error = spdy.create_stream(&[("streamtype", "error")]).await?;
    let stdin = spdy.create_stream(&[("streamtype", "stdin")]).await?;
    let stdout = spdy.create_stream(&[("streamtype", "stdout")]).await?;
    let _stderr = spdy.create_stream(&[("streamtype", "stderr")]).await?;
    spdy.write(stdin, b"spdy-ping\n").await?;
    spdy.read_until(Duration::from_secs(30), |r| r.text(stdout).contains("got spdy-ping\n")).await?;
    // The session is alive both ways: a ping is echoed.
    spdy.ping(Duration::from_secs(10)).await?;
    spdy.go_away().await?;
    Ok(())
}

/// Port forwarding over SPDY/3.1 (`portforward.k8s.io`) as kubectl does it: per request an
/// `error` stream (half-closed at once) and a `data` stream with `port` and `requestid`;
/// two requests on one connection.
async fn port_forward_spdy(agent: &Agent) -> Result<()> {
    let pod = full(agent, "stream");
    let path = format!("/portForward/default/{pod}");
    let mut spdy = Spdy::connect(agent.https_addr(), "POST", &path, &["portforward.k8s.io"]).await?;
    assert_eq!(spdy.protocol, "portforward.k8s.io");
    for request_id in ["0", "1"] {
        let headers = |kind| [("streamtype", kind), ("port", "8080"), ("requestid", request_id)];
        let error = spdy.create_stream(&headers("error")).await?;
        spdy.close_write(error).await?;
        let data = spdy.create_stream(&headers("data")).await?;
        spdy.write(data, HTTP_REQUEST).await?;
        // httpd answers HTTP/1.0 and closes; the server then ends the data stream.
        spdy.read_until(Duration::from_secs(30), |r| r.ended(data))
            .await
            .with_context(|| format!("request {request_id}"))?;
        let got = spdy.received();
        check_http_response(got.data(data));
        assert_eq!(got.text(error), "", "no forwarding error");
    }
    spdy.go_away().await?;
    Ok(())
}

fn http() -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder().danger_accept_invalid_certs(true).build()?)
}

async fn run_in_container(agent: &Agent) -> Result<()> {
    let pod = full(agent, "stream");
    let url = format!("https://{}:{}/run/default/{pod}/main?cmd=echo%20from-run", agent.host(), agent.https_port);
    let r = http()?.post(&url).send().await?;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await?, "from-run\n");
    let url = format!("https://{}:{}/run/default/{pod}/main?cmd=false", agent.host(), agent.https_port);
    let r = http()?.post(&url).send().await?;
    assert_eq!(r.status().as_u16(), 500);
    assert!(r.text().await?.contains("exited with 1"));
    Ok(())
}

#[tokio::test]
async fn exec_attach_port_forward_and_run_through_the_runtime_streaming_server() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup_stream_pod().await?;
    let result = async {
        exec_websocket(&agent).await.context("exec over WebSocket")?;
        attach_websocket(&agent).await.context("attach")?;
        port_forward(&agent).await.context("port forwarding")?;
        run_in_container(&agent).await.context("/run")?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    finish(agent, &cri, result).await
}

#[tokio::test]
async fn exec_attach_and_port_forward_over_spdy() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup_stream_pod().await?;
    let result = async {
        exec_spdy(&agent).await.context("exec over SPDY")?;
        attach_spdy(&agent).await.context("attach over SPDY")?;
        port_forward_spdy(&agent).await.context("port forwarding over SPDY")?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    finish(agent, &cri, result).await
}

/// GETs `path` and reads the body until `want` shows up (or the body ends); returns what
/// was read and whether the body ended.
async fn read_logs_until(agent: &Agent, path: &str, want: &str, timeout: Duration) -> Result<(String, bool)> {
    let url = format!("https://{}:{}{path}", agent.host(), agent.https_port);
    let mut r = http()?.get(&url).send().await?;
    if r.status().as_u16() != 200 {
        bail!("{path}: {} {}", r.status(), r.text().await?);
    }
    let mut got = String::new();
    let ended = tokio::time::timeout(timeout, async {
        while !got.contains(want) {
            match r.chunk().await? {
                Some(c) => got.push_str(&String::from_utf8_lossy(&c)),
                None => return Ok::<_, anyhow::Error>(true),
            }
        }
        Ok(false)
    })
    .await
    .with_context(|| format!("{path}: {want:?} did not come; got {got:?}"))??;
    Ok((got, ended))
}

#[tokio::test]
async fn container_logs_follow_and_previous() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup().await?;
    // `counter`'s first run prints two lines and fails; the second ticks forever.
    // `short` prints five lines, half a second apart, and exits.
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: logs
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Always
  containers:
  - name: counter
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo run-$n; if [ $n -eq 1 ]; then echo first-run-done; exit 1; fi; i=0; while true; do echo tick-$i; i=$((i+1)); sleep 0.3; done"]
    volumeMounts:
    - {{name: data, mountPath: /data}}
  volumes:
  - name: data
    emptyDir: {{}}
"#
    );
    let short = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: short
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "sleep 2; for i in 1 2 3 4 5; do echo short-$i; sleep 0.5; done"]
"#
    );
    agent.write_manifest("logs.yaml", &manifest)?;
    agent.write_manifest("short.yaml", &short)?;
    let result = async {
        // `short`: follow while it runs; the body ends once it exits, with every line.
        agent.wait_pod("short", Duration::from_mins(1), all_running).await?;
        let pod = full(&agent, "short");
        let (got, ended) = read_logs_until(
            &agent,
            &format!("/containerLogs/default/{pod}/main?follow=true"),
            "never",
            Duration::from_secs(40),
        )
        .await?;
        assert!(ended, "the follow ends when the container exits");
        assert_eq!(got, "short-1\nshort-2\nshort-3\nshort-4\nshort-5\n");

        let logs = full(&agent, "logs");
        agent
            .wait_pod("logs", Duration::from_mins(1), |p| {
                p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1) && all_running(p)
            })
            .await?;
        let (previous, _) = read_logs_until(
            &agent,
            &format!("/containerLogs/default/{logs}/counter?previous=true"),
            "never",
            Duration::from_secs(10),
        )
        .await?;
        assert_eq!(previous, "run-1\nfirst-run-done\n");
        // Follow the running instance: the lines come as they are written.
        let (got, ended) = read_logs_until(
            &agent,
            &format!("/containerLogs/default/{logs}/counter?follow=true"),
            "tick-5\n",
            Duration::from_secs(30),
        )
        .await?;
        assert!(!ended);
        assert!(got.starts_with("run-2\ntick-0\n"), "{got}");
        // Options: tail, timestamps, limit.
        let (got, _) = read_logs_until(
            &agent,
            &format!("/containerLogs/default/{logs}/counter?tailLines=1&timestamps=true"),
            "never",
            Duration::from_secs(10),
        )
        .await?;
        let (ts, line) = got.trim_end().split_once(' ').context("a timestamp")?;
        assert!(ts.contains('T') && line.starts_with("tick-"), "{got}");
        let (got, _) = read_logs_until(
            &agent,
            &format!("/containerLogs/default/{logs}/counter?limitBytes=3"),
            "never",
            Duration::from_secs(10),
        )
        .await?;
        assert_eq!(got, "run");
        // Errors.
        let url =
            format!("https://{}:{}/containerLogs/default/{pod}/main?previous=true", agent.host(), agent.https_port);
        let r = http()?.get(&url).send().await?;
        assert_eq!(r.status().as_u16(), 400);
        assert!(r.text().await?.contains("previous terminated container \"main\""));
        Ok::<_, anyhow::Error>(())
    }
    .await;
    finish(agent, &cri, result).await
}
