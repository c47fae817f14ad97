//! A SPDY/3.1 client that does what kubectl (client-go's `httpstream/spdy`, on
//! `moby/spdystream`) does against a kubelet's `/exec`, `/attach` and `/portForward`,
//! written from the SPDY/3.1 draft, RFC 1950/1951 and the behaviour of the Go peers.
//!
//! # The session
//! - [`Spdy::connect`]: `Connection: Upgrade`, `Upgrade: SPDY/3.1` and one
//!   `X-Stream-Protocol-Version` per offered protocol; the answer must be 101 with
//!   `Upgrade: SPDY/3.1`, and names the protocol chosen.
//! - [`Spdy::create_stream`] sends `SYN_STREAM` (odd ids from 1, priority 0, no flags) and
//!   waits for its `SYN_REPLY`, as client-go's `CreateStream` does. Waiting matters:
//!   spdystream drops `DATA` on a stream it has not replied to yet (its `handleDataFrame`
//!   checks `replied`), FIN included, and the remote command server replies to a stream
//!   only once its handler took it.
//! - Remote commands (`v4.channel.k8s.io`): streams with header `streamtype` = `error`
//!   (first), then `stdin`, `stdout`, `stderr` as the query asks, and `resize` with a TTY
//!   (the server counts it among the streams it waits for: without it the command never
//!   starts). The `error` stream carries a `v1.Status` JSON with the exit code
//!   ([`crate::streaming::exit_code`]). At the end the server resets every stream
//!   (`RST_STREAM` CANCEL), sends `GOAWAY` and closes the connection: a reset is an end
//!   here, not a failure.
//! - Port forwarding (`portforward.k8s.io`): per forwarded connection an `error` and a
//!   `data` stream with headers `port` and `requestid`; the client half-closes the error
//!   stream at once, as kubectl does.
//! - `PING`s from the server (even ids) are echoed; `SETTINGS`, server `WINDOW_UPDATE`s and
//!   unknown control frames are read and ignored, server pushes (`SYN_STREAM`) refused.
//!   Flow control: the client acknowledges what it consumed with `WINDOW_UPDATE` (per
//!   stream and, SPDY/3.1, for the connection with stream id 0) once half of the 64 KiB
//!   initial window is used, so a peer that enforces windows never stalls; it does not
//!   limit its own sending, because spdystream never sends `WINDOW_UPDATE` (nor does
//!   kubectl limit itself).
//!
//! # Header blocks
//! Name/value blocks (32-bit count, then 32-bit length-prefixed lower-case names and
//! values, several values joined by NUL) are compressed with ONE zlib stream per
//! direction and connection, with the SPDY/3 dictionary ([`DICTIONARY`]).
//! - Sending ([`Deflater`]): the zlib header with `FDICT` and the dictionary's Adler-32
//!   once, then per block the block as non-final *stored* deflate blocks followed by an
//!   empty stored block (`00 00 00 ff ff`, zlib's sync flush). The sync flush is what the
//!   earlier client of this repository lacked: Go's inflater hands out a stored block's
//!   bytes only when it reads the next block's header, so without the marker the first
//!   `SYN_STREAM` parses (reading past its block fails, but after the data was handed
//!   out) and the reader's error sticks; the second `SYN_STREAM` then fails with
//!   "unexpected EOF", spdystream's read loop ends, and no `SYN_REPLY` ever comes.
//! - Receiving ([`Inflater`]): a small RFC 1951 decoder (stored, fixed and dynamic
//!   Huffman blocks) whose window starts with the dictionary, so back references into it
//!   resolve. Each block must end at a deflate block boundary, as a sync flush leaves it
//!   (Go's `Flush`, zlib's `Z_SYNC_FLUSH`).
//!
//! # Debugging
//! With `SWIFTLET_SPDY_TRACE=1` every frame sent (`->`) and received (`<-`) is printed to
//! stderr (type, stream, flags, headers, a data preview); with `SWIFTLET_SPDY_TRACE=2`
//! also each frame's bytes in hex (the first 256).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::streaming;

/// The SPDY/3 header compression dictionary (SPDY/3 draft, section 2.6.10.1): 1423 bytes,
/// ending in `enq=0.` (no trailing NUL).
pub const DICTIONARY: &[u8] = b"\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\
\x00\x00\x00\x03put\x00\x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\
\x00\x00\x00\x0eaccept-charset\x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\
\x00\x00\x00\x0daccept-ranges\x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\x0dauthorization\
\x00\x00\x00\x0dcache-control\x00\x00\x00\x0aconnection\x00\x00\x00\x0ccontent-base\
\x00\x00\x00\x10content-encoding\x00\x00\x00\x10content-language\x00\x00\x00\x0econtent-length\
\x00\x00\x00\x10content-location\x00\x00\x00\x0bcontent-md5\x00\x00\x00\x0dcontent-range\
\x00\x00\x00\x0ccontent-type\x00\x00\x00\x04date\x00\x00\x00\x04etag\x00\x00\x00\x06expect\
\x00\x00\x00\x07expires\x00\x00\x00\x04from\x00\x00\x00\x04host\x00\x00\x00\x08if-match\
\x00\x00\x00\x11if-modified-since\x00\x00\x00\x0dif-none-match\x00\x00\x00\x08if-range\
\x00\x00\x00\x13if-unmodified-since\x00\x00\x00\x0dlast-modified\x00\x00\x00\x08location\
\x00\x00\x00\x0cmax-forwards\x00\x00\x00\x06pragma\x00\x00\x00\x12proxy-authenticate\
\x00\x00\x00\x13proxy-authorization\x00\x00\x00\x05range\x00\x00\x00\x07referer\
\x00\x00\x00\x0bretry-after\x00\x00\x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07trailer\
\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgrade\x00\x00\x00\x0auser-agent\
\x00\x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warning\x00\x00\x00\x10www-authenticate\
\x00\x00\x00\x06method\x00\x00\x00\x03get\x00\x00\x00\x06status\x00\x00\x00\x06200 OK\
\x00\x00\x00\x07version\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06public\
\x00\x00\x00\x0aset-cookie\x00\x00\x00\x0akeep-alive\x00\x00\x00\x06origin\
100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505\
203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request\
401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented\
503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 \
Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,\
application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=\
gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

/// Control frame types.
pub const SYN_STREAM: u16 = 1;
pub const SYN_REPLY: u16 = 2;
pub const RST_STREAM: u16 = 3;
pub const SETTINGS: u16 = 4;
pub const PING: u16 = 6;
pub const GOAWAY: u16 = 7;
pub const HEADERS: u16 = 8;
pub const WINDOW_UPDATE: u16 = 9;

/// `FLAG_FIN` (control and data frames): the sender's side of the stream is done.
pub const FLAG_FIN: u8 = 0x01;
/// `FLAG_UNIDIRECTIONAL` (`SYN_STREAM`): the receiver will not send on the stream.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

/// `RST_STREAM` statuses used here.
pub const REFUSED_STREAM: u32 = 3;
pub const CANCEL: u32 = 5;

/// SPDY/3.1's initial flow-control window, per stream and for the connection.
pub const INITIAL_WINDOW: u32 = 64 * 1024;

/// Header names and values of a name/value block, in order.
pub type Headers = Vec<(String, String)>;

/// One `SETTINGS` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// `FLAG_SETTINGS_PERSIST_VALUE` (1), `FLAG_SETTINGS_PERSISTED` (2).
    pub flags: u8,
    /// 24-bit id (7 is `SETTINGS_INITIAL_WINDOW_SIZE`).
    pub id: u32,
    pub value: u32,
}

/// A SPDY/3 frame, headers decompressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        entries: Vec<Setting>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Vec<u8>,
    },
    /// A version 3 control frame of a type this client does not know (the draft says to
    /// ignore it).
    Unknown {
        kind: u16,
        flags: u8,
        payload: Vec<u8>,
    },
}

/// A frame or header block that cannot be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The frame breaks SPDY/3's framing rules.
    #[error("SPDY framing: {0}")]
    Framing(String),
    /// A name/value block is malformed or has names SPDY/3 forbids.
    #[error("SPDY header block: {0}")]
    HeaderBlock(String),
    /// The header compression stream is corrupt.
    #[error("SPDY header compression: {0}")]
    Compression(String),
}

fn framing(message: impl Into<String>) -> CodecError {
    CodecError::Framing(message.into())
}

/// Adler-32 (RFC 1950), the zlib checksum and dictionary id.
#[must_use]
pub fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &byte in chunk {
            a += u32::from(byte);
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    (b << 16) | a
}

/// Encodes a name/value block. Names must be non-empty, lower case and unique (the Go
/// reader rejects the others, and fails the whole connection on them).
pub fn encode_header_block(headers: &[(&str, &str)]) -> Result<Vec<u8>, CodecError> {
    let mut raw = Vec::new();
    let count = u32::try_from(headers.len()).map_err(|_| CodecError::HeaderBlock("too many headers".into()))?;
    raw.extend_from_slice(&count.to_be_bytes());
    for (i, (name, value)) in headers.iter().enumerate() {
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(CodecError::HeaderBlock(format!("header name {name:?} must be non-empty and lower case")));
        }
        if headers[..i].iter().any(|(n, _)| n == name) {
            return Err(CodecError::HeaderBlock(format!("header {name:?} given twice (join values with NUL)")));
        }
        for s in [name, value] {
            let len = u32::try_from(s.len()).map_err(|_| CodecError::HeaderBlock("header too long".into()))?;
            raw.extend_from_slice(&len.to_be_bytes());
            raw.extend_from_slice(s.as_bytes());
        }
    }
    Ok(raw)
}

/// Decodes a name/value block (all of `raw`).
pub fn decode_header_block(raw: &[u8]) -> Result<Headers, CodecError> {
    let mut rest = raw;
    let count = take_u32(&mut rest)?;
    let mut headers = Vec::new();
    for _ in 0..count {
        let name = take_string(&mut rest)?;
        let value = take_string(&mut rest)?;
        headers.push((name, value));
    }
    if !rest.is_empty() {
        return Err(CodecError::HeaderBlock("bytes after the last header".into()));
    }
    Ok(headers)
}

fn take_u32(rest: &mut &[u8]) -> Result<u32, CodecError> {
    let (head, tail) =
        rest.split_first_chunk::<4>().ok_or_else(|| CodecError::HeaderBlock("truncated length".into()))?;
    *rest = tail;
    Ok(u32::from_be_bytes(*head))
}

fn take_string(rest: &mut &[u8]) -> Result<String, CodecError> {
    let len = take_u32(rest)? as usize;
    if rest.len() < len {
        return Err(CodecError::HeaderBlock("truncated string".into()));
    }
    let (bytes, tail) = rest.split_at(len);
    *rest = tail;
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// The sending side of the header compression stream (see the module docs).
#[derive(Debug, Default)]
pub struct Deflater {
    started: bool,
}

impl Deflater {
    /// The compressed form of one name/value block.
    #[must_use]
    pub fn compress(&mut self, raw: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(raw.len() + 16);
        if !self.started {
            self.started = true;
            // CMF: deflate, 32 KiB window. FLG: FDICT, FLEVEL 0, FCHECK so that
            // CMF*256 + FLG is a multiple of 31 (0x7820 already is).
            out.extend_from_slice(&[0x78, 0x20]);
            out.extend_from_slice(&adler32(DICTIONARY).to_be_bytes());
        }
        for chunk in raw.chunks(usize::from(u16::MAX)) {
            stored_block(&mut out, chunk);
        }
        stored_block(&mut out, &[]);
        out
    }
}

/// A non-final stored block (BFINAL 0, BTYPE 00) of `data`; empty, the sync-flush marker.
fn stored_block(out: &mut Vec<u8>, data: &[u8]) {
    let len = u16::try_from(data.len()).expect("stored blocks hold at most 65535 bytes");
    out.push(0);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(data);
}

/// The receiving side of the header compression stream (see the module docs).
#[derive(Debug)]
pub struct Inflater {
    /// Whether the zlib header was read.
    started: bool,
    /// A final block was seen: the stream is over.
    finished: bool,
    /// The last 32 KiB of output (at first the dictionary).
    window: Vec<u8>,
    /// Bits left over after the previous block (fewer than 8).
    bit_buf: u64,
    bit_count: u32,
}

impl Default for Inflater {
    fn default() -> Self {
        Self { started: false, finished: false, window: DICTIONARY.to_vec(), bit_buf: 0, bit_count: 0 }
    }
}

const WINDOW: usize = 32 * 1024;
const LENGTH_BASE: [u16; 29] =
    [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258];
const LENGTH_EXTRA: [u8; 29] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145,
    8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] =
    [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
/// The order code length code lengths come in (RFC 1951, 3.2.7).
const CODE_LENGTH_ORDER: [usize; 19] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];

fn corrupt(message: impl Into<String>) -> CodecError {
    CodecError::Compression(message.into())
}

/// Least-significant-bit-first reading of deflate input.
struct Bits<'a> {
    input: &'a [u8],
    pos: usize,
    buf: u64,
    count: u32,
}

impl Bits<'_> {
    fn take(&mut self, n: u32) -> Result<u32, CodecError> {
        while self.count < n {
            let byte = *self
                .input
                .get(self.pos)
                .ok_or_else(|| corrupt("header block ends inside a deflate block (no sync flush?)"))?;
            self.pos += 1;
            self.buf |= u64::from(byte) << self.count;
            self.count += 8;
        }
        let value = (self.buf & ((1u64 << n) - 1)) as u32;
        self.buf >>= n;
        self.count -= n;
        Ok(value)
    }

    fn align_to_byte(&mut self) {
        let skip = self.count % 8;
        self.buf >>= skip;
        self.count -= skip;
    }

    /// Nothing left but padding.
    fn at_end(&self) -> bool {
        self.pos == self.input.len() && self.count < 8
    }
}

/// A canonical Huffman code: how many codes of each length, and the symbols ordered by
/// code.
struct Huffman {
    counts: [u16; 16],
    symbols: Vec<u16>,
}

impl Huffman {
    fn new(lengths: &[u8]) -> Result<Self, CodecError> {
        let mut counts = [0u16; 16];
        for &len in lengths {
            counts[usize::from(len)] += 1;
        }
        counts[0] = 0;
        // Over-subscribed codes cannot be decoded; incomplete ones can (a lone distance code).
        let mut left: i32 = 1;
        for &count in &counts[1..] {
            left = left * 2 - i32::from(count);
            if left < 0 {
                return Err(corrupt("over-subscribed Huffman code"));
            }
        }
        let mut offsets = [0u16; 16];
        for len in 1..15 {
            offsets[len + 1] = offsets[len] + counts[len];
        }
        let mut symbols = vec![0u16; lengths.len()];
        for (symbol, &len) in lengths.iter().enumerate() {
            if len != 0 {
                symbols[usize::from(offsets[usize::from(len)])] = symbol as u16;
                offsets[usize::from(len)] += 1;
            }
        }
        Ok(Self { counts, symbols })
    }

    /// Reads one symbol, one bit at a time (header blocks are small).
    fn decode(&self, bits: &mut Bits<'_>) -> Result<u16, CodecError> {
        // `code` is the code read so far; `first` the first code of the current length;
        // `index` the position of that code's symbol.
        let (mut code, mut first, mut index) = (0i32, 0i32, 0i32);
        for &count in &self.counts[1..] {
            code |= bits.take(1)? as i32;
            let count = i32::from(count);
            if code - first < count {
                return Ok(self.symbols[(index + code - first) as usize]);
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        Err(corrupt("invalid Huffman code"))
    }
}

impl Inflater {
    /// Decompresses one header block (see the module docs).
    pub fn decompress(&mut self, input: &[u8]) -> Result<Vec<u8>, CodecError> {
        let mut bits = Bits { input, pos: 0, buf: self.bit_buf, count: self.bit_count };
        if !self.started {
            let cmf = bits.take(8)?;
            let flg = bits.take(8)?;
            if cmf & 0x0f != 8 || cmf >> 4 > 7 || ((cmf << 8) | flg) % 31 != 0 {
                return Err(corrupt(format!("bad zlib header {cmf:02x} {flg:02x}")));
            }
            if flg & 0x20 != 0 {
                let mut id = 0u32;
                for _ in 0..4 {
                    id = id << 8 | bits.take(8)?;
                }
                if id != adler32(DICTIONARY) {
                    return Err(corrupt(format!("zlib dictionary id {id:08x} is not the SPDY/3 dictionary's")));
                }
            }
            self.started = true;
        }
        let start = self.window.len();
        while !bits.at_end() {
            if self.finished {
                return Err(corrupt("data after the final deflate block"));
            }
            let last = bits.take(1)? == 1;
            match bits.take(2)? {
                0 => self.stored(&mut bits)?,
                1 => {
                    let mut lengths = [0u8; 288];
                    lengths[..144].fill(8);
                    lengths[144..256].fill(9);
                    lengths[256..280].fill(7);
                    lengths[280..].fill(8);
                    self.codes(&mut bits, &Huffman::new(&lengths)?, &Huffman::new(&[5; 30])?)?;
                }
                2 => {
                    let (literals, distances) = dynamic_codes(&mut bits)?;
                    self.codes(&mut bits, &literals, &distances)?;
                }
                _ => return Err(corrupt("reserved deflate block type")),
            }
            if last {
                self.finished = true;
                break;
            }
        }
        self.bit_buf = bits.buf;
        self.bit_count = bits.count;
        let out = self.window[start..].to_vec();
        if self.window.len() > 2 * WINDOW {
            self.window.drain(..self.window.len() - WINDOW);
        }
        Ok(out)
    }

    fn stored(&mut self, bits: &mut Bits<'_>) -> Result<(), CodecError> {
        bits.align_to_byte();
        let len = bits.take(16)?;
        let nlen = bits.take(16)?;
        if len != !nlen & 0xffff {
            return Err(corrupt("stored block length does not match its complement"));
        }
        for _ in 0..len {
            self.window.push(bits.take(8)? as u8);
        }
        Ok(())
    }

    fn codes(&mut self, bits: &mut Bits<'_>, literals: &Huffman, distances: &Huffman) -> Result<(), CodecError> {
        loop {
            let symbol = literals.decode(bits)?;
            match symbol {
                0..=255 => self.window.push(symbol as u8),
                256 => return Ok(()),
                257..=285 => {
                    let i = usize::from(symbol - 257);
                    let len = usize::from(LENGTH_BASE[i]) + bits.take(u32::from(LENGTH_EXTRA[i]))? as usize;
                    let d = usize::from(distances.decode(bits)?);
                    if d >= DIST_BASE.len() {
                        return Err(corrupt("invalid distance symbol"));
                    }
                    let dist = usize::from(DIST_BASE[d]) + bits.take(u32::from(DIST_EXTRA[d]))? as usize;
                    if dist > self.window.len() {
                        return Err(corrupt("distance reaches before the dictionary"));
                    }
                    let from = self.window.len() - dist;
                    for k in 0..len {
                        let byte = self.window[from + k];
                        self.window.push(byte);
                    }
                }
                _ => return Err(corrupt("invalid literal/length symbol")),
            }
        }
    }
}

/// The literal/length and distance codes of a dynamic block (RFC 1951, 3.2.7).
fn dynamic_codes(bits: &mut Bits<'_>) -> Result<(Huffman, Huffman), CodecError> {
    let literal_count = bits.take(5)? as usize + 257;
    let distance_count = bits.take(5)? as usize + 1;
    let code_length_count = bits.take(4)? as usize + 4;
    if literal_count > 286 || distance_count > 30 {
        return Err(corrupt("too many length or distance codes"));
    }
    let mut code_lengths = [0u8; 19];
    for &i in &CODE_LENGTH_ORDER[..code_length_count] {
        code_lengths[i] = bits.take(3)? as u8;
    }
    let code_length_code = Huffman::new(&code_lengths)?;
    let mut lengths = Vec::with_capacity(literal_count + distance_count);
    while lengths.len() < literal_count + distance_count {
        let symbol = code_length_code.decode(bits)?;
        let (value, repeat) = match symbol {
            0..=15 => (symbol as u8, 1),
            16 => (*lengths.last().ok_or_else(|| corrupt("repeat with no previous length"))?, 3 + bits.take(2)?),
            17 => (0, 3 + bits.take(3)?),
            18 => (0, 11 + bits.take(7)?),
            _ => return Err(corrupt("invalid code length symbol")),
        };
        for _ in 0..repeat {
            lengths.push(value);
        }
    }
    if lengths.len() != literal_count + distance_count {
        return Err(corrupt("code lengths overflow"));
    }
    if lengths[256] == 0 {
        return Err(corrupt("no end-of-block code"));
    }
    Ok((Huffman::new(&lengths[..literal_count])?, Huffman::new(&lengths[literal_count..])?))
}

/// Frames to bytes and back, with the connection's two compression streams.
#[derive(Debug, Default)]
pub struct Codec {
    deflater: Deflater,
    inflater: Inflater,
}

const MAX_LENGTH: usize = (1 << 24) - 1;

fn control(kind: u16, flags: u8, payload: &[u8]) -> Result<Vec<u8>, CodecError> {
    if payload.len() > MAX_LENGTH {
        return Err(framing("frame longer than 2^24-1 bytes"));
    }
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&[0x80, 0x03]);
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(payload);
    Ok(out)
}

fn stream_id_bytes(id: u32) -> Result<[u8; 4], CodecError> {
    if id > 0x7fff_ffff {
        return Err(framing(format!("stream id {id} does not fit in 31 bits")));
    }
    Ok(id.to_be_bytes())
}

fn u32_at(payload: &[u8], at: usize) -> Result<u32, CodecError> {
    payload
        .get(at..at + 4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| framing("control frame too short"))
}

impl Codec {
    /// The bytes of `frame`; headers go through the connection's compression stream, so
    /// frames must be sent in the order they were encoded.
    pub fn encode(&mut self, frame: &Frame) -> Result<Vec<u8>, CodecError> {
        let mut block = |headers: &Headers| -> Result<Vec<u8>, CodecError> {
            let pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            Ok(self.deflater.compress(&encode_header_block(&pairs)?))
        };
        match frame {
            Frame::SynStream { stream_id, associated_to, priority, flags, headers } => {
                if *priority > 7 {
                    return Err(framing("priority is 3 bits"));
                }
                let mut p = Vec::new();
                p.extend_from_slice(&stream_id_bytes(*stream_id)?);
                p.extend_from_slice(&stream_id_bytes(*associated_to)?);
                p.extend_from_slice(&[priority << 5, 0]);
                p.extend_from_slice(&block(headers)?);
                control(SYN_STREAM, *flags, &p)
            }
            Frame::SynReply { stream_id, flags, headers } => {
                let mut p = stream_id_bytes(*stream_id)?.to_vec();
                p.extend_from_slice(&block(headers)?);
                control(SYN_REPLY, *flags, &p)
            }
            Frame::Headers { stream_id, flags, headers } => {
                let mut p = stream_id_bytes(*stream_id)?.to_vec();
                p.extend_from_slice(&block(headers)?);
                control(HEADERS, *flags, &p)
            }
            Frame::RstStream { stream_id, status } => {
                let mut p = stream_id_bytes(*stream_id)?.to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                control(RST_STREAM, 0, &p)
            }
            Frame::Settings { flags, entries } => {
                let mut p = (entries.len() as u32).to_be_bytes().to_vec();
                for e in entries {
                    if e.id > 0xff_ffff {
                        return Err(framing("setting ids are 24 bits"));
                    }
                    p.push(e.flags);
                    p.extend_from_slice(&e.id.to_be_bytes()[1..]);
                    p.extend_from_slice(&e.value.to_be_bytes());
                }
                control(SETTINGS, *flags, &p)
            }
            Frame::Ping { id } => control(PING, 0, &id.to_be_bytes()),
            Frame::GoAway { last_good_stream_id, status } => {
                let mut p = stream_id_bytes(*last_good_stream_id)?.to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                control(GOAWAY, 0, &p)
            }
            Frame::WindowUpdate { stream_id, delta } => {
                if *delta == 0 || *delta > 0x7fff_ffff {
                    return Err(framing("window deltas are 1 to 2^31-1"));
                }
                let mut p = stream_id_bytes(*stream_id)?.to_vec();
                p.extend_from_slice(&delta.to_be_bytes());
                control(WINDOW_UPDATE, 0, &p)
            }
            Frame::Data { stream_id, flags, data } => {
                if *stream_id == 0 {
                    return Err(framing("data on stream 0"));
                }
                if data.len() > MAX_LENGTH {
                    return Err(framing("frame longer than 2^24-1 bytes"));
                }
                let mut out = stream_id_bytes(*stream_id)?.to_vec();
                out.push(*flags);
                out.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
                out.extend_from_slice(data);
                Ok(out)
            }
            Frame::Unknown { kind, flags, payload } => control(*kind, *flags, payload),
        }
    }

    /// The first frame in `buf` and its length, or `None` if `buf` does not hold a whole
    /// frame yet.
    pub fn decode(&mut self, buf: &[u8]) -> Result<Option<(Frame, usize)>, CodecError> {
        let Some(head) = buf.get(..8) else { return Ok(None) };
        let flags = head[4];
        let length = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        let Some(payload) = buf.get(8..8 + length) else { return Ok(None) };
        let used = 8 + length;
        if head[0] & 0x80 == 0 {
            let stream_id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            if stream_id == 0 {
                return Err(framing("data frame on stream 0"));
            }
            return Ok(Some((Frame::Data { stream_id, flags, data: payload.to_vec() }, used)));
        }
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != 3 {
            return Err(framing(format!("control frame of version {version}, not 3")));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        let id = |at| u32_at(payload, at).map(|v| v & 0x7fff_ffff);
        let frame = match kind {
            SYN_STREAM => {
                let stream_id = id(0)?;
                let associated_to = id(4)?;
                let priority = *payload.get(8).ok_or_else(|| framing("SYN_STREAM too short"))? >> 5;
                let block = payload.get(10..).ok_or_else(|| framing("SYN_STREAM too short"))?;
                let headers = decode_header_block(&self.inflater.decompress(block)?)?;
                Frame::SynStream { stream_id, associated_to, priority, flags, headers }
            }
            SYN_REPLY | HEADERS => {
                let stream_id = id(0)?;
                let headers = decode_header_block(&self.inflater.decompress(&payload[4..])?)?;
                if kind == SYN_REPLY {
                    Frame::SynReply { stream_id, flags, headers }
                } else {
                    Frame::Headers { stream_id, flags, headers }
                }
            }
            RST_STREAM => Frame::RstStream { stream_id: id(0)?, status: u32_at(payload, 4)? },
            SETTINGS => {
                let count = u32_at(payload, 0)? as usize;
                if payload.len() != 4 + 8 * count {
                    return Err(framing("SETTINGS length does not match its count"));
                }
                let entries = (0..count)
                    .map(|i| {
                        let word = u32_at(payload, 4 + 8 * i)?;
                        Ok(Setting {
                            flags: (word >> 24) as u8,
                            id: word & 0xff_ffff,
                            value: u32_at(payload, 8 + 8 * i)?,
                        })
                    })
                    .collect::<Result<_, CodecError>>()?;
                Frame::Settings { flags, entries }
            }
            PING => Frame::Ping { id: u32_at(payload, 0)? },
            GOAWAY => Frame::GoAway { last_good_stream_id: id(0)?, status: u32_at(payload, 4)? },
            WINDOW_UPDATE => Frame::WindowUpdate { stream_id: id(0)?, delta: u32_at(payload, 4)? & 0x7fff_ffff },
            _ => Frame::Unknown { kind, flags, payload: payload.to_vec() },
        };
        Ok(Some((frame, used)))
    }
}

/// A one-line description of a frame, for traces and error messages.
#[must_use]
pub fn describe(frame: &Frame) -> String {
    let headers = |h: &Headers| h.iter().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join(" ");
    match frame {
        Frame::SynStream { stream_id, associated_to, priority, flags, headers: h } => format!(
            "SYN_STREAM stream={stream_id} associated={associated_to} priority={priority} flags={flags:#04x} {}",
            headers(h)
        ),
        Frame::SynReply { stream_id, flags, headers: h } => {
            format!("SYN_REPLY stream={stream_id} flags={flags:#04x} {}", headers(h))
        }
        Frame::Headers { stream_id, flags, headers: h } => {
            format!("HEADERS stream={stream_id} flags={flags:#04x} {}", headers(h))
        }
        Frame::RstStream { stream_id, status } => format!("RST_STREAM stream={stream_id} status={status}"),
        Frame::Settings { flags, entries } => format!("SETTINGS flags={flags:#04x} {entries:?}"),
        Frame::Ping { id } => format!("PING id={id}"),
        Frame::GoAway { last_good_stream_id, status } => {
            format!("GOAWAY last_good_stream={last_good_stream_id} status={status}")
        }
        Frame::WindowUpdate { stream_id, delta } => format!("WINDOW_UPDATE stream={stream_id} delta={delta}"),
        Frame::Data { stream_id, flags, data } => {
            let preview: String = String::from_utf8_lossy(&data[..data.len().min(80)]).escape_debug().collect();
            let more = if data.len() > 80 { "..." } else { "" };
            format!("DATA stream={stream_id} flags={flags:#04x} len={} \"{preview}{more}\"", data.len())
        }
        Frame::Unknown { kind, flags, payload } => {
            format!("control type {kind} flags={flags:#04x} len={}", payload.len())
        }
    }
}

/// What came on one stream.
#[derive(Default, Clone, PartialEq, Eq)]
pub struct StreamReceived {
    /// The stream's data, in order.
    pub data: Vec<u8>,
    /// The server sent `FLAG_FIN` (on a data, reply or headers frame).
    pub fin: bool,
    /// The server reset the stream with this status.
    pub reset: Option<u32>,
}

impl std::fmt::Debug for StreamReceived {
    /// The data as (lossy, escaped) text: what error messages of the tests show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamReceived")
            .field("data", &String::from_utf8_lossy(&self.data))
            .field("fin", &self.fin)
            .field("reset", &self.reset)
            .finish()
    }
}

/// Everything received so far.
#[derive(Debug, Default, Clone)]
pub struct Received {
    pub streams: BTreeMap<u32, StreamReceived>,
    /// The server's `GOAWAY`: last good stream id and status.
    pub go_away: Option<(u32, u32)>,
    /// The server closed the connection.
    pub closed: bool,
}

impl Received {
    /// The data of `stream` as text.
    #[must_use]
    pub fn text(&self, stream: u32) -> String {
        self.streams.get(&stream).map(|s| String::from_utf8_lossy(&s.data).into_owned()).unwrap_or_default()
    }

    /// The data of `stream`.
    #[must_use]
    pub fn data(&self, stream: u32) -> &[u8] {
        self.streams.get(&stream).map_or(&[], |s| s.data.as_slice())
    }

    /// Whether nothing more will come on `stream`: FIN, a reset, or the connection is gone.
    #[must_use]
    pub fn ended(&self, stream: u32) -> bool {
        self.closed || self.streams.get(&stream).is_some_and(|s| s.fin || s.reset.is_some())
    }

    /// The exit code in the remote command status on the `error` stream `stream` (v4).
    pub fn exit_code(&self, stream: u32) -> Result<i32> {
        streaming::exit_code(&self.text(stream))
    }
}

/// Something the server did, as [`Spdy::next_event`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Data on a stream; `fin` when the server's side of it ended (data may be empty).
    Data { stream_id: u32, data: Vec<u8>, fin: bool },
    /// The server reset a stream.
    Reset { stream_id: u32, status: u32 },
    /// The server sent `GOAWAY`.
    GoAway { last_good_stream_id: u32, status: u32 },
    /// The server closed the connection.
    Closed,
}

/// Per stream bookkeeping of the client.
#[derive(Debug, Default)]
struct StreamState {
    replied: bool,
    /// Bytes received and not yet acknowledged with `WINDOW_UPDATE`.
    unacknowledged: u32,
    remote_done: bool,
}

/// How long [`Spdy::create_stream`] waits for the `SYN_REPLY` (client-go: 30 s).
pub const CREATE_STREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest `DATA` frame sent (client-go copies through 32 KiB buffers).
const MAX_DATA_FRAME: usize = 32 * 1024;

/// A SPDY/3.1 client session (see the module docs).
pub struct Spdy<S = streaming::Conn> {
    io: S,
    codec: Codec,
    read_buf: Vec<u8>,
    next_stream_id: u32,
    next_ping_id: u32,
    streams: BTreeMap<u32, StreamState>,
    connection_unacknowledged: u32,
    pending: VecDeque<Event>,
    received: Received,
    pongs: Vec<u32>,
    /// The negotiated `X-Stream-Protocol-Version`.
    pub protocol: String,
    /// `SWIFTLET_SPDY_TRACE`: 0 off, 1 frames, 2 frames and bytes.
    trace: u8,
}

impl<S> std::fmt::Debug for Spdy<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spdy")
            .field("protocol", &self.protocol)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

fn trace_level() -> u8 {
    std::env::var("SWIFTLET_SPDY_TRACE").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::new();
    for b in &bytes[..bytes.len().min(256)] {
        let _ = write!(s, "{b:02x}");
    }
    if bytes.len() > 256 {
        s.push_str("...");
    }
    s
}

impl Spdy<streaming::Conn> {
    /// Upgrades `method path` on the agent's HTTPS port to SPDY/3.1, offering `protocols`
    /// in order (`X-Stream-Protocol-Version`). Fails with the status and body when the
    /// server does not upgrade.
    pub async fn connect(addr: (&str, u16), method: &str, path: &str, protocols: &[&str]) -> Result<Self> {
        let mut headers = vec![("Upgrade", "SPDY/3.1")];
        headers.extend(protocols.iter().map(|p| ("X-Stream-Protocol-Version", *p)));
        let up = streaming::upgrade(addr, method, path, &headers).await?;
        if up.status != 101 {
            let status = up.status;
            bail!("no upgrade: {status} {}", up.body().await);
        }
        ensure!(up.header("upgrade").eq_ignore_ascii_case("SPDY/3.1"), "upgraded to {:?}", up.headers);
        let protocol = up.header("x-stream-protocol-version").to_owned();
        Ok(Self::new(up.conn, protocol))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Spdy<S> {
    /// A client session over an upgraded connection `io`.
    pub fn new(io: S, protocol: String) -> Self {
        Self {
            io,
            codec: Codec::default(),
            read_buf: Vec::new(),
            next_stream_id: 1,
            next_ping_id: 1,
            streams: BTreeMap::new(),
            connection_unacknowledged: 0,
            pending: VecDeque::new(),
            received: Received::default(),
            pongs: Vec::new(),
            protocol,
            trace: trace_level(),
        }
    }

    /// What the server sent so far (updated by every read).
    #[must_use]
    pub fn received(&self) -> &Received {
        &self.received
    }

    async fn send_frame(&mut self, frame: &Frame) -> Result<()> {
        let bytes = self.codec.encode(frame)?;
        if self.trace > 0 {
            eprintln!("spdy -> {}", describe(frame));
            if self.trace > 1 {
                eprintln!("spdy -> {}", hex(&bytes));
            }
        }
        self.io.write_all(&bytes).await.context("writing a SPDY frame")?;
        self.io.flush().await?;
        Ok(())
    }

    /// Reads one frame; `None` when the server closed the connection.
    async fn read_frame(&mut self) -> Result<Option<Frame>> {
        loop {
            if let Some((frame, used)) = self.codec.decode(&self.read_buf)? {
                if self.trace > 0 {
                    eprintln!("spdy <- {}", describe(&frame));
                    if self.trace > 1 {
                        eprintln!("spdy <- {}", hex(&self.read_buf[..used]));
                    }
                }
                self.read_buf.drain(..used);
                return Ok(Some(frame));
            }
            self.read_buf.reserve(16 * 1024);
            let n = self.io.read_buf(&mut self.read_buf).await.context("reading SPDY frames")?;
            if n == 0 {
                ensure!(
                    self.read_buf.is_empty(),
                    "the connection closed inside a frame ({} bytes: {})",
                    self.read_buf.len(),
                    hex(&self.read_buf)
                );
                if self.trace > 0 {
                    eprintln!("spdy <- (connection closed)");
                }
                return Ok(None);
            }
        }
    }

    /// Reads frames until one is worth reporting (see [`Event`]).
    async fn read_event(&mut self) -> Result<Event> {
        loop {
            if let Some(event) = self.read_one().await? {
                return Ok(event);
            }
        }
    }

    /// Reads and handles one frame (see the module docs); the event it makes, if any.
    async fn read_one(&mut self) -> Result<Option<Event>> {
        let Some(frame) = self.read_frame().await? else {
            self.received.closed = true;
            return Ok(Some(Event::Closed));
        };
        let fin_event = |stream_id| Some(Event::Data { stream_id, data: Vec::new(), fin: true });
        let event = match frame {
            Frame::Data { stream_id, flags, data } => {
                let fin = flags & FLAG_FIN != 0;
                self.acknowledge(stream_id, data.len(), fin).await?;
                let got = self.received.streams.entry(stream_id).or_default();
                got.data.extend_from_slice(&data);
                got.fin |= fin;
                Some(Event::Data { stream_id, data, fin })
            }
            Frame::SynReply { stream_id, flags, .. } => {
                self.streams.entry(stream_id).or_default().replied = true;
                (flags & FLAG_FIN != 0).then(|| self.remote_fin(stream_id)).and_then(|()| fin_event(stream_id))
            }
            Frame::Headers { stream_id, flags, .. } => {
                (flags & FLAG_FIN != 0).then(|| self.remote_fin(stream_id)).and_then(|()| fin_event(stream_id))
            }
            Frame::RstStream { stream_id, status } => {
                self.streams.entry(stream_id).or_default().remote_done = true;
                self.received.streams.entry(stream_id).or_default().reset = Some(status);
                Some(Event::Reset { stream_id, status })
            }
            Frame::GoAway { last_good_stream_id, status } => {
                self.received.go_away = Some((last_good_stream_id, status));
                Some(Event::GoAway { last_good_stream_id, status })
            }
            Frame::Ping { id } if id % 2 == 0 => {
                self.send_frame(&Frame::Ping { id }).await?;
                None
            }
            Frame::Ping { id } => {
                self.pongs.push(id);
                None
            }
            Frame::SynStream { stream_id, .. } => {
                self.send_frame(&Frame::RstStream { stream_id, status: REFUSED_STREAM }).await?;
                None
            }
            Frame::Settings { .. } | Frame::WindowUpdate { .. } | Frame::Unknown { .. } => None,
        };
        Ok(event)
    }

    /// The server's side of `stream_id` ended without data.
    fn remote_fin(&mut self, stream_id: u32) {
        self.streams.entry(stream_id).or_default().remote_done = true;
        self.received.streams.entry(stream_id).or_default().fin = true;
    }

    /// Counts consumed bytes and sends `WINDOW_UPDATE`s once half a window is used.
    async fn acknowledge(&mut self, stream_id: u32, len: usize, fin: bool) -> Result<()> {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        let threshold = INITIAL_WINDOW / 2;
        self.connection_unacknowledged += len;
        if self.connection_unacknowledged >= threshold {
            let delta = std::mem::take(&mut self.connection_unacknowledged);
            self.send_frame(&Frame::WindowUpdate { stream_id: 0, delta }).await?;
        }
        let state = self.streams.entry(stream_id).or_default();
        state.unacknowledged += len;
        state.remote_done |= fin;
        if !state.remote_done && state.unacknowledged >= threshold {
            let delta = std::mem::take(&mut state.unacknowledged);
            self.send_frame(&Frame::WindowUpdate { stream_id, delta }).await?;
        }
        Ok(())
    }

    /// The next thing the server did: events that arrived while waiting for a reply or a
    /// ping come first.
    pub async fn next_event(&mut self) -> Result<Event> {
        if let Some(event) = self.pending.pop_front() {
            return Ok(event);
        }
        self.read_event().await
    }

    /// Opens a stream with `headers` (lower-case names) and waits for the server's
    /// `SYN_REPLY`; events meanwhile are kept for [`Self::next_event`].
    pub async fn create_stream(&mut self, headers: &[(&str, &str)]) -> Result<u32> {
        let stream_id = self.next_stream_id;
        self.next_stream_id += 2;
        let headers: Headers = headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let frame = Frame::SynStream { stream_id, associated_to: 0, priority: 0, flags: 0, headers };
        self.streams.insert(stream_id, StreamState::default());
        self.send_frame(&frame).await?;
        let wait = async {
            while !self.streams[&stream_id].replied {
                let Some(event) = self.read_one().await? else { continue };
                match &event {
                    Event::Reset { stream_id: id, status } if *id == stream_id => {
                        bail!("the server reset stream {stream_id} (status {status}) instead of replying")
                    }
                    Event::Closed => bail!("the connection closed before the reply to stream {stream_id}"),
                    _ => self.pending.push_back(event),
                }
            }
            Ok(())
        };
        tokio::time::timeout(CREATE_STREAM_TIMEOUT, wait)
            .await
            .with_context(|| format!("no SYN_REPLY to {} within {CREATE_STREAM_TIMEOUT:?}", describe(&frame)))??;
        Ok(stream_id)
    }

    /// Sends `data` on `stream` (in frames of at most 32 KiB).
    pub async fn write(&mut self, stream_id: u32, data: &[u8]) -> Result<()> {
        for chunk in data.chunks(MAX_DATA_FRAME) {
            self.send_frame(&Frame::Data { stream_id, flags: 0, data: chunk.to_vec() }).await?;
        }
        Ok(())
    }

    /// Ends the client's side of `stream` (an empty `DATA` frame with `FLAG_FIN`: stdin's
    /// EOF).
    pub async fn close_write(&mut self, stream_id: u32) -> Result<()> {
        self.send_frame(&Frame::Data { stream_id, flags: FLAG_FIN, data: Vec::new() }).await
    }

    /// Resets `stream` (`RST_STREAM` CANCEL).
    pub async fn reset(&mut self, stream_id: u32) -> Result<()> {
        self.send_frame(&Frame::RstStream { stream_id, status: CANCEL }).await
    }

    /// Sends `PING` and waits for its echo; events meanwhile are kept.
    pub async fn ping(&mut self, timeout: Duration) -> Result<Duration> {
        let id = self.next_ping_id;
        self.next_ping_id += 2;
        let started = Instant::now();
        self.send_frame(&Frame::Ping { id }).await?;
        let wait = async {
            while !self.pongs.contains(&id) {
                match self.read_one().await? {
                    None => {}
                    Some(Event::Closed) => bail!("the connection closed before the ping's echo"),
                    Some(event) => self.pending.push_back(event),
                }
            }
            Ok(())
        };
        tokio::time::timeout(timeout, wait).await.context("no PING echo")??;
        self.pongs.retain(|p| *p != id);
        Ok(started.elapsed())
    }

    /// Says goodbye (`GOAWAY`, status OK; the client accepts no server streams) and
    /// closes the client's side of the connection.
    pub async fn go_away(&mut self) -> Result<()> {
        self.send_frame(&Frame::GoAway { last_good_stream_id: 0, status: 0 }).await?;
        self.io.shutdown().await?;
        Ok(())
    }

    /// Reads until `done` holds for what was received, the connection closes (an error,
    /// with everything received, unless `done` then holds), or `timeout` passes (an
    /// error, with everything received).
    pub async fn read_until(&mut self, timeout: Duration, mut done: impl FnMut(&Received) -> bool) -> Result<()> {
        let result = tokio::time::timeout(timeout, async {
            while !done(&self.received) {
                if self.next_event().await? == Event::Closed {
                    ensure!(done(&self.received), "the connection closed first");
                }
            }
            Ok(())
        })
        .await;
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.context(format!("received: {:?}", self.received))),
            Err(_) => bail!("nothing more after {timeout:?}; received: {:?}", self.received),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn the_dictionary_is_spdy3s() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert!(DICTIONARY.ends_with(b"enq=0."));
        // The id a Go zlib writer puts in its header with this dictionary (78 f9 e3c6a7c2).
        assert_eq!(adler32(DICTIONARY), 0xe3c6_a7c2);
    }

    #[test]
    fn adler32_known_values() {
        assert_eq!(adler32(b""), 1);
        assert_eq!(adler32(b"Wikipedia"), 0x11e6_0398);
        let big = vec![0xffu8; 100_000];
        // Reference: zlib.adler32(b"\xff" * 100000).
        assert_eq!(adler32(&big), 0x149a_302c);
    }

    #[test]
    fn control_frames_have_spdy3_layout() {
        let mut codec = Codec::default();
        let rst = codec.encode(&Frame::RstStream { stream_id: 3, status: CANCEL }).unwrap();
        assert_eq!(rst, unhex("80030003000000080000000300000005"));
        let ping = codec.encode(&Frame::Ping { id: 1 }).unwrap();
        assert_eq!(ping, unhex("800300060000000400000001"));
        let go_away = codec.encode(&Frame::GoAway { last_good_stream_id: 0, status: 0 }).unwrap();
        assert_eq!(go_away, unhex("80030007000000080000000000000000"));
        let update = codec.encode(&Frame::WindowUpdate { stream_id: 5, delta: 32768 }).unwrap();
        assert_eq!(update, unhex("80030009000000080000000500008000"));
        let settings = codec
            .encode(&Frame::Settings { flags: 0, entries: vec![Setting { flags: 1, id: 7, value: 65536 }] })
            .unwrap();
        assert_eq!(settings, unhex("800300040000000c000000010100000700010000"));
        let data = codec.encode(&Frame::Data { stream_id: 3, flags: FLAG_FIN, data: b"hi".to_vec() }).unwrap();
        assert_eq!(data, unhex("00000003010000026869"));
        assert!(codec.encode(&Frame::Data { stream_id: 0x8000_0000, flags: 0, data: vec![] }).is_err());
        assert!(codec.encode(&Frame::WindowUpdate { stream_id: 1, delta: 0 }).is_err());
    }

    #[test]
    fn syn_stream_layout_and_first_header_block() {
        let mut codec = Codec::default();
        let frame = Frame::SynStream {
            stream_id: 1,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers: headers(&[("streamtype", "error")]),
        };
        let bytes = codec.encode(&frame).unwrap();
        let raw = encode_header_block(&[("streamtype", "error")]).unwrap();
        let mut want = unhex("8003000100");
        let block_len = 6 + (5 + raw.len()) + 5;
        want.extend_from_slice(&((10 + block_len) as u32).to_be_bytes()[1..]);
        want.extend_from_slice(&unhex("00000001" /* stream */));
        want.extend_from_slice(&unhex("00000000" /* associated */));
        want.extend_from_slice(&unhex("0000" /* priority 0, slot 0 */));
        want.extend_from_slice(&unhex("7820e3c6a7c2" /* zlib header, FDICT, dictionary id */));
        want.push(0);
        want.extend_from_slice(&(raw.len() as u16).to_le_bytes());
        want.extend_from_slice(&(!(raw.len() as u16)).to_le_bytes());
        want.extend_from_slice(&raw);
        want.extend_from_slice(&unhex("000000ffff" /* sync flush */));
        assert_eq!(bytes, want);

        // The next block continues the stream: no zlib header, ends with the sync flush.
        let second = codec
            .encode(&Frame::SynStream {
                stream_id: 3,
                associated_to: 0,
                priority: 7,
                flags: FLAG_FIN,
                headers: headers(&[("streamtype", "stdin")]),
            })
            .unwrap();
        assert_eq!(second[4], FLAG_FIN);
        assert_eq!(second[16], 7 << 5, "priority in the top 3 bits");
        assert_eq!(second[18], 0, "a stored block, not a zlib header");
        assert!(second.ends_with(&unhex("000000ffff")));
    }

    #[test]
    fn frames_round_trip_through_two_codecs() {
        let (mut client, mut server) = (Codec::default(), Codec::default());
        let frames = [
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: headers(&[("streamtype", "error")]),
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: headers(&[("port", "8080"), ("requestid", "0"), ("streamtype", "data")]),
            },
            Frame::Data { stream_id: 3, flags: 0, data: b"GET / HTTP/1.0\r\n\r\n".to_vec() },
            Frame::Headers { stream_id: 3, flags: FLAG_FIN, headers: headers(&[("x", "a\0b")]) },
            Frame::WindowUpdate { stream_id: 0, delta: 1 },
            Frame::Settings { flags: 1, entries: vec![Setting { flags: 0, id: 4, value: 100 }] },
            Frame::Unknown { kind: 10, flags: 0, payload: vec![1, 2, 3] },
            Frame::SynReply { stream_id: 1, flags: 0, headers: Vec::new() },
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(client.encode(f).unwrap());
        }
        let mut decoded = Vec::new();
        let mut at = 0;
        // Byte by byte: a partial frame is "not yet", never an error.
        let mut end = 0;
        while at < wire.len() {
            end = (end + 1).min(wire.len());
            if let Some((frame, used)) = server.decode(&wire[at..end]).unwrap() {
                decoded.push(frame);
                at += used;
            }
        }
        assert_eq!(decoded, frames);
    }

    #[test]
    fn header_blocks_reject_what_go_rejects() {
        assert!(encode_header_block(&[("streamType", "error")]).is_err());
        assert!(encode_header_block(&[("a", "1"), ("a", "2")]).is_err());
        assert!(encode_header_block(&[("", "1")]).is_err());
        assert_eq!(
            decode_header_block(&encode_header_block(&[("a", "1"), ("bb", "")]).unwrap()).unwrap(),
            headers(&[("a", "1"), ("bb", "")])
        );
        assert!(decode_header_block(&unhex("00000001000000")).is_err());
        assert!(decode_header_block(&unhex("0000000000")).is_err(), "trailing bytes");
    }

    /// Header blocks written by Go's `compress/zlib` (level 9, the SPDY dictionary, one
    /// `Flush` per block), as spdystream writes `SYN_REPLY`s: fixed-Huffman blocks that
    /// reference the dictionary, then a dynamic-Huffman one, on one stream.
    #[test]
    fn inflates_go_written_blocks_with_the_dictionary() {
        let blocks = [
            ("78f9e3c6a7c26260606000000000ffff", "00000000"),
            ("026100000000ffff", "00000000"),
            (
                "02e512707a2b294a4dcc851629aca9a00067606090acd08548e81614e597e427e7e7e82212b06099895e7246625e5e6a8e5eb645b15e663e000000ffff",
                "000000020000000a73747265616d74797065000000056572726f7200000019782d73747265616d2d70726f746f636f6c2d76657273696f6e0000001176342e6368616e6e656c2e6b38732e696f",
            ),
            (
                "02a5642c259424c26bd60a28ae24219700000000ffff",
                "000000030000000c636f6e74656e742d7479706500000019746578742f706c61696e3b20636861727365743d7574662d380000000673746174757300000006323030204f4b0000000776657273696f6e00000008485454502f312e31",
            ),
        ];
        let mut inflater = Inflater::default();
        for (compressed, raw) in blocks {
            assert_eq!(inflater.decompress(&unhex(compressed)).unwrap(), unhex(raw));
        }
        let got = decode_header_block(&unhex(blocks[3].1)).unwrap();
        assert_eq!(got[1], ("status".to_owned(), "200 OK".to_owned()));

        let dynamic = "5c94590a02310c40730541dc3d42a169a74b8ee332aef325281e5f32a6daf4fdf611b234e18de4d5791bbec4fdc3583b5e42c6bc76c3b33756bff33f9dec47444884a41dc78b7bf82292c798a2b63c004c8f4289852ea1d63a0098f505f1d0c534be54229fc9f9e9473129510adae44416e73fa2ba1c6c6e822600585e2a4a3d395bdf649a016075ad1139d898b1a99e5bb6be29c48e1d765e771479089bbba66abfd543424e6c3b34884f2123d1070000ffff";
        assert_eq!((unhex(dynamic)[0] >> 1) & 3, 2, "a dynamic block");
        let mut inflater = Inflater::default();
        let out = inflater.decompress(&unhex(&format!("78f9e3c6a7c2{dynamic}"))).unwrap();
        let got = decode_header_block(&out).unwrap();
        assert_eq!(got.len(), 12);
        assert_eq!(got[0], ("x-header-00".to_owned(), "aaaaa-value-0".to_owned()));
        assert_eq!(got[11], ("x-header-11".to_owned(), format!("{}-value-958199", "l".repeat(16))));
    }

    #[test]
    fn inflate_refuses_corrupt_streams() {
        let mut wrong_dictionary = Inflater::default();
        assert!(wrong_dictionary.decompress(&unhex("78f9deadbeef0000")).is_err());
        let mut truncated = Inflater::default();
        assert!(truncated.decompress(&unhex("78f9e3c6a7c2626060")).is_err(), "no sync flush");
        let mut bad_header = Inflater::default();
        assert!(bad_header.decompress(&unhex("7802")).is_err());
        let mut bad_stored = Inflater::default();
        assert!(bad_stored.decompress(&unhex("78010000000000")).is_err());
        // Without FDICT the dictionary is still the window (Go's reader allows this too).
        let mut plain = Inflater::default();
        assert_eq!(plain.decompress(&unhex("7801000400fbff61626364000000ffff")).unwrap(), b"abcd");
    }

    #[test]
    fn our_header_blocks_inflate_with_our_inflater_across_many_frames() {
        let mut deflater = Deflater::default();
        let mut inflater = Inflater::default();
        for i in 0..200 {
            let value = "v".repeat(i * 50);
            let raw = encode_header_block(&[("streamtype", "stdout"), ("n", &value)]).unwrap();
            let block = deflater.compress(&raw);
            assert!(block.ends_with(&unhex("000000ffff")), "every block ends with a sync flush");
            assert_eq!(inflater.decompress(&block).unwrap(), raw);
        }
        // A block larger than one stored block.
        let big = encode_header_block(&[("big", &"x".repeat(70_000))]).unwrap();
        assert_eq!(inflater.decompress(&deflater.compress(&big)).unwrap(), big);
    }

    /// A fake server over an in-memory pipe, behaving as spdystream does: replies after
    /// taking a stream, echoes what comes on stream 3 in upper case, pings the client, and
    /// at the end writes a status, resets the streams and says goodbye.
    async fn fake_server(io: tokio::io::DuplexStream) -> Result<Vec<Frame>> {
        let mut server = Spdy::new(io, String::new());
        let mut seen = Vec::new();
        server.send_frame(&Frame::Ping { id: 2 }).await?;
        server.send_frame(&Frame::Settings { flags: 0, entries: vec![] }).await?;
        let mut done = false;
        // Reads until the client goes, answering as spdystream would until the end.
        while let Some(frame) = server.read_frame().await? {
            seen.push(frame.clone());
            if done {
                continue;
            }
            match frame {
                Frame::Ping { id } if id % 2 == 1 => server.send_frame(&Frame::Ping { id }).await?,
                Frame::SynStream { stream_id, .. } => {
                    server.send_frame(&Frame::SynReply { stream_id, flags: 0, headers: Vec::new() }).await?;
                }
                Frame::Data { stream_id: 3, flags, data } => {
                    let upper = data.to_ascii_uppercase();
                    server.send_frame(&Frame::Data { stream_id: 5, flags: 0, data: upper }).await?;
                    if flags & FLAG_FIN != 0 {
                        let status = br#"{"metadata":{},"status":"Success"}"#.to_vec();
                        server.send_frame(&Frame::Data { stream_id: 1, flags: 0, data: status }).await?;
                        for stream_id in [1, 3, 5] {
                            server.send_frame(&Frame::RstStream { stream_id, status: CANCEL }).await?;
                        }
                        server.send_frame(&Frame::GoAway { last_good_stream_id: 0, status: 0 }).await?;
                        done = true;
                    }
                }
                Frame::Data { .. } => {
                    // Sized to cross the window-update threshold.
                    server.send_frame(&Frame::Data { stream_id: 5, flags: 0, data: vec![b'.'; 40 * 1024] }).await?;
                }
                _ => {}
            }
        }
        Ok(seen)
    }

    #[tokio::test]
    async fn a_session_against_a_fake_server() {
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let server = tokio::spawn(fake_server(server_io));
        let mut spdy = Spdy::new(client_io, "v4.channel.k8s.io".to_owned());
        let error = spdy.create_stream(&[("streamtype", "error")]).await.unwrap();
        let stdin = spdy.create_stream(&[("streamtype", "stdin")]).await.unwrap();
        let stdout = spdy.create_stream(&[("streamtype", "stdout")]).await.unwrap();
        assert_eq!((error, stdin, stdout), (1, 3, 5));
        spdy.ping(Duration::from_secs(5)).await.unwrap();
        spdy.write(5, b"window").await.unwrap();
        spdy.write(stdin, b"hello").await.unwrap();
        spdy.close_write(stdin).await.unwrap();
        spdy.read_until(Duration::from_secs(5), |r| r.go_away.is_some()).await.unwrap();
        let got = spdy.received().clone();
        assert_eq!(got.text(stdout), format!("{}HELLO", ".".repeat(40 * 1024)));
        assert_eq!(got.exit_code(error).unwrap(), 0);
        assert_eq!(got.streams[&stdout].reset, Some(CANCEL));
        assert!(got.ended(error) && got.ended(stdout));
        drop(spdy);
        let seen = server.await.unwrap().unwrap();
        assert!(seen.contains(&Frame::Ping { id: 2 }), "the server's ping is echoed: {seen:?}");
        assert!(seen.contains(&Frame::Ping { id: 1 }), "the client's own ping: {seen:?}");
        assert!(
            seen.iter().any(|f| matches!(f, Frame::WindowUpdate { stream_id: 0, delta } if *delta >= 32 * 1024)),
            "40 KiB consumed: the connection window is acknowledged: {seen:?}"
        );
        assert!(seen.iter().any(|f| matches!(f, Frame::WindowUpdate { stream_id: 5, .. })), "{seen:?}");
        let data_on_stdin: Vec<&Frame> =
            seen.iter().filter(|f| matches!(f, Frame::Data { stream_id: 3, .. })).collect();
        assert_eq!(
            data_on_stdin,
            [
                &Frame::Data { stream_id: 3, flags: 0, data: b"hello".to_vec() },
                &Frame::Data { stream_id: 3, flags: FLAG_FIN, data: Vec::new() }
            ]
        );
    }

    #[tokio::test]
    async fn a_refused_stream_is_an_error() {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let mut server = Spdy::new(server_io, String::new());
            while let Ok(Some(frame)) = server.read_frame().await {
                if let Frame::SynStream { stream_id, .. } = frame {
                    let _ = server.send_frame(&Frame::RstStream { stream_id, status: REFUSED_STREAM }).await;
                }
            }
        });
        let mut spdy = Spdy::new(client_io, String::new());
        let e = spdy.create_stream(&[("streamtype", "data")]).await.unwrap_err();
        assert!(e.to_string().contains("reset stream 1 (status 3)"), "{e}");
    }
}
