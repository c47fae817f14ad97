use k8s_openapi::api::core::v1::{ContainerPort, HTTPHeader};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;
use crate::probe::test_server::TestServer;

fn container() -> Container {
    Container {
        name: "app".into(),
        ports: Some(vec![ContainerPort { name: Some("http".into()), container_port: 8080, ..Default::default() }]),
        ..Default::default()
    }
}

fn action(path: &str, port: IntOrString) -> HTTPGetAction {
    HTTPGetAction { path: Some(path.into()), port, ..Default::default() }
}

fn header(name: &str, value: &str) -> HTTPHeader {
    HTTPHeader { name: name.into(), value: value.into() }
}

/// A probe request to the test server's `path`.
fn request(server: &TestServer, path: &str) -> HttpGetRequest {
    let port = IntOrString::Int(i32::from(server.port()));
    HttpGetRequest::for_action(&action(path, port), &container(), "127.0.0.1", "probe").unwrap()
}

fn second() -> Duration {
    Duration::from_secs(1)
}

#[test]
fn requests_are_built_as_upstream() {
    let req = HttpGetRequest::for_action(
        &action("/healthz", IntOrString::String("http".into())),
        &container(),
        "10.0.0.5",
        "probe",
    )
    .unwrap();
    assert_eq!(
        req.target,
        Target { scheme: "http".into(), host: "10.0.0.5".into(), port: 8080, path: "/healthz".into() }
    );
    assert_eq!(req.target.url(), "http://10.0.0.5:8080/healthz");
    assert_eq!(
        req.headers,
        vec![("User-Agent".to_string(), "kube-probe/1.37".to_string()), ("Accept".to_string(), "*/*".to_string())]
    );
    assert_eq!(req.host_header, None);

    let mut a = action("healthz?full=1#top", IntOrString::String("9090".into()));
    a.scheme = Some("HTTPS".into());
    a.host = Some("db.local".into());
    a.http_headers = Some(vec![
        header("user-agent", "mine"),
        header("Accept", ""),
        header("Host", "example.com"),
        header("X-A", "1"),
        header("X-A", "2"),
    ]);
    let req = HttpGetRequest::for_action(&a, &container(), "10.0.0.5", "lifecycle").unwrap();
    assert_eq!(req.target.url(), "https://db.local:9090/healthz?full=1");
    assert_eq!(
        req.headers,
        vec![
            ("user-agent".to_string(), "mine".to_string()),
            ("X-A".to_string(), "1".to_string()),
            ("X-A".to_string(), "2".to_string())
        ]
    );
    assert_eq!(req.host_header.as_deref(), Some("example.com"));

    let req =
        HttpGetRequest::for_action(&action("", IntOrString::Int(80)), &container(), "fd00::5", "lifecycle").unwrap();
    assert_eq!(req.target.url(), "http://[fd00::5]:80");
    assert_eq!(req.target.request_target(), "/");
    assert_eq!(req.headers[0].1, "kube-lifecycle/1.37");

    let err = HttpGetRequest::for_action(
        &action("/", IntOrString::String("metrics".into())),
        &container(),
        "10.0.0.5",
        "probe",
    );
    assert_eq!(err.unwrap_err(), r#"strconv.Atoi: parsing "metrics": invalid syntax"#);
}

#[test]
fn paths_are_formatted_as_go_parses_them() {
    assert_eq!(format_path("/a b/ü?x=1 2#frag"), "/a%20b/%C3%BC?x=1%202");
    assert_eq!(format_path("http://other:1/x?y"), "/x?y");
    assert_eq!(format_path("//other/x"), "/x");
    assert_eq!(format_path("?q"), "/?q");
    assert_eq!(format_path("/a/../b"), "/a/../b");
    assert_eq!(format_path(""), "");
}

#[tokio::test]
async fn a_200_is_success_with_the_body_and_upstreams_headers() {
    let server = TestServer::http().await;
    let out = HttpProber::new().probe(&request(&server, "/ok"), second()).await.unwrap();
    assert_eq!(out, Outcome::success("ok"));
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(h["user-agent"], "kube-probe/1.37");
    assert_eq!(h["accept"], "*/*");
    assert_eq!(h["connection"], "close");
    assert_eq!(h["host"], format!("127.0.0.1:{}", server.port()).as_str());
    assert!(h.get("accept-encoding").is_none());
}

#[tokio::test]
async fn status_codes_make_the_result() {
    let server = TestServer::http().await;
    let prober = HttpProber::new();
    for (code, want) in [
        (201, Outcome::success("status body")),
        (300, Outcome::new(ProbeResult::Warning, "Probe terminated redirects, Response body: status body")),
        (304, Outcome::new(ProbeResult::Warning, "Probe terminated redirects, Response body: ")),
        (399, Outcome::new(ProbeResult::Warning, "Probe terminated redirects, Response body: status body")),
        (400, Outcome::failure("HTTP probe failed with statuscode: 400")),
        (404, Outcome::failure("HTTP probe failed with statuscode: 404")),
        (500, Outcome::failure("HTTP probe failed with statuscode: 500")),
    ] {
        let out = prober.probe(&request(&server, &format!("/status/{code}")), second()).await.unwrap();
        assert_eq!(out, want, "status {code}");
    }
}

#[tokio::test]
async fn redirects_to_the_same_host_are_followed() {
    let server = TestServer::http().await;
    let prober = HttpProber::new();
    let port = server.port();
    for path in [
        "/redirect/302?to=/ok".to_string(),
        "/redirect/301?to=../ok".to_string(),
        format!("/redirect/307?to=http://127.0.0.1:{port}/ok"),
        "/redirect/308?to=/ok".to_string(),
        "/redirect/303?to=/ok".to_string(),
    ] {
        let out = prober.probe(&request(&server, &path), second()).await.unwrap();
        assert_eq!(out, Outcome::success("ok"), "{path}");
    }
    let seen = server.seen();
    assert_eq!(seen[1].path, "/ok");
    assert_eq!(seen[1].headers["referer"], format!("http://127.0.0.1:{port}/redirect/302?to=/ok").as_str());
    assert_eq!(seen[1].headers["user-agent"], "kube-probe/1.37");
}

#[tokio::test]
async fn a_redirect_to_another_host_is_a_warning() {
    let server = TestServer::http().await;
    let path = format!("/redirect/302?to=http://localhost:{}/ok", server.port());
    let out = HttpProber::new().probe(&request(&server, &path), second()).await.unwrap();
    assert_eq!(out, Outcome::new(ProbeResult::Warning, "Probe terminated redirects, Response body: moved"));
    assert_eq!(server.seen().len(), 1, "the redirect is not followed");
}

#[tokio::test]
async fn a_redirect_without_location_is_returned() {
    let server = TestServer::http().await;
    let out = HttpProber::new().probe(&request(&server, "/redirect/302"), second()).await.unwrap();
    assert_eq!(out.result, ProbeResult::Warning);
}

#[tokio::test]
async fn the_tenth_redirect_fails() {
    let server = TestServer::http().await;
    let out = HttpProber::new().probe(&request(&server, "/loop"), second()).await.unwrap();
    assert_eq!(out, Outcome::failure(r#"Get "/loop": stopped after 10 redirects"#));
    assert_eq!(server.seen().len(), 10);
}

#[tokio::test]
async fn a_host_header_survives_relative_redirects_only() {
    let server = TestServer::http().await;
    let port = server.port();
    let mut a = action("/redirect/302?to=/headers", IntOrString::Int(i32::from(port)));
    a.http_headers = Some(vec![header("Host", "example.com")]);
    let req = HttpGetRequest::for_action(&a, &container(), "127.0.0.1", "probe").unwrap();
    let out = HttpProber::new().probe(&req, second()).await.unwrap();
    assert!(out.output.contains("host: example.com\n"), "{}", out.output);

    let to = format!("http://127.0.0.1:{port}/headers");
    a.path =
        Some(format!("/redirect/302?to={}", url::form_urlencoded::byte_serialize(to.as_bytes()).collect::<String>()));
    let req = HttpGetRequest::for_action(&a, &container(), "127.0.0.1", "probe").unwrap();
    let out = HttpProber::new().probe(&req, second()).await.unwrap();
    assert!(out.output.contains(&format!("host: 127.0.0.1:{port}\n")), "{}", out.output);
    assert_eq!(server.seen()[0].headers["host"], "example.com");
}

#[tokio::test]
async fn probe_headers_are_sent() {
    let server = TestServer::http().await;
    let mut a = action("/headers", IntOrString::Int(i32::from(server.port())));
    a.http_headers = Some(vec![header("X-Custom", "a"), header("X-Custom", "b"), header("User-Agent", "checker/2")]);
    let req = HttpGetRequest::for_action(&a, &container(), "127.0.0.1", "probe").unwrap();
    let out = HttpProber::new().probe(&req, second()).await.unwrap();
    assert!(out.output.contains("x-custom: a\nx-custom: b\n"), "{}", out.output);
    assert!(out.output.contains("user-agent: checker/2\n"), "{}", out.output);
    assert!(!out.output.contains("kube-probe"), "{}", out.output);
}

#[tokio::test]
async fn a_slow_server_times_out() {
    let server = TestServer::http().await;
    let out = HttpProber::new().probe(&request(&server, "/slow"), Duration::from_millis(200)).await.unwrap();
    let url = format!("http://127.0.0.1:{}/slow", server.port());
    assert_eq!(
        out,
        Outcome::failure(format!(
            r#"Get "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"#
        ))
    );
}

#[tokio::test]
async fn a_stalled_body_is_an_error() {
    let server = TestServer::http().await;
    let err = HttpProber::new().probe(&request(&server, "/slow-body"), Duration::from_millis(300)).await.unwrap_err();
    assert_eq!(err.result, ProbeResult::Failure);
    assert_eq!(err.message, "context deadline exceeded (Client.Timeout or context cancellation while reading body)");
}

#[tokio::test]
async fn only_10_kib_of_the_body_is_read() {
    let server = TestServer::http().await;
    let out = HttpProber::new().probe(&request(&server, "/large"), second()).await.unwrap();
    assert_eq!(out.result, ProbeResult::Success);
    assert_eq!(out.output.len(), MAX_RESPONSE_BODY);
}

#[tokio::test]
async fn a_refused_connection_fails() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let req =
        HttpGetRequest::for_action(&action("/", IntOrString::Int(i32::from(port))), &container(), "127.0.0.1", "probe")
            .unwrap();
    let out = HttpProber::new().probe(&req, second()).await.unwrap();
    assert_eq!(
        out,
        Outcome::failure(format!(
            r#"Get "http://127.0.0.1:{port}/": dial tcp 127.0.0.1:{port}: connect: connection refused"#
        ))
    );
}

#[tokio::test]
async fn an_empty_host_fails_as_go() {
    let req = HttpGetRequest::for_action(&action("/", IntOrString::Int(80)), &container(), "", "probe").unwrap();
    let out = HttpProber::new().probe(&req, second()).await.unwrap();
    assert_eq!(out, Outcome::failure(r#"Get "http://:80/": http: no Host in request URL"#));
}

#[tokio::test]
async fn https_skips_certificate_verification() {
    let server = TestServer::https();
    let mut a = action("/ok", IntOrString::Int(i32::from(server.port())));
    a.scheme = Some("HTTPS".into());
    for host in ["127.0.0.1", "localhost"] {
        a.host = Some(host.into());
        let req = HttpGetRequest::for_action(&a, &container(), "", "probe").unwrap();
        let out = HttpProber::new().probe(&req, second()).await.unwrap();
        assert_eq!(out, Outcome::success("ok"), "{host}");
    }
}

#[tokio::test]
async fn https_to_a_plain_server_is_recognised() {
    let server = TestServer::http().await;
    let mut a = action("/ok", IntOrString::Int(i32::from(server.port())));
    a.scheme = Some("HTTPS".into());
    let req = HttpGetRequest::for_action(&a, &container(), "127.0.0.1", "probe").unwrap();
    let err = HttpClient::new().get(&req, Some(second())).await.unwrap_err();
    assert!(err.is_http_response_to_https(), "{err}");
    assert_eq!(
        err.to_string(),
        format!(r#"Get "https://127.0.0.1:{}/ok": http: server gave HTTP response to HTTPS client"#, server.port())
    );
}
