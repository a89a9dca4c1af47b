//! A shim's report (the wire header and its strings) as the engine's event.

use super::*;

pub(super) fn stat_of(s: &WireStat) -> FileStat {
    FileStat {
        dev: s.dev,
        ino: s.ino,
        size: s.size,
        mtime_ns: s.mtime_ns,
        ctime_ns: s.ctime_ns,
    }
}

pub(super) fn decode(h: &Header, p: [&[u8]; 4]) -> Option<Event> {
    let (pid, ts_ns) = (h.pid, h.ts_ns);
    let path = || join_normalize(p[0], p[1]);
    let path2 = || join_normalize(p[2], p[3]);
    Some(match Kind::from_u16(h.kind)? {
        Kind::Exec => {
            let (stdio, pipes) = crate::event::split_stdio(roar_wire::decode_stdio(p[3]));
            Event::Exec {
                pid,
                ppid: h.arg as i32,
                cwd: PathBuf::from(OsString::from_vec(p[0].to_vec())),
                exe: PathBuf::from(OsString::from_vec(p[1].to_vec())),
                argv: roar_store::argv_from_blob(p[2]),
                stdio,
                pipes,
                ts_ns,
            }
        }
        Kind::Fork => Event::Fork {
            pid,
            ppid: h.arg as i32,
            ts_ns,
        },
        Kind::Exit => Event::Exit { pid, ts_ns },
        Kind::Open => Event::Open {
            pid,
            path: path(),
            flags: h.arg as i32,
            stat: Some(stat_of(&h.stat)),
            ts_ns,
        },
        Kind::Rename => Event::Rename {
            pid,
            from: path(),
            to: path2(),
            ts_ns,
        },
        Kind::Link => Event::Link {
            pid,
            from: path(),
            to: path2(),
            ts_ns,
        },
        Kind::Unlink => Event::Unlink {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Truncate => Event::Truncate {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Mkdir => Event::Mkdir {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Rmdir => Event::Rmdir {
            pid,
            path: path(),
            ts_ns,
        },
        // A parent's word about its child (`Senders`), not an event.
        Kind::Spawned => return None,
        Kind::Exchange => Event::Exchange {
            pid,
            a: path(),
            b: path2(),
            ts_ns,
        },
        Kind::Symlink => Event::Symlink {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Untraced => Event::Untraced {
            pid,
            path: path(),
            why: match h.arg {
                2 => SETID,
                3 => crate::IO_URING,
                _ => STATIC,
            },
            ts_ns,
        },
    })
}
