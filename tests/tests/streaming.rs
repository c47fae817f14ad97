//! End-to-end tests of the streaming endpoints against the real containerd of the test
//! bed (`cargo xtask testbed up`): `/exec`, `/attach` and `/portForward` proxied to
//! containerd's streaming server and driven by a client speaking kubectl's protocol
//! (WebSocket `v5`/`v4.channel.k8s.io`; the agent splices any upgraded protocol, SPDY
//! included, byte for byte), `/run`, and
//! `/containerLogs` with `follow` and `previous`.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;
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
    let script = "read x; echo \"out:$x\"; echo \"err:$x\" >&2; exit 3";
    let path = format!("/exec/default/{pod}/main?{}&stdin=1&stdout=1&stderr=1", command(&["sh", "-c", script]));
    let mut ws = WsChannels::connect(agent.https_port, &path, &["v5.channel.k8s.io", "v4.channel.k8s.io"]).await?;
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
    let path = format!(
        "/exec/default/{pod}/main?{}&stdin=1&stdout=1&tty=1",
        command(&["sh", "-c", "test -t 0 && test -t 1 && echo is-a-tty"])
    );
    let mut ws = WsChannels::connect(agent.https_port, &path, &["v4.channel.k8s.io"]).await?;
    let out = ws.collect(Duration::from_secs(30)).await?;
    assert!(out.stdout.contains("is-a-tty\r\n"), "{out:?}");
    assert_eq!(out.exit_code()?, 0, "{out:?}");

    // Refusals: no stream, unknown container.
    let e =
        WsChannels::connect(agent.https_port, &format!("/exec/default/{pod}/main?command=ls"), &["v4.channel.k8s.io"])
            .await
            .unwrap_err();
    assert!(e.to_string().contains("400"), "{e}");
    let e = WsChannels::connect(
        agent.https_port,
        &format!("/exec/default/{pod}/nope?command=ls&stdout=1"),
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
    let path = format!("/attach/default/{pod}/echo?stdin=1&stdout=1&stderr=1");
    let mut ws = WsChannels::connect(agent.https_port, &path, &["v5.channel.k8s.io", "v4.channel.k8s.io"]).await?;
    ws.send(streaming::STDIN, b"ping\n").await?;
    let mut stdout = String::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while !stdout.contains("got ping\n") {
            match ws.recv().await? {
                Some((streaming::STDOUT, d)) => stdout.push_str(&String::from_utf8_lossy(&d)),
                Some(_) => {}
                None => bail!("attach closed; stdout {stdout:?}"),
            }
        }
        Ok(())
    })
    .await
    .context("no echo through attach")??;
    Ok(())
}

/// Port forwarding to busybox httpd, over WebSocket (`v4.channel.k8s.io`: per port a data
/// and an error channel, each opened by the server with the port in 2 bytes).
async fn port_forward(agent: &Agent) -> Result<()> {
    let pod = full(agent, "stream");
    let request = b"GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n";
    let path = format!("/portForward/default/{pod}?port=8080");
    let mut ws = WsChannels::connect(agent.https_port, &path, &["v4.channel.k8s.io"]).await?;
    ws.send(0, request).await?;
    let out = ws.collect(Duration::from_secs(30)).await?;
    let data = out.other.get(&0).cloned().unwrap_or_default();
    assert!(data.len() > 2, "{out:?}");
    assert_eq!(&data[..2], &8080u16.to_le_bytes(), "the data channel starts with the port");
    let response = String::from_utf8_lossy(&data[2..]);
    assert!(response.starts_with("HTTP/1.") && response.contains(" 200 OK"), "{response}");
    assert!(response.contains("hello-from-httpd"), "{response}");

    Ok(())
}

fn http() -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder().danger_accept_invalid_certs(true).build()?)
}

async fn run_in_container(agent: &Agent) -> Result<()> {
    let pod = full(agent, "stream");
    let url = format!("https://127.0.0.1:{}/run/default/{pod}/main?cmd=echo%20from-run", agent.https_port);
    let r = http()?.post(&url).send().await?;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await?, "from-run\n");
    let url = format!("https://127.0.0.1:{}/run/default/{pod}/main?cmd=false", agent.https_port);
    let r = http()?.post(&url).send().await?;
    assert_eq!(r.status().as_u16(), 500);
    assert!(r.text().await?.contains("exited with 1"));
    Ok(())
}

#[tokio::test]
async fn exec_attach_port_forward_and_run_through_the_runtime_streaming_server() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup().await?;
    agent.write_manifest("stream.yaml", STREAM_POD)?;
    agent.wait_pod("stream", Duration::from_mins(1), all_running).await?;
    // httpd listens a moment after its container starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let result = async {
        exec_websocket(&agent).await.context("exec over WebSocket")?;
        attach_websocket(&agent).await.context("attach")?;
        port_forward(&agent).await.context("port forwarding")?;
        run_in_container(&agent).await.context("/run")?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    if let Err(e) = &result {
        eprintln!("{e:#}\n--- agent log tail ---\n{}", swiftlet_tests::tail(&agent.log(), 60));
    }
    agent.shutdown(&cri).await?;
    result
}

/// GETs `path` and reads the body until `want` shows up (or the body ends); returns what
/// was read and whether the body ended.
async fn read_logs_until(agent: &Agent, path: &str, want: &str, timeout: Duration) -> Result<(String, bool)> {
    let url = format!("https://127.0.0.1:{}{path}", agent.https_port);
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
        let url = format!("https://127.0.0.1:{}/containerLogs/default/{pod}/main?previous=true", agent.https_port);
        let r = http()?.get(&url).send().await?;
        assert_eq!(r.status().as_u16(), 400);
        assert!(r.text().await?.contains("previous terminated container \"main\""));
        Ok::<_, anyhow::Error>(())
    }
    .await;
    if let Err(e) = &result {
        eprintln!("{e:#}\n--- agent log tail ---\n{}", swiftlet_tests::tail(&agent.log(), 60));
    }
    agent.shutdown(&cri).await?;
    result
}
