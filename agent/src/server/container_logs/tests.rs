use std::time::Duration;

use http_body_util::BodyExt as _;
use prometheus_client::registry::Registry;
use tower::ServiceExt as _;

use super::*;
use crate::container::api;
use crate::container::fake::FakeRuntime;
use crate::server::{DebuggingHandlers, Endpoints, FakePods};

#[test]
fn queries_decode_and_validate_as_upstream() {
    let parse = PodLogOptions::from_query;
    assert_eq!(parse(None), Ok(PodLogOptions::default()));
    let o = parse(Some("follow=true&previous=1&timestamps=false&tailLines=10&limitBytes=5&sinceSeconds=60")).unwrap();
    assert!(o.follow && o.previous && !o.timestamps);
    assert_eq!((o.tail_lines, o.limit_bytes, o.since_seconds), (Some(10), Some(5), Some(60)));
    assert_eq!(parse(Some("tail=3")).unwrap().tail_lines, Some(3));
    assert_eq!(parse(Some("tail=all&tailLines=4")).unwrap().tail_lines, None);
    assert!(parse(Some("follow=")).unwrap().follow, "an empty value is true for the API's codec");
    let since = parse(Some("sinceTime=2026-01-02T03:04:05Z")).unwrap().since_time.unwrap();
    assert_eq!(since, "2026-01-02T03:04:05Z".parse().unwrap());

    assert!(matches!(parse(Some("tailLines=x")), Err(QueryError::Decode(_))));
    assert!(matches!(parse(Some("sinceTime=yesterday")), Err(QueryError::Decode(_))));
    for bad in [
        "tailLines=-1",
        "limitBytes=0",
        "sinceSeconds=0",
        "sinceSeconds=5&sinceTime=2026-01-02T03:04:05Z",
        "stream=Stdout&tailLines=1",
        "stream=stdout",
    ] {
        assert!(matches!(parse(Some(bad)), Err(QueryError::Invalid(_))), "{bad}");
    }
    assert!(parse(Some("stream=Stderr")).is_ok());

    let now: jiff::Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
    let opts = parse(Some("sinceSeconds=5&tailLines=2")).unwrap().to_log_options(now);
    assert_eq!(opts.since, Some("2026-01-02T03:04:00Z".parse().unwrap()));
    assert_eq!(opts.tail_lines, Some(2));
}

fn pod_with_status(status: &serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        "status": {"containerStatuses": [status]}
    }))
    .unwrap()
}

#[test]
fn the_container_instance_comes_from_the_status() {
    let running = pod_with_status(&serde_json::json!({
        "name": "main", "image": "", "imageID": "", "ready": true, "restartCount": 1,
        "containerID": "containerd://new",
        "state": {"running": {}},
        "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://old"}}
    }));
    assert_eq!(log_container_id(&running, "main", false), Ok("new".into()));
    assert_eq!(log_container_id(&running, "main", true), Ok("old".into()));
    assert_eq!(
        log_container_id(&running, "other", false),
        Err("container \"other\" in pod \"web\" is not available".into())
    );
    let first = pod_with_status(&serde_json::json!({
        "name": "main", "image": "", "imageID": "", "ready": true, "restartCount": 0,
        "containerID": "containerd://new", "state": {"running": {}}
    }));
    assert_eq!(
        log_container_id(&first, "main", true),
        Err("previous terminated container \"main\" in pod \"web\" not found".into())
    );
    let waiting = pod_with_status(&serde_json::json!({
        "name": "main", "image": "", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": "ErrImagePull"}}
    }));
    assert_eq!(
        log_container_id(&waiting, "main", false),
        Err("container \"main\" in pod \"web\" is waiting to start: image can't be pulled".into())
    );
    let crashed = pod_with_status(&serde_json::json!({
        "name": "main", "image": "", "imageID": "", "ready": false, "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://old"}}
    }));
    assert_eq!(log_container_id(&crashed, "main", false), Ok("old".into()));
}

/// The router with pod `web` whose container `main` runs (current log `1.log`) after a
/// first instance (`0.log`).
async fn router(dir: &std::path::Path) -> axum::Router {
    let rt = Arc::new(FakeRuntime::default());
    let sb = rt.run_pod_sandbox(api::PodSandboxConfig::default(), String::new()).await.unwrap();
    let mut ids = Vec::new();
    for (i, text) in
        ["2026-01-02T03:04:05Z stdout F before\n", "2026-01-02T03:04:06Z stdout F now\n"].iter().enumerate()
    {
        let log = dir.join(format!("{i}.log"));
        std::fs::write(&log, text).unwrap();
        let config = api::ContainerConfig { log_path: log.display().to_string(), ..Default::default() };
        let id = rt.create_container(&sb, config, api::PodSandboxConfig::default()).await.unwrap();
        rt.start_container(&id).await.unwrap();
        ids.push(id);
    }
    rt.exit_container(&ids[0], 1);
    let pod = pod_with_status(&serde_json::json!({
        "name": "main", "image": "", "imageID": "", "ready": true, "restartCount": 1,
        "containerID": format!("containerd://{}", ids[1]),
        "state": {"running": {}},
        "lastState": {"terminated": {"exitCode": 1, "containerID": format!("containerd://{}", ids[0])}}
    }));
    Endpoints::new(Arc::new(FakePods::new(vec![pod])), Arc::new(Registry::default()))
        .debugging_handlers(DebuggingHandlers {
            runtime: rt,
            enable_debugging_handlers: true,
            enable_system_log_handler: true,
            streaming_connection_idle_timeout: Duration::from_mins(1),
            system_log_dir: dir.to_owned(),
        })
        .routes
}

async fn get(router: &axum::Router, path: &str) -> (StatusCode, String) {
    let request = http::Request::get(path).body(Body::empty()).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn the_endpoint_serves_current_and_previous_logs() {
    let dir = tempfile::tempdir().unwrap();
    let router = router(dir.path()).await;
    let cases = [
        ("/containerLogs/default/web/main", StatusCode::OK, "now\n"),
        ("/containerLogs/default/web/main?previous=true", StatusCode::OK, "before\n"),
        ("/containerLogs/default/web/main?timestamps=1", StatusCode::OK, "2026-01-02T03:04:06Z now\n"),
        // Following an exited container ends at the end of its log.
        ("/containerLogs/default/web/main?previous=true&follow=true", StatusCode::OK, "before\n"),
        ("/containerLogs/default/nope/main", StatusCode::NOT_FOUND, "pod \"nope\" does not exist"),
        ("/containerLogs/default/web/other", StatusCode::NOT_FOUND, "container \"other\" not found in pod \"web\""),
        (
            "/containerLogs/default/web/main?tailLines=-1",
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"message": "Invalid request."}"#,
        ),
        (
            "/containerLogs/default/web/main?limitBytes=x",
            StatusCode::BAD_REQUEST,
            r#"{"message": "Unable to decode query."}"#,
        ),
    ];
    for (path, status, body) in cases {
        assert_eq!(get(&router, path).await, (status, body.into()), "{path}");
    }
    // A log file that is gone.
    std::fs::remove_file(dir.path().join("1.log")).unwrap();
    let (status, body) = get(&router, "/containerLogs/default/web/main").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("failed to open log file"), "{body}");
    // `/logs/` serves the system log directory (here the test's).
    assert_eq!(get(&router, "/logs/0.log").await, (StatusCode::OK, "2026-01-02T03:04:05Z stdout F before\n".into()));
}
