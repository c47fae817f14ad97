use k8s_openapi::api::core::v1::{ExecAction, HTTPGetAction, HTTPHeader, SleepAction, TCPSocketAction};

use super::*;
use crate::container::fake::{FakeRuntime, exec_response};
use crate::probe::test_server::{TestServer, pod};

fn container() -> Container {
    Container { name: "app".into(), ..Default::default() }
}

fn runner() -> (Arc<FakeRuntime>, HandlerRunner) {
    let rt = Arc::new(FakeRuntime::default());
    (rt.clone(), HandlerRunner::new(rt))
}

fn exec(cmd: &[&str]) -> LifecycleHandler {
    LifecycleHandler {
        exec: Some(ExecAction { command: Some(cmd.iter().map(ToString::to_string).collect()) }),
        ..Default::default()
    }
}

fn http_get(port: u16, path: &str) -> LifecycleHandler {
    LifecycleHandler {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(port)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sleep(seconds: i64) -> LifecycleHandler {
    LifecycleHandler { sleep: Some(SleepAction { seconds }), ..Default::default() }
}

const LOCAL: &[String] = &[];

fn local_ips() -> Vec<String> {
    vec!["127.0.0.1".into()]
}

#[tokio::test]
async fn exec_hooks_run_without_timeout_or_expansion() {
    let (rt, runner) = runner();
    rt.push_exec_response("c1", Ok(exec_response(0, "done", "")));
    let (pod, c) = (pod(), container());
    let ctx = HookContext { pod: &pod, container: &c, container_id: "containerd://c1", pod_ips: LOCAL };
    let out = runner.run(&ctx, &exec(&["echo", "$(HOME)"]), &CancellationToken::new()).await;
    assert_eq!(out, HookOutcome { result: Ok(()), http_fallback: None });
    let call = &rt.exec_calls()[0];
    assert_eq!((call.container_id.as_str(), call.timeout), ("c1", Duration::ZERO));
    assert_eq!(call.cmd, ["echo", "$(HOME)"]);
}

#[tokio::test]
async fn a_failing_exec_hook_has_upstreams_message() {
    let (rt, runner) = runner();
    rt.push_exec_response("c1", Ok(exec_response(1, "out\n", "boom")));
    let (pod, c) = (pod(), container());
    let ctx = HookContext { pod: &pod, container: &c, container_id: "c1", pod_ips: LOCAL };
    let err = runner.run(&ctx, &exec(&["sh", "-c", "exit 1"]), &CancellationToken::new()).await.result.unwrap_err();
    assert_eq!(err.error, "command 'sh -c exit 1' exited with 1: boom");
    assert_eq!(
        err.message,
        r#"Exec lifecycle hook ([sh -c exit 1]) for Container "app" in Pod "web_prod(uid-1)" failed - error: command 'sh -c exit 1' exited with 1: boom, message: "out\nboom""#
    );
}

#[tokio::test]
async fn http_hooks_go_to_the_pod_ip_and_ignore_the_status() {
    let server = TestServer::http().await;
    let (_, runner) = runner();
    let (pod, c) = (pod(), container());
    let ips = local_ips();
    let ctx = HookContext { pod: &pod, container: &c, container_id: "c1", pod_ips: &ips };
    for path in ["/ok", "/status/500"] {
        let out = runner.run(&ctx, &http_get(server.port(), path), &CancellationToken::new()).await;
        assert_eq!(out.result, Ok(()), "{path}: a status code is not a failure upstream");
    }
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].headers["user-agent"], "kube-lifecycle/1.37");
}

#[tokio::test]
async fn a_failing_http_hook_has_upstreams_message() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (_, runner) = runner();
    let (pod, c) = (pod(), container());
    let ips = local_ips();
    let ctx = HookContext { pod: &pod, container: &c, container_id: "c1", pod_ips: &ips };
    let err = runner.run(&ctx, &http_get(port, "/hook"), &CancellationToken::new()).await.result.unwrap_err();
    let cause =
        format!(r#"Get "http://127.0.0.1:{port}/hook": dial tcp 127.0.0.1:{port}: connect: connection refused"#);
    assert_eq!(err.error, cause);
    assert_eq!(
        err.message,
        format!(r#"HTTP lifecycle hook (/hook) for Container "app" in Pod "web_prod(uid-1)" failed - error: {cause}"#)
    );

    let ctx = HookContext { pod_ips: LOCAL, ..ctx };
    let err = runner.run(&ctx, &http_get(port, "/hook"), &CancellationToken::new()).await.result.unwrap_err();
    assert_eq!(err.error, "failed to find networking container: the pod has no IP");
}

#[tokio::test]
async fn https_hooks_answered_in_http_fall_back() {
    let server = TestServer::http().await;
    let (_, runner) = runner();
    let (pod, c) = (pod(), container());
    let ips = local_ips();
    let ctx = HookContext { pod: &pod, container: &c, container_id: "c1", pod_ips: &ips };
    let mut handler = http_get(server.port(), "/ok");
    let action = handler.http_get.as_mut().unwrap();
    action.scheme = Some("HTTPS".into());
    action.http_headers = Some(vec![
        HTTPHeader { name: "Authorization".into(), value: "Bearer secret".into() },
        HTTPHeader { name: "X-Keep".into(), value: "1".into() },
    ]);
    let out = runner.run(&ctx, &handler, &CancellationToken::new()).await;
    assert_eq!(out.result, Ok(()));
    assert_eq!(
        out.http_fallback.as_deref(),
        Some(
            format!(
                "request to HTTPS lifecycle hook 127.0.0.1:{} got HTTP response, retry with HTTP succeeded",
                server.port()
            )
            .as_str()
        )
    );
    let seen = server.seen();
    let plain = seen.iter().find(|s| s.path == "/ok").expect("the HTTP retry arrived");
    assert!(plain.headers.get("authorization").is_none());
    assert_eq!(plain.headers["x-keep"], "1");
}

#[tokio::test(start_paused = true)]
async fn sleep_hooks_wait_or_end_when_cancelled() {
    let (_, runner) = runner();
    let (pod, c) = (pod(), container());
    let ctx = HookContext { pod: &pod, container: &c, container_id: "c1", pod_ips: LOCAL };
    let start = tokio::time::Instant::now();
    let out = runner.run(&ctx, &sleep(5), &CancellationToken::new()).await;
    assert_eq!(out.result, Ok(()));
    assert_eq!(start.elapsed(), Duration::from_secs(5));

    let cancel = CancellationToken::new();
    let stopper = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        stopper.cancel();
    });
    let err = runner.run(&ctx, &sleep(30), &cancel).await.result.unwrap_err();
    assert_eq!(
        err.message,
        r#"Sleep lifecycle hook (30) for Container "app" in Pod "web_prod(uid-1)" failed - error: container terminated before sleep hook finished"#
    );
}

#[tokio::test]
async fn tcp_socket_hooks_are_rejected() {
    let (_, runner) = runner();
    let (pod, c) = (pod(), container());
    let ctx = HookContext { pod: &pod, container: &c, container_id: "c1", pod_ips: LOCAL };
    let handler = LifecycleHandler {
        tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(8080), host: None }),
        ..Default::default()
    };
    let err = runner.run(&ctx, &handler, &CancellationToken::new()).await.result.unwrap_err();
    assert_eq!(
        err.message,
        "Cannot run handler: invalid handler: &LifecycleHandler{Exec:nil,HTTPGet:nil,\
         TCPSocket:&TCPSocketAction{Port:{0 8080 },Host:,},Sleep:nil,}"
    );
    let err = runner.run(&ctx, &LifecycleHandler::default(), &CancellationToken::new()).await.result.unwrap_err();
    assert_eq!(err.error, "invalid handler: &LifecycleHandler{Exec:nil,HTTPGet:nil,TCPSocket:nil,Sleep:nil,}");
}

#[tokio::test(start_paused = true)]
async fn pre_stop_hooks_run_within_the_grace_period() {
    let (_, runner) = runner();
    let (pod, c) = (pod(), container());
    let ctx = HookContext { pod: &pod, container: &c, container_id: "c1", pod_ips: LOCAL };
    let cancel = CancellationToken::new();

    let run = runner.execute_pre_stop_hook(&ctx, &sleep(3), 30, &cancel).await;
    assert_eq!(run, PreStopRun { elapsed_secs: 3, outcome: Some(HookOutcome { result: Ok(()), http_fallback: None }) });
    assert_eq!(grace_period_after_pre_stop(30, run.elapsed_secs), 27);

    let run = runner.execute_pre_stop_hook(&ctx, &sleep(60), 10, &cancel).await;
    assert_eq!(run, PreStopRun { elapsed_secs: 10, outcome: None });
    assert_eq!(grace_period_after_pre_stop(10, run.elapsed_secs), MINIMUM_GRACE_PERIOD_SECONDS);

    let run = runner.execute_pre_stop_hook(&ctx, &sleep(60), 0, &cancel).await;
    assert_eq!(run, PreStopRun { elapsed_secs: 0, outcome: None });
}

#[test]
fn grace_period_arithmetic() {
    assert_eq!(grace_period_after_pre_stop(30, 0), 30);
    assert_eq!(grace_period_after_pre_stop(30, 29), 2);
    assert_eq!(grace_period_after_pre_stop(30, 28), 2);
    assert_eq!(grace_period_after_pre_stop(30, 27), 3);
    assert_eq!(grace_period_after_pre_stop(0, 0), 2, "a zero grace period still gets the minimum");
    assert_eq!(grace_period_after_pre_stop(1, 5), 2);
}
