//! `/logs/`: the node's log files under `/var/log` (upstream `ServeLogs`: an
//! `http.FileServer` of `/var/log/` behind `http.StripPrefix("/logs/")`), on with
//! `enableSystemLogHandler` (the v1beta1 default), else 405 `logs endpoint is disabled.`
//!
//! A directory is listed as the Go file server lists it (`<pre>` of links, directories
//! with a trailing `/`, sorted by name); a directory path without its trailing slash is
//! redirected (301) to the one with it; a file is streamed as it is read, as
//! `text/plain; charset=utf-8` (upstream guesses the type from the extension or the first
//! bytes), with `Last-Modified`, conditional requests and byte ranges as Go's file server
//! (see [`super::serve_content`]): `curl -r -4096 .../logs/syslog` reads the last 4 KiB.
//! Paths cannot leave the root: dot segments are refused before authentication (see the
//! server's limits), and unlike upstream a symlink that resolves outside the root is 404.
//! `index.html` is not served specially; `enableSystemLogQuery` (journal queries) is not
//! implemented.

use std::fmt::Write as _;
use std::path::{Component, PathBuf};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::streaming::text;

/// The directory `/logs/` serves: `/var/log`.
pub const SYSTEM_LOG_DIR: &str = "/var/log";

/// The root of `/logs/`.
#[derive(Debug, Clone)]
pub(crate) struct SystemLogs {
    pub(crate) root: Arc<PathBuf>,
}

/// `/logs/`.
pub(crate) async fn root(State(logs): State<SystemLogs>, headers: HeaderMap) -> Response {
    serve(&logs, "", &headers).await
}

/// `/logs/{*path}`.
pub(crate) async fn path(State(logs): State<SystemLogs>, Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&logs, &path, &headers).await
}

/// The 405 of a disabled `/logs`.
pub(crate) async fn disabled() -> Response {
    text(StatusCode::METHOD_NOT_ALLOWED, "logs endpoint is disabled.")
}

fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, "404 page not found\n")
}

/// Minimal HTML escaping of names in the listing (Go's `htmlReplacer`).
fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&#34;").replace('\'', "&#39;")
}

async fn serve(logs: &SystemLogs, relative: &str, headers: &HeaderMap) -> Response {
    let trailing_slash = relative.is_empty() || relative.ends_with('/');
    let mut path = logs.root.as_ref().clone();
    for component in std::path::Path::new(relative).components() {
        match component {
            Component::Normal(c) => path.push(c),
            Component::CurDir => {}
            // `..` never reaches here (refused before authentication); refuse it anyway.
            _ => return not_found(),
        }
    }
    // Symlinks are followed, but only to what stays under the root.
    let (Ok(real), Ok(real_root)) =
        (tokio::fs::canonicalize(&path).await, tokio::fs::canonicalize(logs.root.as_ref()).await)
    else {
        return not_found();
    };
    if !real.starts_with(&real_root) {
        return not_found();
    }
    let Ok(meta) = tokio::fs::metadata(&real).await else { return not_found() };
    let name = relative.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
    if meta.is_dir() {
        if !trailing_slash {
            let location = format!("{name}/");
            return (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, location)]).into_response();
        }
        return list(&real).await;
    }
    if trailing_slash {
        // Go's file server redirects a file's path with a slash to the one without.
        let location = format!("../{name}");
        return (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, location)]).into_response();
    }
    match tokio::fs::File::open(&real).await {
        Ok(file) => super::serve_content::serve_file(file, "text/plain; charset=utf-8", headers).await,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => text(StatusCode::FORBIDDEN, "403 Forbidden\n"),
        Err(_) => not_found(),
    }
}

/// A directory listing, as Go's `dirList`.
async fn list(dir: &std::path::Path) -> Response {
    let Ok(mut entries) = tokio::fs::read_dir(dir).await else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "Error reading directory");
    };
    let mut names = Vec::new();
    while let Ok(Some(entry)) = entries.next_entry().await {
        let mut name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().await.is_ok_and(|t| t.is_dir()) {
            name.push('/');
        }
        names.push(name);
    }
    names.sort();
    let mut body = String::from("<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n");
    for name in names {
        let href: String =
            url::form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>().replace("%2F", "/");
        let _ = writeln!(body, "<a href=\"{}\">{}</a>", escape(&href.replace('+', "%20")), escape(&name));
    }
    body.push_str("</pre>\n");
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;

    use super::*;

    async fn get(logs: &SystemLogs, path: &str) -> (StatusCode, String, Option<String>) {
        let response = serve(logs, path, &HeaderMap::new()).await;
        let status = response.status();
        let location = response.headers().get(header::LOCATION).map(|v| v.to_str().unwrap().to_owned());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned(), location)
    }

    #[tokio::test]
    async fn serves_files_and_listings_under_the_root_only() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "no").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("log");
        std::fs::create_dir_all(root.join("pods/a")).unwrap();
        std::fs::write(root.join("syslog"), "line 1\nline 2\n").unwrap();
        std::fs::write(root.join("a&b.log"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.join("escape")).unwrap();
        std::os::unix::fs::symlink(root.join("syslog"), root.join("inside")).unwrap();
        let logs = SystemLogs { root: Arc::new(root) };

        let (status, body, _) = get(&logs, "").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("<a href=\"pods/\">pods/</a>"), "{body}");
        assert!(body.contains("<a href=\"syslog\">syslog</a>"), "{body}");
        assert!(body.contains("a&amp;b.log"), "{body}");
        assert_eq!(get(&logs, "syslog").await.1, "line 1\nline 2\n");
        assert_eq!(get(&logs, "inside").await.1, "line 1\nline 2\n");
        assert_eq!(get(&logs, "pods").await, (StatusCode::MOVED_PERMANENTLY, String::new(), Some("pods/".into())));
        assert_eq!(get(&logs, "pods/").await.0, StatusCode::OK);
        assert_eq!(get(&logs, "syslog/").await.2, Some("../syslog".into()));
        assert_eq!(get(&logs, "escape").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get(&logs, "missing").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get(&logs, "../etc/passwd").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get(&logs, "/etc/passwd").await.0, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn a_file_is_served_with_ranges() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("syslog"), "line 1\nline 2\n").unwrap();
        let logs = SystemLogs { root: Arc::new(dir.path().to_path_buf()) };
        let mut headers = HeaderMap::new();
        headers.insert(header::RANGE, "bytes=-7".parse().unwrap());
        let response = serve(&logs, "syslog", &headers).await;
        assert_eq!(response.status(), StatusCode::PARTIAL_CONTENT);
        assert_eq!(response.headers()[header::CONTENT_RANGE], "bytes 7-13/14");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "text/plain; charset=utf-8");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"line 2\n");
    }
}
