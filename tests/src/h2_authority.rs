//! A server-side connection wrapper that makes the `:authority` of every request
//! `localhost`, for gRPC servers on unix sockets that Go clients dial by path.
//!
//! grpc-go, dialing a bare socket path without `grpc.WithAuthority`, sends that path as
//! the HTTP/2 `:authority`, and the h2 crate (under tonic) answers such a request with
//! `RST_STREAM(PROTOCOL_ERROR)`: a path is not an authority. The upstream kubelet dials a
//! plugin's registration socket that way (its plugin manager sets no authority), so the
//! test driver's registration API (`crate::csi_driver`), served by tonic, could not
//! register with it. Node-driver-registrar, which serves that API in a cluster, is
//! written in Go, whose server takes any authority.
//!
//! [`LocalAuthority`] rewrites what the client sends before the server reads it: it
//! passes the connection preface and every frame through, and in each `HEADERS` frame
//! that ends its header block it replaces the value of every literal header field whose
//! name is the HPACK static table's `:authority` (index 1) with `localhost`, leaving every
//! other byte as it was. The field keeps its representation, so an indexed one still
//! enters the server's dynamic table, there smaller than in the client's: the server's
//! table then holds at least what the client's does, with the same entries at the same
//! indices, and the client's later references to it resolve to `localhost`. A header
//! block continued in `CONTINUATION` frames is passed on unchanged (gRPC's request
//! headers fit one frame).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113, section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// `:authority` in the HPACK static table.
const AUTHORITY_INDEX: u64 = 1;
const LOCALHOST: &[u8] = b"localhost";

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Before the client's connection preface.
    Preface,
    /// Frames.
    Frames,
    /// Not HTTP/2 with a preface: passed on as it comes.
    Other,
}

/// A server's side of a connection whose client's `:authority` values become
/// `localhost` (see the module documentation).
#[derive(Debug)]
pub struct LocalAuthority<S> {
    inner: S,
    /// Read from `inner`, not yet a whole frame.
    raw: Vec<u8>,
    /// Rewritten, not yet read by the server.
    out: Vec<u8>,
    stage: Stage,
    eof: bool,
}

impl<S> LocalAuthority<S> {
    #[must_use]
    pub fn new(inner: S) -> Self {
        Self { inner, raw: Vec::new(), out: Vec::new(), stage: Stage::Preface, eof: false }
    }

    /// Moves what of `raw` is whole (the preface, whole frames) to `out`, rewritten.
    fn process(&mut self) {
        loop {
            match self.stage {
                Stage::Other => {
                    self.out.append(&mut self.raw);
                    return;
                }
                Stage::Preface if self.raw.len() < PREFACE.len() && PREFACE.starts_with(&self.raw) => return,
                Stage::Preface if self.raw.starts_with(PREFACE) => {
                    self.out.extend(self.raw.drain(..PREFACE.len()));
                    self.stage = Stage::Frames;
                }
                Stage::Preface => self.stage = Stage::Other,
                Stage::Frames => {
                    if self.raw.len() < FRAME_HEADER {
                        return;
                    }
                    let len = usize::from(self.raw[0]) << 16 | usize::from(self.raw[1]) << 8 | usize::from(self.raw[2]);
                    if self.raw.len() < FRAME_HEADER + len {
                        return;
                    }
                    let frame: Vec<u8> = self.raw.drain(..FRAME_HEADER + len).collect();
                    self.out.extend(rewrite_frame(&frame).as_deref().unwrap_or(&frame));
                }
            }
        }
    }
}

/// `frame` (header and payload) with its `:authority` values made `localhost`, if it is
/// a `HEADERS` frame ending its header block and has any; `None` otherwise (or if its
/// header block cannot be read, which the server will then tell the client).
#[must_use]
pub fn rewrite_frame(frame: &[u8]) -> Option<Vec<u8>> {
    let (header, payload) = frame.split_at_checked(FRAME_HEADER)?;
    let (kind, flags) = (header[3], header[4]);
    if kind != HEADERS || flags & END_HEADERS == 0 {
        return None;
    }
    let pad = if flags & PADDED != 0 { usize::from(*payload.first()?) } else { 0 };
    let start = usize::from(flags & PADDED != 0) + if flags & PRIORITY != 0 { 5 } else { 0 };
    let end = payload.len().checked_sub(pad)?;
    let block = payload.get(start..end)?;
    let rewritten = rewrite_block(block)?;
    let mut new_payload = payload[..start].to_vec();
    new_payload.extend(rewritten);
    new_payload.extend(&payload[end..]);
    let len = u32::try_from(new_payload.len()).ok().filter(|l| *l < 1 << 24)?;
    let mut out = Vec::with_capacity(FRAME_HEADER + new_payload.len());
    out.extend(&len.to_be_bytes()[1..]);
    out.extend(&header[3..]);
    out.extend(new_payload);
    Some(out)
}

/// An HPACK integer with an `n`-bit prefix at `block[*at]` (RFC 7541, section 5.1);
/// advances `at` past it.
fn integer(block: &[u8], at: &mut usize, n: u32) -> Option<u64> {
    let max = (1u64 << n) - 1;
    let mut value = u64::from(*block.get(*at)?) & max;
    *at += 1;
    if value < max {
        return Some(value);
    }
    let mut shift = 0;
    loop {
        let b = *block.get(*at)?;
        *at += 1;
        value = value.checked_add(u64::from(b & 0x7f).checked_shl(shift)?)?;
        shift += 7;
        if b & 0x80 == 0 {
            return Some(value);
        }
        if shift > 56 {
            return None;
        }
    }
}

/// Skips a string literal (RFC 7541, section 5.2) at `block[*at]`.
fn skip_string(block: &[u8], at: &mut usize) -> Option<()> {
    let len = usize::try_from(integer(block, at, 7)?).ok()?;
    *at = at.checked_add(len).filter(|e| *e <= block.len())?;
    Some(())
}

/// `block` with the value of each literal `:authority` field made `localhost`; `None`
/// if there is none (or the block cannot be read).
fn rewrite_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len());
    let mut at = 0;
    let mut changed = false;
    while at < block.len() {
        let first = block[at];
        let from = at;
        let prefix = match first {
            b if b & 0x80 != 0 => {
                // Indexed field.
                integer(block, &mut at, 7)?;
                out.extend(&block[from..at]);
                continue;
            }
            b if b & 0xc0 == 0x40 => 6, // literal, incremental indexing
            b if b & 0xe0 == 0x20 => {
                // Dynamic table size update.
                integer(block, &mut at, 5)?;
                out.extend(&block[from..at]);
                continue;
            }
            _ => 4, // literal without indexing, or never indexed
        };
        let name = integer(block, &mut at, prefix)?;
        if name == 0 {
            skip_string(block, &mut at)?;
        }
        let value_at = at;
        skip_string(block, &mut at)?;
        if name == AUTHORITY_INDEX {
            out.extend(&block[from..value_at]);
            out.push(u8::try_from(LOCALHOST.len()).ok()?);
            out.extend(LOCALHOST);
            changed = true;
        } else {
            out.extend(&block[from..at]);
        }
    }
    changed.then_some(out)
}

impl<S: AsyncRead + Unpin> AsyncRead for LocalAuthority<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.drain(..n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // What is left is not a whole frame: the server sees it as it came.
                this.out.append(&mut this.raw);
                if this.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.eof = true;
            } else {
                this.raw.extend_from_slice(read.filled());
                this.process();
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for LocalAuthority<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for LocalAuthority<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt as _;

    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut f = len[1..].to_vec();
        f.extend([kind, flags, 0, 0, 0, 1]);
        f.extend(payload);
        f
    }

    /// `:method POST` (indexed), `:authority` as a literal of `how` with the static
    /// name, `:path` as a literal with a literal name, and a never-indexed field.
    fn block(how: u8, authority: &[u8]) -> Vec<u8> {
        let mut b = vec![0x83, how | 1, u8::try_from(authority.len()).unwrap()];
        b.extend(authority);
        b.extend([0x00, 0x05]);
        b.extend(b":path");
        b.extend([0x0a]);
        b.extend(b"/x.Reg/Get");
        b.extend([0x10, 0x01, b'k', 0x01, b'v']);
        b
    }

    #[test]
    fn every_literal_authority_becomes_localhost() {
        let path = b"/var/lib/kubelet/plugins_registry/x-reg.sock";
        for how in [0x40, 0x00, 0x10] {
            let out = rewrite_block(&block(how, path)).expect("an authority");
            assert_eq!(out, block(how, b"localhost"), "representation {how:#x}");
        }
        // Neither indexed fields nor other literals are touched.
        let none = [0x83, 0x86, 0x44, 0x02, b'/', b'a', 0x3f, 0xe1, 0x1f];
        assert_eq!(rewrite_block(&none), None);
        // A name index past the 6-bit prefix (70: 63 and 7 more), then the authority.
        let long = [0x7f, 0x07, 0x01, b'x', 0x41, 0x01, b'h'];
        let mut want = vec![0x7f, 0x07, 0x01, b'x', 0x41, 0x09];
        want.extend(b"localhost");
        assert_eq!(rewrite_block(&long).unwrap(), want);
        assert_eq!(rewrite_block(&[0x41, 0x7f]), None, "a string past the block");
    }

    #[test]
    fn headers_frames_keep_their_padding_and_priority() {
        let path = b"/run/x.sock";
        let plain = frame(HEADERS, END_HEADERS, &block(0x40, path));
        assert_eq!(rewrite_frame(&plain).unwrap(), frame(HEADERS, END_HEADERS, &block(0x40, b"localhost")));

        let mut payload = vec![3];
        payload.extend([0, 0, 0, 0, 16]);
        payload.extend(block(0x40, path));
        payload.extend([0, 0, 0]);
        let mut want = vec![3, 0, 0, 0, 0, 16];
        want.extend(block(0x40, b"localhost"));
        want.extend([0, 0, 0]);
        let flags = END_HEADERS | PADDED | PRIORITY;
        assert_eq!(rewrite_frame(&frame(HEADERS, flags, &payload)).unwrap(), frame(HEADERS, flags, &want));

        // Continued header blocks and other frames pass unchanged.
        assert_eq!(rewrite_frame(&frame(HEADERS, 0, &block(0x40, path))), None);
        assert_eq!(rewrite_frame(&frame(0x0, 0x1, &block(0x40, path))), None);
    }

    #[tokio::test]
    async fn the_server_reads_the_connection_rewritten_across_reads() {
        let mut sent = PREFACE.to_vec();
        sent.extend(frame(0x4, 0, &[]));
        sent.extend(frame(HEADERS, END_HEADERS, &block(0x40, b"/a/b.sock")));
        sent.extend(frame(0x0, 0x1, b"\0\0\0\0\0"));
        let mut want = PREFACE.to_vec();
        want.extend(frame(0x4, 0, &[]));
        want.extend(frame(HEADERS, END_HEADERS, &block(0x40, b"localhost")));
        want.extend(frame(0x0, 0x1, b"\0\0\0\0\0"));

        // Byte by byte: frames split across reads are put together first.
        let (mut client, server) = tokio::io::duplex(1);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            for b in sent {
                client.write_all(&[b]).await.unwrap();
            }
        });
        let mut got = Vec::new();
        LocalAuthority::new(server).read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn what_is_not_http2_passes_untouched() {
        let sent = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        let mut got = Vec::new();
        LocalAuthority::new(&sent[..]).read_to_end(&mut got).await.unwrap();
        assert_eq!(got, sent);
    }
}
