use std::fmt::Write as _;
use std::io::Write as _;

use super::*;
use crate::container::fake::FakeRuntime;

const T0: &str = "2026-01-02T03:04:05.000000001Z";
const T1: &str = "2026-01-02T03:04:06.5Z";
const T2: &str = "2026-01-02T03:04:07+01:00";

fn line(ts: &str, stream: &str, tag: &str, content: &str) -> String {
    format!("{ts} {stream} {tag} {content}\n")
}

#[test]
fn parses_full_and_partial_lines() {
    let text = line(T0, "stdout", "F", "hello world");
    let msg = parse_cri_line(text.as_bytes()).unwrap();
    assert_eq!(msg.stream, LogStream::Stdout);
    assert!(!msg.partial);
    assert_eq!(msg.content, b"hello world\n");
    assert_eq!(msg.timestamp_text, T0.as_bytes());
    assert_eq!(msg.timestamp, T0.parse::<Timestamp>().unwrap());

    let text = line(T2, "stderr", "P:x", "part");
    let msg = parse_cri_line(text.as_bytes()).unwrap();
    assert_eq!((msg.stream, msg.partial, msg.content), (LogStream::Stderr, true, &b"part"[..]));
    assert_eq!(msg.timestamp, "2026-01-02T02:04:07Z".parse::<Timestamp>().unwrap());
    // An empty full line is a newline.
    assert_eq!(parse_cri_line(format!("{T0} stdout F \n").as_bytes()).unwrap().content, b"\n");
}

#[test]
fn bad_lines_say_why() {
    assert_eq!(parse_cri_line(b"nospace"), Err(ParseError::NoTimestamp));
    assert!(matches!(parse_cri_line(b"yesterday stdout F x"), Err(ParseError::Timestamp(_))));
    assert_eq!(parse_cri_line(format!("{T0} stdout").as_bytes()), Err(ParseError::NoStream));
    assert_eq!(parse_cri_line(format!("{T0} stdin F x").as_bytes()), Err(ParseError::Stream("stdin".into())));
    assert_eq!(parse_cri_line(format!("{T0} stdout F").as_bytes()), Err(ParseError::NoTag));
}

#[test]
fn writer_applies_since_streams_timestamps_and_limit() {
    let a = line(T0, "stdout", "F", "a");
    let b = line(T1, "stderr", "P", "b1");
    let b2 = line(T1, "stderr", "F", "b2");
    let msgs: Vec<String> = vec![a, b, b2];
    let run = |opts: LogOptions| {
        let mut w = LogWriter::new(&opts);
        let mut out = BytesMut::new();
        let mut new_line = true;
        for m in &msgs {
            let msg = parse_cri_line(m.as_bytes()).unwrap();
            let done = w.write(&msg, new_line, &mut out) == Written::Limit;
            new_line = !msg.partial;
            if done {
                break;
            }
        }
        String::from_utf8(out.to_vec()).unwrap()
    };
    assert_eq!(run(LogOptions::default()), "a\nb1b2\n");
    assert_eq!(
        run(LogOptions { timestamps: true, ..LogOptions::default() }),
        format!("{T0} a\n{T1} b1b2\n"),
        "one prefix for the pieces of a partial line"
    );
    assert_eq!(run(LogOptions { since: Some(T1.parse().unwrap()), ..LogOptions::default() }), "b1b2\n");
    assert_eq!(run(LogOptions { streams: Streams::Stdout, ..LogOptions::default() }), "a\n");
    assert_eq!(run(LogOptions { streams: Streams::Stderr, ..LogOptions::default() }), "b1b2\n");
    assert_eq!(run(LogOptions { limit_bytes: Some(4), ..LogOptions::default() }), "a\nb1");
    assert_eq!(run(LogOptions { limit_bytes: Some(3), timestamps: true, ..LogOptions::default() }), "202");
}

#[test]
fn tail_start_reads_backwards() {
    let mut f = tempfile::tempfile().unwrap();
    let mut text = String::new();
    // Enough lines to span several blocks.
    for i in 0..2000 {
        writeln!(text, "line {i}").unwrap();
    }
    f.write_all(text.as_bytes()).unwrap();
    let start = |n| tail_start(&f, n).unwrap() as usize;
    assert_eq!(&text[start(0)..], "");
    assert_eq!(&text[start(1)..], "line 1999\n");
    assert_eq!(&text[start(3)..], "line 1997\nline 1998\nline 1999\n");
    assert_eq!(&text[start(1500)..].lines().next().unwrap(), &"line 500");
    assert_eq!(start(2000), 0);
    assert_eq!(start(10_000), 0);
    let empty = tempfile::tempfile().unwrap();
    assert_eq!(tail_start(&empty, 5).unwrap(), 0);
}

/// A running container in `rt`; its id.
async fn running_container(rt: &FakeRuntime) -> String {
    let sb = rt.run_pod_sandbox(api::PodSandboxConfig::default(), String::new()).await.unwrap();
    let id = rt.create_container(&sb, api::ContainerConfig::default(), api::PodSandboxConfig::default()).await.unwrap();
    rt.start_container(&id).await.unwrap();
    id
}

async fn read_all(path: &Path, id: &str, opts: LogOptions, rt: Arc<FakeRuntime>) -> String {
    let reader = LogReader::open(path, id, opts, rt).await.unwrap();
    let (tx, mut rx) = mpsc::channel(4);
    tokio::spawn(reader.run(tx));
    let mut out = Vec::new();
    while let Some(chunk) = rx.recv().await {
        let chunk = chunk.unwrap();
        assert!(chunk.len() <= CHUNK_BYTES + MAX_LINE_BYTES as usize);
        out.extend_from_slice(&chunk);
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn reads_a_file_with_options() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("0.log");
    let mut text = String::new();
    text.push_str(&line(T0, "stdout", "F", "first"));
    text.push_str("garbage line\n");
    text.push_str(&line(T1, "stdout", "P", "par"));
    text.push_str(&line(T1, "stdout", "F", "tial"));
    text.push_str(&line(T1, "stderr", "F", "last"));
    std::fs::write(&path, &text).unwrap();
    let rt = Arc::new(FakeRuntime::default());
    let id = running_container(&rt).await;
    let read = |opts| read_all(&path, &id, opts, rt.clone());
    assert_eq!(read(LogOptions::default()).await, "first\npartial\nlast\n");
    assert_eq!(read(LogOptions { tail_lines: Some(2), ..LogOptions::default() }).await, "tial\nlast\n");
    assert_eq!(read(LogOptions { tail_lines: Some(0), ..LogOptions::default() }).await, "");
    assert_eq!(read(LogOptions { limit_bytes: Some(9), ..LogOptions::default() }).await, "first\npar");
    // A symlink is read through, as upstream.
    let link = dir.path().join("link.log");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert_eq!(read_all(&link, &id, LogOptions::default(), rt.clone()).await, "first\npartial\nlast\n");
    let err = LogReader::open(&dir.path().join("missing.log"), &id, LogOptions::default(), rt.clone()).await;
    assert!(matches!(err, Err(Error::Open { .. })), "{err:?}");
}

#[tokio::test]
async fn a_large_file_streams_in_bounded_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("0.log");
    let mut f = std::fs::File::create(&path).unwrap();
    let row = line(T0, "stdout", "F", &"x".repeat(1000));
    for _ in 0..2000 {
        f.write_all(row.as_bytes()).unwrap();
    }
    let rt = Arc::new(FakeRuntime::default());
    let id = running_container(&rt).await;
    let reader = LogReader::open(&path, &id, LogOptions::default(), rt).await.unwrap();
    let (tx, mut rx) = mpsc::channel(1);
    tokio::spawn(reader.run(tx));
    let (mut total, mut chunks) = (0, 0);
    while let Some(chunk) = rx.recv().await {
        let chunk = chunk.unwrap();
        assert!(chunk.len() < CHUNK_BYTES + 1100, "{}", chunk.len());
        total += chunk.len();
        chunks += 1;
    }
    assert_eq!(total, 2000 * 1001);
    assert!(chunks > 50, "{chunks}");
}

/// Reads what `rx` has until `want` shows up (or panics after 10 s).
async fn until(rx: &mut mpsc::Receiver<io::Result<Bytes>>, got: &mut String, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !got.contains(want) {
        let chunk = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{want:?} did not come; got {got:?}"))
            .expect("stream open")
            .unwrap();
        got.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test]
async fn follow_goes_on_across_rotation_and_stops_when_the_container_exits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("0.log");
    let append = |p: &Path, s: &str| {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(p).unwrap();
        f.write_all(s.as_bytes()).unwrap();
    };
    append(&path, &line(T0, "stdout", "F", "one"));
    append(&path, &line(T0, "stdout", "F", "two"));
    let rt = Arc::new(FakeRuntime::default());
    let id = running_container(&rt).await;
    let opts = LogOptions { follow: true, tail_lines: Some(1), ..LogOptions::default() };
    let reader = LogReader::open(&path, &id, opts, rt.clone()).await.unwrap();
    let (tx, mut rx) = mpsc::channel(4);
    let task = tokio::spawn(reader.run(tx));
    let mut got = String::new();
    until(&mut rx, &mut got, "two\n").await;
    assert_eq!(got, "two\n", "tailLines picks the start");
    // A line written in two writes comes out whole.
    append(&path, &format!("{T1} stdout F thr"));
    append(&path, "ee\n");
    until(&mut rx, &mut got, "three\n").await;
    // Rotation: the runtime still writes to the renamed file, then reopens.
    let rotated = dir.path().join("0.log.20260102-030405");
    std::fs::rename(&path, &rotated).unwrap();
    append(&rotated, &line(T1, "stdout", "F", "four (old file)"));
    append(&path, &line(T1, "stdout", "F", "five (new file)"));
    until(&mut rx, &mut got, "five (new file)\n").await;
    assert_eq!(got, "two\nthree\nfour (old file)\nfive (new file)\n");
    // The container exits: what it wrote last is read, then the stream ends.
    append(&path, &line(T1, "stderr", "F", "bye"));
    rt.exit_container(&id, 0);
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        let mut rest = String::new();
        while let Some(chunk) = rx.recv().await {
            rest.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        rest
    })
    .await
    .expect("the follow ends once the container has exited");
    assert_eq!(rest, "bye\n");
    task.await.unwrap();
}

#[tokio::test]
async fn follow_stops_when_the_client_goes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("0.log");
    std::fs::write(&path, line(T0, "stdout", "F", "one")).unwrap();
    let rt = Arc::new(FakeRuntime::default());
    let id = running_container(&rt).await;
    let opts = LogOptions { follow: true, ..LogOptions::default() };
    let reader = LogReader::open(&path, &id, opts, rt).await.unwrap();
    let (tx, mut rx) = mpsc::channel(4);
    let task = tokio::spawn(reader.run(tx));
    let mut got = String::new();
    until(&mut rx, &mut got, "one\n").await;
    drop(rx);
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the reader stops").unwrap();
}
