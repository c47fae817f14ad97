use k8s_openapi::api::core::v1::{
    ContainerPort, EnvVar, EnvVarSource, ExecAction, GRPCAction, HTTPGetAction, ObjectFieldSelector, TCPSocketAction,
};

use super::test_server::{TestServer, pod};
use super::*;
use crate::container::fake::{FakeRuntime, exec_response};

fn status(ip: &str) -> PodStatus {
    PodStatus { pod_ip: Some(ip.into()), ..Default::default() }
}

fn container(port_name: &str, port: u16) -> Container {
    Container {
        name: "app".into(),
        ports: Some(vec![ContainerPort {
            name: Some(port_name.into()),
            container_port: i32::from(port),
            ..Default::default()
        }]),
        env: Some(vec![
            EnvVar { name: "FILE".into(), value: Some("/tmp/healthy".into()), ..Default::default() },
            EnvVar { name: "FILE2".into(), value: Some("$(FILE)".into()), ..Default::default() },
            EnvVar {
                name: "NODE".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector { field_path: "spec.nodeName".into(), ..Default::default() }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

fn prober() -> (Arc<FakeRuntime>, Prober) {
    let rt = Arc::new(FakeRuntime::default());
    (rt.clone(), Prober::new(rt))
}

#[test]
fn ports_resolve_by_number_and_name() {
    let c = container("http", 8080);
    assert_eq!(resolve_container_port(&IntOrString::Int(80), &c), Ok(80));
    assert_eq!(resolve_container_port(&IntOrString::String("http".into()), &c), Ok(8080));
    assert_eq!(resolve_container_port(&IntOrString::String("9090".into()), &c), Ok(9090));
    assert_eq!(
        resolve_container_port(&IntOrString::String("metrics".into()), &c),
        Err(r#"strconv.Atoi: parsing "metrics": invalid syntax"#.into())
    );
    assert_eq!(resolve_container_port(&IntOrString::Int(0), &c), Err("invalid port number: 0".into()));
    assert_eq!(resolve_container_port(&IntOrString::Int(65536), &c), Err("invalid port number: 65536".into()));
    assert_eq!(
        resolve_container_port(&IntOrString::String("http".into()), &container("http", 0)),
        Err("invalid port number: 0".into())
    );
}

#[test]
fn commands_expand_static_env_only() {
    let c = container("http", 8080);
    let cmd: Vec<String> = ["cat", "$(FILE)", "$(FILE2)", "$(NODE)", "$(MISSING)", "$$(FILE)"].map(String::from).into();
    assert_eq!(
        expand_command_static(&cmd, c.env.as_deref().unwrap()),
        ["cat", "/tmp/healthy", "$(FILE)", "", "$(MISSING)", "$(FILE)"].map(String::from)
    );
}

#[test]
fn results_print_as_upstream() {
    assert_eq!(ProbeResult::Success.to_string(), "success");
    assert_eq!(ProbeResult::Warning.to_string(), "warning");
    assert_eq!(ProbeResult::Failure.to_string(), "failure");
    assert_eq!(ProbeResult::Unknown.to_string(), "unknown");
    assert_eq!(user_agent("probe"), "kube-probe/1.37");
}

#[tokio::test]
async fn exec_probes_expand_the_command_and_use_the_timeout() {
    let (rt, prober) = prober();
    rt.push_exec_response("abc", Ok(exec_response(0, "fine", "")));
    let probe =
        Probe { exec: Some(ExecAction { command: Some(vec!["cat".into(), "$(FILE)".into()]) }), ..Default::default() };
    let out = prober.run_probe(&probe, &pod(), &status("10.0.0.5"), &container("http", 80), "containerd://abc").await;
    assert_eq!(out.unwrap(), Outcome::success("fine"));
    let calls = rt.exec_calls();
    assert_eq!(calls[0].container_id, "abc");
    assert_eq!(calls[0].cmd, ["cat", "/tmp/healthy"]);
    assert_eq!(calls[0].timeout, Duration::from_secs(1), "timeoutSeconds defaults to 1");

    rt.push_exec_response("abc", Ok(exec_response(0, "", "")));
    let probe = Probe { timeout_seconds: Some(7), ..probe };
    prober.run_probe(&probe, &pod(), &status("10.0.0.5"), &container("http", 80), "abc").await.unwrap();
    assert_eq!(rt.exec_calls()[1].timeout, Duration::from_secs(7));
}

#[tokio::test]
async fn http_probes_default_to_the_pod_ip_and_resolve_port_names() {
    let server = TestServer::http().await;
    let (_, prober) = prober();
    let probe = Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/ok".into()),
            port: IntOrString::String("web".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let c = container("web", server.port());
    let out = prober.run_probe(&probe, &pod(), &status("127.0.0.1"), &c, "abc").await.unwrap();
    assert_eq!(out, Outcome::success("ok"));
    assert_eq!(server.seen()[0].headers["host"], format!("127.0.0.1:{}", server.port()).as_str());

    let bad = Probe {
        http_get: Some(HTTPGetAction { port: IntOrString::String("nope".into()), ..Default::default() }),
        ..Default::default()
    };
    let err = prober.run_probe(&bad, &pod(), &status("127.0.0.1"), &c, "abc").await.unwrap_err();
    assert_eq!(err, ProbeError::unknown(r#"strconv.Atoi: parsing "nope": invalid syntax"#));
}

#[tokio::test]
async fn tcp_probes_use_their_host_or_the_pod_ip() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (_, prober) = prober();
    let c = container("sock", port);
    let probe = Probe {
        tcp_socket: Some(TCPSocketAction { port: IntOrString::String("sock".into()), host: None }),
        ..Default::default()
    };
    let out = prober.run_probe(&probe, &pod(), &status("127.0.0.1"), &c, "abc").await.unwrap();
    assert_eq!(out, Outcome::success(""));
    // The probe's own host wins over the pod IP.
    let probe = Probe {
        tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(i32::from(port)), host: Some("127.0.0.1".into()) }),
        ..Default::default()
    };
    let out = prober.run_probe(&probe, &pod(), &status("192.0.2.1"), &c, "abc").await.unwrap();
    assert_eq!(out, Outcome::success(""));
    let err = prober
        .run_probe(
            &Probe {
                tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(0), host: None }),
                ..Default::default()
            },
            &pod(),
            &status("127.0.0.1"),
            &c,
            "abc",
        )
        .await
        .unwrap_err();
    assert_eq!(err, ProbeError::unknown("invalid port number: 0"));
}

#[tokio::test]
async fn grpc_probes_target_the_pod_ip() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (_, prober) = prober();
    let probe = Probe {
        grpc: Some(GRPCAction { port: i32::from(port), service: Some("x".into()), mode: None }),
        timeout_seconds: Some(1),
        ..Default::default()
    };
    let out = prober.run_probe(&probe, &pod(), &status("127.0.0.1"), &container("a", 1), "abc").await.unwrap();
    assert!(
        out.output.starts_with(&format!(r#"timeout: failed to connect service "127.0.0.1:{port}" within 1s"#)),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_probe_without_a_handler_is_an_error() {
    let (_, prober) = prober();
    let err =
        prober.run_probe(&Probe::default(), &pod(), &status("127.0.0.1"), &container("a", 1), "abc").await.unwrap_err();
    assert_eq!(err, ProbeError::unknown("missing probe handler for web_prod(uid-1):app"));
}
