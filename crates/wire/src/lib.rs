//! The datagram format between the preload shim (sender, inside traced processes) and roar's
//! tracer (receiver). One datagram is one event: a fixed [`Header`] followed by up to four byte
//! strings whose lengths the header carries. The sender never allocates: it points an iovec at each
//! part. Both ends are the same build of roar, so the layout is native-endian `repr(C)`.
#![no_std]

pub mod ring;

/// Environment variable naming the abstract unix socket (without the leading NUL) to send to,
/// then `:` and the run's key in hex ([`KEY_LEN`] bytes). Every datagram ends with the key: anyone
/// on the machine can find the socket in `/proc/net/unix`, but only the run's processes (and
/// root) can read their environment, so a datagram without the key is not from the run.
pub const SOCK_ENV: &str = "ROAR_INTERNAL_SOCK";
/// Length of the run's key.
pub const KEY_LEN: usize = 16;

/// Splits a `SOCK_ENV` value into the socket name and the key; None if it is not well-formed.
pub fn split_sock_env(value: &[u8]) -> Option<(&[u8], [u8; KEY_LEN])> {
    let colon = value.iter().rposition(|b| *b == b':')?;
    let (name, hex) = (&value[..colon], &value[colon + 1..]);
    if name.is_empty() || hex.len() != 2 * KEY_LEN {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut key = [0u8; KEY_LEN];
    for (i, k) in key.iter_mut().enumerate() {
        *k = (nibble(hex[2 * i])? << 4) | nibble(hex[2 * i + 1])?;
    }
    Some((name, key))
}

/// The body of a datagram that ends with `key`, or None (the datagram is not from the run).
/// Compared without an early exit, so timing says nothing about how much of a guess was right.
pub fn strip_key<'a>(datagram: &'a [u8], key: &[u8; KEY_LEN]) -> Option<&'a [u8]> {
    let body_len = datagram.len().checked_sub(KEY_LEN)?;
    let diff = datagram[body_len..]
        .iter()
        .zip(key)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    (diff == 0).then(|| &datagram[..body_len])
}
/// Environment variable holding the shim's own path, re-added to `LD_PRELOAD` on exec.
pub const LIB_ENV: &str = "ROAR_INTERNAL_LIB";

/// What happened. Strings per kind are listed as `s0, s1, ...`.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A new program image started. s0 = cwd, s1 = exe, s2 = argv (NUL-separated).
    Exec = 1,
    /// A forked child that did not exec (yet). `arg` holds the parent pid.
    Fork = 2,
    /// A successful open. s0 = base dir (empty if s1 is absolute), s1 = path.
    /// `arg` = open flags, `fd` = the new fd, `stat` = identity of the opened file.
    Open = 3,
    /// s0 = base of old, s1 = old, s2 = base of new, s3 = new.
    Rename = 4,
    /// s0 = base, s1 = path.
    Unlink = 5,
    /// s0 = base of target, s1 = target, s2 = base of link, s3 = link.
    Link = 6,
    /// s0 = base, s1 = path (for ftruncate, the fd's resolved path).
    Truncate = 7,
    /// s0 = base, s1 = path.
    Mkdir = 8,
    /// s0 = base, s1 = path.
    Rmdir = 9,
    /// The process is exiting through exit/_exit. `arg` = status.
    Exit = 10,
    /// A symbolic link was created. s0 = base, s1 = the link's path.
    Symlink = 11,
    /// The process is about to exec a program the shim cannot follow. s0 = base, s1 = path;
    /// `arg` = 1 statically linked, 2 setuid/setgid (the loader drops `LD_PRELOAD`); 3: the
    /// process itself (s1 = its program) set up io_uring, whose file operations the shim never
    /// sees.
    Untraced = 12,
    /// `renameat2(RENAME_EXCHANGE)`: strings as for `Rename`.
    Exchange = 13,
    /// The sender started a child (fork, posix_spawn): `arg` = the child's pid. Sent only by a
    /// shim without the ring (a process of another user), over the socket: it places the child
    /// among the run's processes before the child's own datagrams are judged; not an event.
    Spawned = 14,
}

impl Kind {
    pub fn from_u16(v: u16) -> Option<Kind> {
        Some(match v {
            1 => Kind::Exec,
            2 => Kind::Fork,
            3 => Kind::Open,
            4 => Kind::Rename,
            5 => Kind::Unlink,
            6 => Kind::Link,
            7 => Kind::Truncate,
            8 => Kind::Mkdir,
            9 => Kind::Rmdir,
            10 => Kind::Exit,
            11 => Kind::Symlink,
            12 => Kind::Untraced,
            13 => Kind::Exchange,
            14 => Kind::Spawned,
            _ => return None,
        })
    }
}

/// A new program's standard streams at its exec, the fourth part of an Exec event: for each of
/// stdin, stdout and stderr, what it is ([`STREAM_FILE`], [`STREAM_PIPE`], else 0) and its (dev,
/// ino); [`STDIO_LEN`] bytes, little-endian `dev0 ino0 dev1 ino1 dev2 ino2 kind0 kind1 kind2`. A
/// file its parent opened and handed over as stdin or stdout (a redirection) is the program's,
/// whoever opened it; a pipe between two programs of a job carries data no file event shows.
pub const STDIO_LEN: usize = 51;
/// A regular file.
pub const STREAM_FILE: u8 = 1;
/// A pipe, FIFO or socket.
pub const STREAM_PIPE: u8 = 2;

/// Encodes standard-stream identities for an Exec event: (kind, dev, ino) per stream.
pub fn encode_stdio(ids: &[(u8, u64, u64); 3]) -> [u8; STDIO_LEN] {
    let mut out = [0u8; STDIO_LEN];
    for (i, (kind, dev, ino)) in ids.iter().enumerate() {
        out[i * 16..i * 16 + 8].copy_from_slice(&dev.to_le_bytes());
        out[i * 16 + 8..i * 16 + 16].copy_from_slice(&ino.to_le_bytes());
        out[48 + i] = *kind;
    }
    out
}

/// Decodes [`encode_stdio`]'s bytes: (kind, dev, ino) per stream, kind 0 for a stream that is
/// neither a file nor a pipe, and for all three when `bytes` is not such a block.
pub fn decode_stdio(bytes: &[u8]) -> [(u8, u64, u64); 3] {
    let mut out = [(0, 0, 0); 3];
    if bytes.len() != STDIO_LEN {
        return out;
    }
    for (i, id) in out.iter_mut().enumerate() {
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        *id = (bytes[48 + i], word(i * 16), word(i * 16 + 8));
    }
    out
}

/// Identity of an opened file, as `fstat` saw it right after the open.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireStat {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub mode: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    pub kind: u16,
    pub _pad: u16,
    pub pid: i32,
    pub arg: i64,
    pub fd: i32,
    pub _pad2: i32,
    pub ts_ns: i64,
    pub stat: WireStat,
    pub lens: [u32; 4],
}

pub const HEADER_LEN: usize = core::mem::size_of::<Header>();

#[allow(unsafe_code)]
impl Header {
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: Header is repr(C), Copy, made only of integers with explicit padding fields,
        // so every byte is initialised.
        unsafe { core::slice::from_raw_parts(self as *const Header as *const u8, HEADER_LEN) }
    }

    /// Splits a received datagram into its header and strings; None if it is malformed.
    pub fn parse(buf: &[u8]) -> Option<(Header, [&[u8]; 4])> {
        if buf.len() < HEADER_LEN {
            return None;
        }
        // SAFETY: the length was checked; read_unaligned copes with any alignment, and any bit
        // pattern is a valid Header.
        let h: Header = unsafe { core::ptr::read_unaligned(buf.as_ptr() as *const Header) };
        let mut rest = &buf[HEADER_LEN..];
        let mut parts: [&[u8]; 4] = [&[]; 4];
        for (i, len) in h.lens.iter().enumerate() {
            let len = *len as usize;
            if rest.len() < len {
                return None;
            }
            parts[i] = &rest[..len];
            rest = &rest[len..];
        }
        Some((h, parts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut h = Header {
            kind: Kind::Rename as u16,
            pid: 42,
            lens: [4, 1, 0, 3],
            ..Header::default()
        };
        h.stat.ino = 7;
        let mut buf = [0u8; HEADER_LEN + 8];
        buf[..HEADER_LEN].copy_from_slice(h.as_bytes());
        buf[HEADER_LEN..].copy_from_slice(b"/tmpaxyz");
        let (back, parts) = Header::parse(&buf).unwrap();
        assert_eq!((back.pid, back.stat.ino), (42, 7));
        assert_eq!(parts, [&b"/tmp"[..], b"a", b"", b"xyz"]);
        assert!(Header::parse(&buf[..HEADER_LEN + 3]).is_none());
    }

    #[test]
    fn keys() {
        let (name, key) = split_sock_env(b"roar-1-ab:000102030405060708090a0b0c0d0eff").unwrap();
        assert_eq!(name, b"roar-1-ab");
        assert_eq!(key[15], 0xff);
        assert!(split_sock_env(b"roar-1-ab").is_none());
        assert!(split_sock_env(b"roar:0001").is_none());
        assert!(split_sock_env(b"roar:zz0102030405060708090a0b0c0d0eff").is_none());
        let mut dg = [7u8; 20];
        dg[4..].copy_from_slice(&key);
        assert_eq!(strip_key(&dg, &key), Some(&[7u8; 4][..]));
        dg[19] ^= 1;
        assert_eq!(strip_key(&dg, &key), None);
        assert_eq!(strip_key(&dg[..3], &key), None);
    }
}
