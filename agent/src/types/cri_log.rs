//! The CRI log file format (upstream `parseCRILog` in `pkg/kubelet/kuberuntime/logs`):
//! one line per chunk of a container's output, `<RFC3339Nano> <stdout|stderr> <P|F>
//! <content>`, and finding where the last lines of such a file start. Read by the
//! `/containerLogs` reader (`logs::reader`) and for termination messages that fall back to
//! the log (`container::termination_message`).

use std::io;
use std::os::unix::fs::FileExt as _;

use jiff::Timestamp;

/// Block size of the backwards search for the last lines.
const BLOCK_SIZE: u64 = 4096;

/// The stream a CRI log line belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// One parsed CRI log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogMessage<'a> {
    pub timestamp: Timestamp,
    /// The timestamp as written (what `timestamps` prints: upstream re-formats the parsed
    /// time as `RFC3339Nano`, which gives the same text for what runtimes write).
    pub timestamp_text: &'a [u8],
    pub stream: LogStream,
    /// `P`: the line continues in the next CRI line.
    pub partial: bool,
    /// The output, with its newline for a full line and without one for a partial line.
    pub content: &'a [u8],
}

/// Why a CRI log line did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("timestamp is not found")]
    NoTimestamp,
    #[error("unexpected timestamp format: {0}")]
    Timestamp(String),
    #[error("stream type is not found")]
    NoStream,
    #[error("unexpected stream type {0:?}")]
    Stream(String),
    #[error("log tag is not found")]
    NoTag,
}

/// Parses one line of a CRI log file (upstream `parseCRILog`). `line` may end in `\n`.
pub fn parse_cri_line(line: &[u8]) -> Result<LogMessage<'_>, ParseError> {
    let split = |s: &'_ [u8], missing| -> Result<(usize, usize), ParseError> {
        s.iter().position(|&b| b == b' ').map(|i| (i, i + 1)).ok_or(missing)
    };
    let (end, next) = split(line, ParseError::NoTimestamp)?;
    let timestamp_text = &line[..end];
    let text = std::str::from_utf8(timestamp_text).map_err(|e| ParseError::Timestamp(e.to_string()))?;
    let timestamp: Timestamp = text.parse().map_err(|e: jiff::Error| ParseError::Timestamp(e.to_string()))?;
    let rest = &line[next..];
    let (end, next) = split(rest, ParseError::NoStream)?;
    let stream = match &rest[..end] {
        b"stdout" => LogStream::Stdout,
        b"stderr" => LogStream::Stderr,
        other => return Err(ParseError::Stream(String::from_utf8_lossy(other).into_owned())),
    };
    let rest = &rest[next..];
    let (end, next) = split(rest, ParseError::NoTag)?;
    // Tags are `:`-separated for forward compatibility; the first says partial or full.
    let partial = rest[..end].split(|&b| b == b':').next() == Some(b"P");
    let mut content = &rest[next..];
    if partial && content.last() == Some(&b'\n') {
        content = &content[..content.len() - 1];
    }
    Ok(LogMessage { timestamp, timestamp_text, stream, partial, content })
}

/// Where the first of the last `n` lines of `file` starts (upstream
/// `findTailLineStartIndex`): reads blocks backwards from the end until it has seen more
/// than `n` newlines.
pub fn tail_start(file: &std::fs::File, n: u64) -> io::Result<u64> {
    let size = file.metadata()?.len();
    let mut count = 0u64;
    let mut left = size;
    let mut block = Vec::new();
    let mut right = size;
    while right > 0 && count <= n {
        left = right.saturating_sub(BLOCK_SIZE);
        block.resize((right - left) as usize, 0);
        file.read_exact_at(&mut block, left)?;
        count += memchr_count(&block);
        right = left;
    }
    // `block` is the first block read that reached the count: skip its extra lines.
    let mut start = 0usize;
    while count > n {
        match block[start..].iter().position(|&b| b == b'\n') {
            Some(i) => start += i + 1,
            None => break,
        }
        count -= 1;
    }
    Ok(left + start as u64)
}

/// The newlines in `block`.
fn memchr_count(block: &[u8]) -> u64 {
    block.iter().fold(0, |n, &b| n + u64::from(b == b'\n'))
}
