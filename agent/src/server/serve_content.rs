//! A file served as Go's `http.ServeContent` serves one (what upstream's `/logs/` file
//! server does for every file): `Last-Modified`, the conditional requests (RFC 7232) and
//! byte ranges (RFC 7233).
//!
//! - `Last-Modified` is the file's modification time (none for a time at the Unix epoch).
//! - `If-Match` / `If-Unmodified-Since` that fail are 412; `If-None-Match` / `If-Modified-Since`
//!   that fail are 304. Files have no `ETag`, so an entity tag never matches; only `*` does.
//! - `Range: bytes=...`: one range is a 206 with `Content-Range`, several are a 206
//!   `multipart/byteranges` (each part with its `Content-Range` and `Content-Type`),
//!   streamed from one open file; a range that overlaps nothing is 416 with
//!   `Content-Range: bytes */<size>` (except on an empty file: 200), a malformed one 416
//!   `invalid range`; ranges adding up to more than the file are ignored (200), as is
//!   `Range` when `If-Range` does not name the file's modification time.
//! - `Accept-Ranges: bytes` on every file.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use rand::Rng as _;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};

/// What a precondition header says (Go's `condResult`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cond {
    /// Absent (or, for the date headers, unparsable).
    None,
    True,
    False,
}

/// One byte range of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ByteRange {
    pub(crate) start: u64,
    pub(crate) length: u64,
}

impl ByteRange {
    fn content_range(self, size: u64) -> String {
        // A zero-length range (`bytes=-0`) is written as Go writes it: end before start.
        let end = (self.start + self.length).cast_signed() - 1;
        format!("bytes {}-{end}/{size}", self.start)
    }
}

/// Why a `Range` header is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeError {
    /// Malformed.
    Invalid,
    /// Every range starts past the end.
    NoOverlap,
}

impl RangeError {
    const fn message(self) -> &'static str {
        match self {
            Self::Invalid => "invalid range",
            Self::NoOverlap => "invalid range: failed to overlap",
        }
    }
}

/// Parses a `Range` header against a file of `size` bytes (Go's `parseRange`): empty for
/// no header; ranges starting past the end are dropped, and all of them dropped is
/// [`RangeError::NoOverlap`].
pub(crate) fn parse_range(header: &str, size: u64) -> Result<Vec<ByteRange>, RangeError> {
    if header.is_empty() {
        return Ok(Vec::new());
    }
    let Some(specs) = header.strip_prefix("bytes=") else { return Err(RangeError::Invalid) };
    let number = |s: &str| s.parse::<i64>().ok().filter(|n| *n >= 0).map(i64::cast_unsigned);
    let mut ranges = Vec::new();
    let mut no_overlap = false;
    for spec in specs.split(',').map(trim) {
        if spec.is_empty() {
            continue;
        }
        let Some((start, end)) = spec.split_once('-') else { return Err(RangeError::Invalid) };
        let (start, end) = (trim(start), trim(end));
        let range = if start.is_empty() {
            // A suffix: the last `end` bytes.
            if end.starts_with('-') {
                return Err(RangeError::Invalid);
            }
            let n = number(end).ok_or(RangeError::Invalid)?.min(size);
            ByteRange { start: size - n, length: n }
        } else {
            let start = number(start).ok_or(RangeError::Invalid)?;
            if start >= size {
                no_overlap = true;
                continue;
            }
            let last = if end.is_empty() {
                size - 1
            } else {
                let end = end.parse::<i64>().map_err(|_| RangeError::Invalid)?;
                if end < start.cast_signed() {
                    return Err(RangeError::Invalid);
                }
                end.cast_unsigned().min(size - 1)
            };
            ByteRange { start, length: last - start + 1 }
        };
        ranges.push(range);
    }
    if no_overlap && ranges.is_empty() {
        return Err(RangeError::NoOverlap);
    }
    Ok(ranges)
}

/// Go's `textproto.TrimString`: ASCII spaces and tabs (and line ends) off both ends.
fn trim(s: &str) -> &str {
    s.trim_matches([' ', '\t', '\r', '\n'])
}

fn header_str<'a>(headers: &'a HeaderMap, name: &header::HeaderName) -> &'a str {
    headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
}

/// Whether an `If-Match` / `If-None-Match` list holds `*` before anything that is not
/// an entity tag (a tag itself never matches: files have none).
fn has_star(list: &str) -> bool {
    for item in list.split(',').map(trim).filter(|i| !i.is_empty()) {
        if item == "*" {
            return true;
        }
        let tag = item.strip_prefix("W/").unwrap_or(item);
        if !(tag.len() >= 2 && tag.starts_with('"') && tag.ends_with('"')) {
            return false;
        }
    }
    false
}

/// Whole seconds since the epoch (`Last-Modified` has no fractions).
fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `modtime <= date` at whole seconds, for a parsable date header.
fn not_after(headers: &HeaderMap, name: &header::HeaderName, modified: Option<SystemTime>) -> Cond {
    let value = header_str(headers, name);
    let (Some(modified), false) = (modified, value.is_empty()) else { return Cond::None };
    match httpdate::parse_http_date(value) {
        Ok(date) if unix_secs(modified) <= unix_secs(date) => Cond::True,
        Ok(_) => Cond::False,
        Err(_) => Cond::None,
    }
}

/// The preconditions (Go's `checkPreconditions`, RFC 7232 section 6): `Err` is the
/// response that ends the request (412, 304), `Ok` the `Range` header to honour ("" for
/// none).
fn check_preconditions(headers: &HeaderMap, modified: Option<SystemTime>) -> Result<&str, StatusCode> {
    let if_match = header_str(headers, &header::IF_MATCH);
    let matched = if if_match.is_empty() {
        not_after(headers, &header::IF_UNMODIFIED_SINCE, modified)
    } else if has_star(if_match) {
        Cond::True
    } else {
        Cond::False
    };
    if matched == Cond::False {
        return Err(StatusCode::PRECONDITION_FAILED);
    }
    let if_none_match = header_str(headers, &header::IF_NONE_MATCH);
    if if_none_match.is_empty() {
        // Modified since the date is condTrue; not modified is 304.
        if not_after(headers, &header::IF_MODIFIED_SINCE, modified) == Cond::True {
            return Err(StatusCode::NOT_MODIFIED);
        }
    } else if has_star(if_none_match) {
        return Err(StatusCode::NOT_MODIFIED);
    }
    let range = header_str(headers, &header::RANGE);
    let if_range = trim(header_str(headers, &header::IF_RANGE));
    if range.is_empty() || if_range.is_empty() {
        return Ok(range);
    }
    // An entity tag never matches; a date must be the modification time's second.
    let same_time = !if_range.starts_with('"')
        && !if_range.starts_with("W/")
        && modified.zip(httpdate::parse_http_date(if_range).ok()).is_some_and(|(m, d)| unix_secs(m) == unix_secs(d));
    Ok(if same_time { range } else { "" })
}

/// Go's `http.Error` for a failed range: plain text, `nosniff`.
fn range_error(e: RangeError, size: u64) -> Response {
    let mut r = (StatusCode::RANGE_NOT_SATISFIABLE, format!("{}\n", e.message())).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if e == RangeError::NoOverlap
        && let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}"))
    {
        h.insert(header::CONTENT_RANGE, v);
    }
    r
}

/// One section of the body: a prefix (a multipart header), then `length` bytes of the
/// file from `start`.
struct Section {
    prefix: String,
    start: u64,
    length: u64,
}

/// Streams sections of one open file, then `trailer`, reading 32 KiB at a time. A file
/// that ends early ends the body with an error (the client sees a short response).
fn sections_body(file: tokio::fs::File, sections: Vec<Section>, trailer: String) -> Body {
    struct State {
        file: tokio::fs::File,
        sections: VecDeque<Section>,
        left: u64,
        trailer: Option<String>,
        buf: Vec<u8>,
    }
    let state = State {
        file,
        sections: sections.into(),
        left: 0,
        trailer: (!trailer.is_empty()).then_some(trailer),
        buf: vec![0; 32 * 1024],
    };
    let stream = futures::stream::try_unfold(state, |mut s| async move {
        if s.left > 0 {
            let want = usize::try_from(s.left).unwrap_or(usize::MAX).min(s.buf.len());
            let n = s.file.read(&mut s.buf[..want]).await?;
            if n == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file shrank while served"));
            }
            s.left -= n as u64;
            let chunk = Bytes::copy_from_slice(&s.buf[..n]);
            return Ok(Some((chunk, s)));
        }
        if let Some(section) = s.sections.pop_front() {
            s.file.seek(std::io::SeekFrom::Start(section.start)).await?;
            s.left = section.length;
            return Ok(Some((Bytes::from(section.prefix), s)));
        }
        Ok(s.trailer.take().map(|t| (Bytes::from(t), s)))
    });
    Body::from_stream(stream)
}

/// Serves `file` (already open; `content_type` for it and its parts) as Go's
/// `ServeContent` does for `headers`.
pub(crate) async fn serve_file(file: tokio::fs::File, content_type: &'static str, headers: &HeaderMap) -> Response {
    let meta = match file.metadata().await {
        Ok(m) => m,
        Err(e) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response();
        }
    };
    let size = meta.len();
    let modified = meta.modified().ok().filter(|t| unix_secs(*t) > 0);
    let last_modified = modified.and_then(|t| {
        HeaderValue::from_str(&httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(unix_secs(t)))).ok()
    });
    let with_last_modified = |mut r: Response| {
        if let Some(v) = &last_modified {
            r.headers_mut().insert(header::LAST_MODIFIED, v.clone());
        }
        r
    };
    let range = match check_preconditions(headers, modified) {
        Ok(range) => range,
        // Both keep `Last-Modified` (Go sets it first; only its errors remove it).
        Err(status) => return with_last_modified(status.into_response()),
    };
    let mut ranges = match parse_range(range, size) {
        Ok(r) => r,
        Err(RangeError::NoOverlap) if size == 0 => Vec::new(),
        Err(e) => return range_error(e, size),
    };
    if ranges.iter().map(|r| r.length).sum::<u64>() > size {
        ranges.clear();
    }
    let (status, body_type, length, body) = match ranges.as_slice() {
        [] => {
            let stream = tokio_util::io::ReaderStream::with_capacity(file, 32 * 1024);
            (StatusCode::OK, content_type.to_owned(), size, Body::from_stream(stream))
        }
        [one] => {
            let section = Section { prefix: String::new(), start: one.start, length: one.length };
            (
                StatusCode::PARTIAL_CONTENT,
                content_type.to_owned(),
                one.length,
                sections_body(file, vec![section], String::new()),
            )
        }
        many => {
            // Go's multipart.Writer: a 30-byte random hex boundary, headers sorted.
            let boundary = hex::encode(rand::rng().random::<[u8; 30]>());
            let sections: Vec<Section> = many
                .iter()
                .enumerate()
                .map(|(i, r)| Section {
                    prefix: format!(
                        "{}--{boundary}\r\nContent-Range: {}\r\nContent-Type: {content_type}\r\n\r\n",
                        if i == 0 { "" } else { "\r\n" },
                        r.content_range(size)
                    ),
                    start: r.start,
                    length: r.length,
                })
                .collect();
            let trailer = format!("\r\n--{boundary}--\r\n");
            let length = sections.iter().map(|s| s.prefix.len() as u64 + s.length).sum::<u64>() + trailer.len() as u64;
            let body_type = format!("multipart/byteranges; boundary={boundary}");
            (StatusCode::PARTIAL_CONTENT, body_type, length, sections_body(file, sections, trailer))
        }
    };
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&body_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    if let [one] = ranges.as_slice()
        && let Ok(v) = HeaderValue::from_str(&one.content_range(size))
    {
        h.insert(header::CONTENT_RANGE, v);
    }
    with_last_modified(r)
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;

    use super::*;

    const CONTENT: &str = "0123456789abcdefghij";

    fn r(start: u64, length: u64) -> ByteRange {
        ByteRange { start, length }
    }

    #[test]
    fn ranges_parse_as_go_parses_them() {
        let size = 20;
        assert_eq!(parse_range("", size), Ok(vec![]));
        assert_eq!(parse_range("bytes=0-4", size), Ok(vec![r(0, 5)]));
        assert_eq!(parse_range("bytes=5-", size), Ok(vec![r(5, 15)]));
        assert_eq!(parse_range("bytes=-5", size), Ok(vec![r(15, 5)]));
        assert_eq!(parse_range("bytes=-50", size), Ok(vec![r(0, 20)]), "a suffix longer than the file is all of it");
        assert_eq!(parse_range("bytes=10-99", size), Ok(vec![r(10, 10)]), "the end is clamped");
        assert_eq!(parse_range("bytes= 0-1 ,, 3-3", size), Ok(vec![r(0, 2), r(3, 1)]));
        assert_eq!(parse_range("bytes=0-1,30-40", size), Ok(vec![r(0, 2)]), "ranges past the end are dropped");
        assert_eq!(parse_range("bytes=20-", size), Err(RangeError::NoOverlap));
        assert_eq!(parse_range("bytes=30-40,25-", size), Err(RangeError::NoOverlap));
        for bad in ["items=0-1", "bytes=5", "bytes=5-3", "bytes=-", "bytes=--5", "bytes=x-5", "bytes=-x", "bytes=5--3"]
        {
            assert_eq!(parse_range(bad, size), Err(RangeError::Invalid), "{bad}");
        }
    }

    fn file(dir: &tempfile::TempDir, modified: SystemTime) -> std::path::PathBuf {
        let path = dir.path().join("f.log");
        std::fs::write(&path, CONTENT).unwrap();
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(modified).unwrap();
        path
    }

    async fn get(path: &std::path::Path, headers: &[(header::HeaderName, &str)]) -> (StatusCode, HeaderMap, Vec<u8>) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(name.clone(), value.parse().unwrap());
        }
        let f = tokio::fs::File::open(path).await.unwrap();
        let response = serve_file(f, "text/plain; charset=utf-8", &map).await;
        let (parts, body) = response.into_parts();
        (parts.status, parts.headers, body.collect().await.unwrap().to_bytes().to_vec())
    }

    #[tokio::test]
    async fn whole_file_one_range_and_several() {
        let dir = tempfile::tempdir().unwrap();
        let modified = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let path = file(&dir, modified + Duration::from_millis(250));

        let (status, h, body) = get(&path, &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, CONTENT.as_bytes());
        assert_eq!(h[header::ACCEPT_RANGES], "bytes");
        assert_eq!(h[header::CONTENT_LENGTH], "20");
        assert_eq!(h[header::LAST_MODIFIED], "Tue, 14 Nov 2023 22:13:20 GMT", "whole seconds");

        let (status, h, body) = get(&path, &[(header::RANGE, "bytes=2-4")]).await;
        assert_eq!(status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(body, b"234");
        assert_eq!(h[header::CONTENT_RANGE], "bytes 2-4/20");
        assert_eq!(h[header::CONTENT_LENGTH], "3");

        let (status, h, body) = get(&path, &[(header::RANGE, "bytes=0-1,-3")]).await;
        assert_eq!(status, StatusCode::PARTIAL_CONTENT);
        let content_type = h[header::CONTENT_TYPE].to_str().unwrap();
        let boundary = content_type.strip_prefix("multipart/byteranges; boundary=").unwrap();
        assert_eq!(boundary.len(), 60);
        let expected = format!(
            "--{boundary}\r\nContent-Range: bytes 0-1/20\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n01\
             \r\n--{boundary}\r\nContent-Range: bytes 17-19/20\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nhij\
             \r\n--{boundary}--\r\n"
        );
        assert_eq!(String::from_utf8(body).unwrap(), expected);
        assert_eq!(h[header::CONTENT_LENGTH], expected.len().to_string().as_str());

        // More bytes asked for than the file has: the whole file.
        let (status, _, body) = get(&path, &[(header::RANGE, "bytes=0-15,5-19")]).await;
        assert_eq!((status, body.len()), (StatusCode::OK, 20));
    }

    #[tokio::test]
    async fn unsatisfiable_and_malformed_ranges_are_416() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(&dir, SystemTime::now());
        let (status, h, body) = get(&path, &[(header::RANGE, "bytes=20-")]).await;
        assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(h[header::CONTENT_RANGE], "bytes */20");
        assert_eq!(body, b"invalid range: failed to overlap\n");
        assert!(h.get(header::LAST_MODIFIED).is_none(), "errors carry no Last-Modified, as Go's");
        let (status, h, body) = get(&path, &[(header::RANGE, "bytes=9-3")]).await;
        assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE);
        assert!(h.get(header::CONTENT_RANGE).is_none());
        assert_eq!(body, b"invalid range\n");

        // An empty file ignores a range that cannot overlap.
        let empty = dir.path().join("empty.log");
        std::fs::write(&empty, "").unwrap();
        assert_eq!(get(&empty, &[(header::RANGE, "bytes=0-10")]).await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn conditional_requests() {
        let dir = tempfile::tempdir().unwrap();
        let modified = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let path = file(&dir, modified + Duration::from_millis(600));
        let same = "Tue, 14 Nov 2023 22:13:20 GMT";
        let before = "Tue, 14 Nov 2023 22:13:19 GMT";

        let (status, h, body) = get(&path, &[(header::IF_MODIFIED_SINCE, same)]).await;
        assert_eq!((status, body.len()), (StatusCode::NOT_MODIFIED, 0));
        assert_eq!(h[header::LAST_MODIFIED], same);
        assert_eq!(get(&path, &[(header::IF_MODIFIED_SINCE, before)]).await.0, StatusCode::OK);
        assert_eq!(get(&path, &[(header::IF_MODIFIED_SINCE, "yesterday")]).await.0, StatusCode::OK);
        // RFC 850 and asctime dates too, as Go's ParseTime.
        assert_eq!(
            get(&path, &[(header::IF_MODIFIED_SINCE, "Tuesday, 14-Nov-23 22:13:20 GMT")]).await.0,
            StatusCode::NOT_MODIFIED
        );
        assert_eq!(
            get(&path, &[(header::IF_MODIFIED_SINCE, "Tue Nov 14 22:13:20 2023")]).await.0,
            StatusCode::NOT_MODIFIED
        );
        assert_eq!(get(&path, &[(header::IF_NONE_MATCH, "*")]).await.0, StatusCode::NOT_MODIFIED);
        // A tag never matches (files have none), and then the date is not looked at.
        assert_eq!(
            get(&path, &[(header::IF_NONE_MATCH, "\"abc\""), (header::IF_MODIFIED_SINCE, same)]).await.0,
            StatusCode::OK
        );

        assert_eq!(get(&path, &[(header::IF_UNMODIFIED_SINCE, before)]).await.0, StatusCode::PRECONDITION_FAILED);
        assert_eq!(get(&path, &[(header::IF_UNMODIFIED_SINCE, same)]).await.0, StatusCode::OK);
        assert_eq!(get(&path, &[(header::IF_MATCH, "\"abc\"")]).await.0, StatusCode::PRECONDITION_FAILED);
        assert_eq!(get(&path, &[(header::IF_MATCH, "\"abc\", *")]).await.0, StatusCode::OK);
        assert_eq!(
            get(&path, &[(header::IF_MATCH, "*"), (header::IF_UNMODIFIED_SINCE, before)]).await.0,
            StatusCode::OK,
            "If-Match decides; the date is not looked at"
        );

        // If-Range: the range only while the file is the one the client has.
        let range = (header::RANGE, "bytes=0-0");
        assert_eq!(get(&path, &[range.clone(), (header::IF_RANGE, same)]).await.0, StatusCode::PARTIAL_CONTENT);
        assert_eq!(get(&path, &[range.clone(), (header::IF_RANGE, before)]).await.0, StatusCode::OK);
        assert_eq!(get(&path, &[range, (header::IF_RANGE, "\"abc\"")]).await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn a_file_that_shrinks_while_served_ends_the_body_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(&dir, SystemTime::now());
        let f = tokio::fs::File::open(&path).await.unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::RANGE, "bytes=10-19".parse().unwrap());
        let response = serve_file(f, "text/plain", &headers).await;
        std::fs::File::options().write(true).open(&path).unwrap().set_len(12).unwrap();
        assert!(response.into_body().collect().await.is_err());
    }
}
