//! The index of an archive, kept as a SQLite file (`<dir>/<tag>.sqlite`, the tag a hash of
//! the archive's path) and reused while the archive file keeps its identity (size, mtime,
//! ctime, inode, device); anything else rebuilds it. Written to a temporary file and renamed, so
//! a reader never sees half an index and two mounts of one archive do not collide.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension};

use crate::bytes::{Bytes, Shared};
use crate::scan::{Owner, Progress};
use crate::{ArchiveError, Data, Format, Identity, Index, Kind, Member, Point, Stored};

/// Bumped whenever what is stored changes meaning: an index of another version is rebuilt.
/// 4: tar.bz2 indexes hold restart points inside blocks (`bz2block`).
/// 5: gzip windows compressed, points by decoding cost, stored blocks listed.
/// 6: gzip points inside blocks (`points.block`).
const VERSION: i64 = 6;

/// Whether [`open`] reused an index or built one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Reused,
    Built,
}

/// Where the index of `archive` (a canonical path) is kept.
pub fn index_path(dir: &Path, archive: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let tag = blake3::hash(archive.as_os_str().as_bytes()).to_hex();
    dir.join(format!("{}.sqlite", &tag[..16]))
}

/// The index of `archive`: reused from `dir` if it is current, else built (calling
/// `progress` with bytes read) and saved.
pub fn open(
    archive: &Path,
    dir: &Path,
    progress: Progress,
) -> Result<(Index, Origin), ArchiveError> {
    let canonical = std::fs::canonicalize(archive).map_err(|source| ArchiveError::Io {
        path: archive.to_owned(),
        source,
    })?;
    let meta = std::fs::metadata(&canonical).map_err(|source| ArchiveError::Io {
        path: canonical.clone(),
        source,
    })?;
    if !meta.is_file() {
        return Err(ArchiveError::Unsupported {
            path: canonical,
            why: "not a regular file".into(),
        });
    }
    reuse_or_build(&canonical, Identity::of(&meta), dir, || {
        crate::scan::scan(&canonical, progress)
    })
}

/// The index of the archive in `bytes` (a member of another archive, named `OUTER!/member`, its
/// hash `blake3` known from the outer index): reused from `dir` if it is of the same content,
/// else built and saved.
pub fn open_in(
    name: &Path,
    bytes: Shared,
    owner: Owner,
    blake3: [u8; 32],
    dir: &Path,
    progress: Progress,
) -> Result<(Index, Origin), ArchiveError> {
    let identity = bytes.identity().map_err(|source| ArchiveError::Io {
        path: name.to_owned(),
        source,
    })?;
    reuse_or_build(name, identity, dir, || {
        crate::scan::scan_bytes(
            name.to_owned(),
            bytes.clone(),
            owner,
            Some(blake3),
            progress,
        )
    })
}

fn reuse_or_build(
    archive: &Path,
    identity: Identity,
    dir: &Path,
    build: impl FnOnce() -> Result<Index, ArchiveError>,
) -> Result<(Index, Origin), ArchiveError> {
    let at = index_path(dir, archive);
    // An index that cannot be read is rebuilt, never trusted.
    if let Ok(Some(index)) = load(&at, archive, identity) {
        return Ok((index, Origin::Reused));
    }
    let index = build()?;
    std::fs::create_dir_all(dir).map_err(|source| ArchiveError::Io {
        path: dir.to_owned(),
        source,
    })?;
    save(&at, &index).map_err(|source| ArchiveError::Cache {
        path: at.clone(),
        source,
    })?;
    Ok((index, Origin::Built))
}

fn load(at: &Path, archive: &Path, identity: Identity) -> rusqlite::Result<Option<Index>> {
    if !at.exists() {
        return Ok(None);
    }
    let db = Connection::open_with_flags(at, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let meta = |k: &str| -> rusqlite::Result<Option<rusqlite::types::Value>> {
        db.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
            .optional()
    };
    let int = |k: &str| -> rusqlite::Result<Option<i64>> {
        Ok(match meta(k)? {
            Some(rusqlite::types::Value::Integer(i)) => Some(i),
            _ => None,
        })
    };
    if int("version")? != Some(VERSION) {
        return Ok(None);
    }
    let stored = Identity {
        size: int("size")?.unwrap_or(-1) as u64,
        mtime_ns: int("mtime_ns")?.unwrap_or(-1),
        ctime_ns: int("ctime_ns")?.unwrap_or(-1),
        ino: int("ino")?.unwrap_or(-1) as u64,
        dev: int("dev")?.unwrap_or(-1) as u64,
    };
    let path_matches = matches!(meta("archive")?, Some(rusqlite::types::Value::Blob(b)) if b == archive.as_os_str().as_encoded_bytes());
    if stored != identity || !path_matches {
        return Ok(None);
    }
    let Some(rusqlite::types::Value::Text(format)) = meta("format")? else {
        return Ok(None);
    };
    let Some(format) = Format::from_name(&format) else {
        return Ok(None);
    };
    let Some(rusqlite::types::Value::Blob(whole)) = meta("blake3")? else {
        return Ok(None);
    };
    let (members, earlier) = entries(&db)?;
    let points = db
        .prepare("SELECT uoff, coff, bits, window, block FROM points ORDER BY uoff")?
        .query_map([], |r| {
            Ok(Point {
                uoff: r.get::<_, i64>(0)? as u64,
                coff: r.get::<_, i64>(1)? as u64,
                bits: r.get(2)?,
                window: r.get(3)?,
                block: r.get::<_, Option<i64>>(4)?.map(|b| b as u64),
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let stored = db
        .prepare("SELECT uoff, coff, len FROM stored ORDER BY uoff")?
        .query_map([], |r| {
            Ok(Stored {
                uoff: r.get::<_, i64>(0)? as u64,
                coff: r.get::<_, i64>(1)? as u64,
                len: r.get::<_, i64>(2)? as u64,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let skipped = db
        .prepare("SELECT path, why FROM skipped ORDER BY rowid")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Some(Index {
        archive: archive.to_owned(),
        format,
        identity,
        blake3: blob32(whole),
        members,
        earlier,
        points,
        stored,
        skipped,
    }))
}

/// The members, and the earlier versions of paths given twice.
fn entries(db: &Connection) -> rusqlite::Result<(Vec<Member>, Vec<Member>)> {
    let (mut members, mut earlier) = (Vec::new(), Vec::new());
    let mut q = db.prepare(
        "SELECT path, kind, mode, uid, gid, mtime, size, place, offset, csize, blake3, link, earlier
         FROM members ORDER BY rowid",
    )?;
    let mut rows = q.query([])?;
    while let Some(r) = rows.next()? {
        let offset = r.get::<_, i64>(8)? as u64;
        let data = match r.get::<_, i64>(7)? {
            0 => Data::Raw { offset },
            1 => Data::Stream { offset },
            _ => Data::Deflate {
                offset,
                csize: r.get::<_, i64>(9)? as u64,
            },
        };
        let to = if r.get::<_, bool>(12)? {
            &mut earlier
        } else {
            &mut members
        };
        to.push(Member {
            path: r.get(0)?,
            kind: match r.get::<_, i64>(1)? {
                0 => Kind::File,
                1 => Kind::Dir,
                _ => Kind::Symlink,
            },
            mode: r.get(2)?,
            uid: r.get(3)?,
            gid: r.get(4)?,
            mtime: r.get(5)?,
            size: r.get::<_, i64>(6)? as u64,
            data,
            blake3: blob32(r.get(10)?),
            link: r.get(11)?,
        });
    }
    Ok((members, earlier))
}

fn blob32(v: Vec<u8>) -> [u8; 32] {
    let mut out = [0u8; 32];
    if v.len() == 32 {
        out.copy_from_slice(&v);
    }
    out
}

/// The members and their earlier versions.
fn save_members(tx: &rusqlite::Transaction, index: &Index) -> rusqlite::Result<()> {
    let mut ins = tx.prepare(
        "INSERT INTO members (path, kind, mode, uid, gid, mtime, size, place, offset, csize, blake3, link, earlier)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?;
    let entries =
        (index.members.iter().map(|m| (m, false))).chain(index.earlier.iter().map(|m| (m, true)));
    for (m, earlier) in entries {
        let (place, offset, csize) = match m.data {
            Data::Raw { offset } => (0, offset, 0),
            Data::Stream { offset } => (1, offset, 0),
            Data::Deflate { offset, csize } => (2, offset, csize),
        };
        let kind = match m.kind {
            Kind::File => 0,
            Kind::Dir => 1,
            Kind::Symlink => 2,
        };
        ins.execute(params![
            m.path,
            kind,
            m.mode,
            m.uid,
            m.gid,
            m.mtime,
            m.size as i64,
            place,
            offset as i64,
            csize as i64,
            &m.blake3[..],
            m.link,
            earlier
        ])?;
    }
    Ok(())
}

/// Where decoding can resume, what is stored as it is, and what was left out.
fn save_access(tx: &rusqlite::Transaction, index: &Index) -> rusqlite::Result<()> {
    let mut pts = tx.prepare(
        "INSERT INTO points (uoff, coff, bits, window, block) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for p in &index.points {
        let block = p.block.map(|b| b as i64);
        pts.execute(params![
            p.uoff as i64,
            p.coff as i64,
            p.bits,
            p.window,
            block
        ])?;
    }
    let mut st = tx.prepare("INSERT INTO stored (uoff, coff, len) VALUES (?1, ?2, ?3)")?;
    for s in &index.stored {
        st.execute(params![s.uoff as i64, s.coff as i64, s.len as i64])?;
    }
    let mut sk = tx.prepare("INSERT INTO skipped (path, why) VALUES (?1, ?2)")?;
    for (p, why) in &index.skipped {
        sk.execute(params![p, why])?;
    }
    Ok(())
}

fn save(at: &Path, index: &Index) -> rusqlite::Result<()> {
    let tmp = at.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut db = Connection::open(&tmp)?;
        db.execute_batch(
            "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
             CREATE TABLE meta (key TEXT PRIMARY KEY, value);
             CREATE TABLE members (path BLOB NOT NULL, kind INTEGER NOT NULL, mode INTEGER NOT NULL,
               uid INTEGER NOT NULL, gid INTEGER NOT NULL, mtime INTEGER NOT NULL,
               size INTEGER NOT NULL, place INTEGER NOT NULL, offset INTEGER NOT NULL,
               csize INTEGER NOT NULL, blake3 BLOB NOT NULL, link BLOB, earlier INTEGER NOT NULL);
             CREATE TABLE points (uoff INTEGER NOT NULL, coff INTEGER NOT NULL,
               bits INTEGER NOT NULL, window BLOB NOT NULL, block INTEGER);
             CREATE TABLE stored (uoff INTEGER NOT NULL, coff INTEGER NOT NULL, len INTEGER NOT NULL);
             CREATE TABLE skipped (path BLOB NOT NULL, why TEXT NOT NULL);",
        )?;
        let tx = db.transaction()?;
        {
            let mut meta = tx.prepare("INSERT INTO meta (key, value) VALUES (?1, ?2)")?;
            let id = &index.identity;
            meta.execute(params!["version", VERSION])?;
            meta.execute(params![
                "archive",
                index.archive.as_os_str().as_encoded_bytes()
            ])?;
            meta.execute(params!["format", index.format.name()])?;
            meta.execute(params!["blake3", &index.blake3[..]])?;
            meta.execute(params!["size", id.size as i64])?;
            meta.execute(params!["mtime_ns", id.mtime_ns])?;
            meta.execute(params!["ctime_ns", id.ctime_ns])?;
            meta.execute(params!["ino", id.ino as i64])?;
            meta.execute(params!["dev", id.dev as i64])?;
            save_members(&tx, index)?;
            save_access(&tx, index)?;
        }
        tx.commit()?;
        db.close().map_err(|(_, e)| e)?;
        std::fs::rename(&tmp, at).map_err(|e| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(format!("cannot put the index in place: {e}")),
            )
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
