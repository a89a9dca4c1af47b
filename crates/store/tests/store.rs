//! Store tests with no kernel features: migrations, refusal of bad databases, concurrent writers
//! from several processes, hashing vectors and the hash cache, and the queries.

use std::path::{Path, PathBuf};
use std::process::Command;

use roar_store::hash::{hash_if_settled, hash_path, hash_paths, HashOptions, Kind, Prior, Settled};
use roar_store::testing::file;
use roar_store::{
    Checkpoints, Committer, ContentHash, FileRecord, JobRecord, Outputs, Role, Store, StoreError,
    Writer, SCHEMA_VERSION,
};

fn job(argv: &[&str], files: Vec<FileRecord>) -> JobRecord {
    roar_store::testing::job(argv, "/work", 1_700_000_000_000_000_000, files)
}

fn new_db(dir: &Path) -> PathBuf {
    let path = dir.join("roar.db");
    roar_store::open(&path, true).unwrap();
    path
}

#[test]
fn migrates_an_empty_database_to_the_current_schema() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    assert_eq!(
        Store::open(&db).unwrap().stats().unwrap().schema_version,
        SCHEMA_VERSION
    );
}

#[test]
fn migrates_a_previous_version_database_keeping_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("roar.db");
    let old = roar_store::testing::create_at_version(&db, 1).unwrap();
    old.execute(
        "INSERT INTO jobs (argv, cwd, started_ns, status, backend) VALUES (x'6563686f00686921', '/w', 1, 'exited', 'preload')",
        [],
    )
    .unwrap();
    old.execute_batch(
        "INSERT INTO artifacts (blake3, size) VALUES ('ab12', 3);
         INSERT INTO job_files (job_id, role, kind, path, artifact_id, ops)
             VALUES (1, 'output', 'file', CAST('/w/out' AS BLOB), 1, 'write,create');",
    )
    .unwrap();
    let v: i64 = old
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 1);
    drop(old);

    let store = Store::open(&db).unwrap();
    let stats = store.stats().unwrap();
    assert_eq!(stats.schema_version, SCHEMA_VERSION);
    assert_eq!(stats.jobs, 1);
    assert_eq!(store.job(1).unwrap().summary.argv, vec!["echo", "hi!"]);
    assert_eq!(stats.hash_cache, 0, "the migration created the cache table");
    // job_files was rebuilt (v5) with its rows, indexes and checks.
    assert_eq!(store.path(Path::new("/w/out")).unwrap().history.len(), 1);
    let bad = store.conn().execute(
        "INSERT INTO job_files (job_id, role, kind, path, ops) VALUES (1, 'bogus', 'file', x'00', '')",
        [],
    );
    assert!(bad.is_err(), "the role check survived the rebuild");
    let indexes: i64 = store
        .conn()
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'job_files'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(indexes, 3);
}

#[test]
fn refuses_a_newer_schema_and_leaves_it_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
    drop(conn);
    let before = std::fs::read(&db).unwrap();
    match roar_store::open(&db, false) {
        Err(StoreError::NewerSchema { found: 99, .. }) => {}
        other => panic!("expected NewerSchema, got {:?}", other.err()),
    }
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn refuses_a_corrupt_database_and_leaves_it_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("roar.db");
    let garbage = b"this is not sqlite, it is somebody's notes\n".repeat(200);
    std::fs::write(&db, &garbage).unwrap();
    match roar_store::open(&db, false) {
        Err(StoreError::Corrupt { .. }) => {}
        other => panic!("expected Corrupt, got {:?}", other.err()),
    }
    assert_eq!(std::fs::read(&db).unwrap(), garbage);
}

#[test]
fn a_writer_opened_in_the_background_records_or_says_why_it_could_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let opening = Writer::open_in_background(&db, Checkpoints::Deferred).unwrap();
    let writer = opening.wait().unwrap();
    let files = vec![file(Role::Output, "/w/out", b"out")];
    let id = writer.record_job(job(&["make"], files)).unwrap();
    drop(writer);
    let stats = Store::open(&db).unwrap().stats().unwrap();
    assert_eq!((stats.jobs, stats.job_files), (1, 1), "job {id}");

    let corrupt = dir.path().join("corrupt.db");
    std::fs::write(&corrupt, b"not sqlite\n".repeat(500)).unwrap();
    let opening = Writer::open_in_background(&corrupt, Checkpoints::Deferred).unwrap();
    match opening.wait() {
        Err(StoreError::Corrupt { .. }) => {}
        other => panic!("expected Corrupt, got {:?}", other.err()),
    }
}

const WORKER_ENV: &str = "ROAR_TEST_WRITER_DB";
const JOBS_PER_WORKER: usize = 150;
const FILES_PER_JOB: usize = 4;

/// Not a test on its own: the body of each writer process of the concurrency test.
#[test]
fn concurrent_writer_worker() {
    let Some(db) = std::env::var_os(WORKER_ENV) else {
        return;
    };
    let me = std::process::id();
    let writer = Writer::start(Path::new(&db)).unwrap();
    for i in 0..JOBS_PER_WORKER {
        let files = (0..FILES_PER_JOB)
            .map(|f| {
                file(
                    Role::Output,
                    &format!("/out/{me}/{i}/{f}"),
                    format!("{me}-{i}-{f}").as_bytes(),
                )
            })
            .collect();
        writer.record_job(job(&["worker"], files)).unwrap();
    }
}

#[test]
fn every_reference_the_writer_stores_resolves() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let writer = Writer::start(&db).unwrap();
    let mut replaced = file(Role::Output, "/data/model.bin", b"v2");
    replaced.before = file(Role::Output, "/data/model.bin", b"v1").hash;
    let mut object = file(Role::Output, "s3://bucket/key", b"object");
    object.s3 = Some(roar_store::S3Object {
        bucket: "bucket".into(),
        key: "key".into(),
        version_id: None,
        etag: Some("\"e\"".into()),
        size: Some(6),
        range: None,
    });
    let mut unhashed = file(Role::Input, "/data/gone.csv", b"");
    unhashed.hash = None;
    let first = writer
        .record_job(job(
            &["train"],
            vec![
                file(Role::Input, "/data/in.csv", b"in"),
                replaced,
                object,
                unhashed,
            ],
        ))
        .unwrap();
    // The same contents again: artifacts that already exist are referenced, not re-inserted.
    let second = writer
        .record_job(job(
            &["train"],
            vec![
                file(Role::Input, "/data/in.csv", b"in"),
                file(Role::Temp, "/tmp/t", b"v1"),
            ],
        ))
        .unwrap();
    assert!(second > first);
    drop(writer);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let broken: Vec<(String, i64, String)> = conn
        .prepare("PRAGMA foreign_key_check")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(broken.is_empty(), "dangling references: {broken:?}");
    let (files, artifacts): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM job_files), (SELECT count(*) FROM artifacts)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((files, artifacts), (6, 4));
}

/// SQLite's own checkpoint point (`wal_autocheckpoint`'s default, 1000 pages of 4 KiB).
const SQLITE_AUTOCHECKPOINT: u64 = 1000 * 4096;

/// Records jobs of 2,000 files until the WAL of `db` has outgrown both its limit and SQLite's own
/// checkpoint point (past which SQLite would restart the WAL), then two more; returns the row count.
fn grow_wal(writer: &Writer, db: &Path) -> i64 {
    let mut files = 0;
    let mut after = None;
    for i in 0..100 {
        let batch = (0..2000)
            .map(|f| {
                file(
                    Role::Output,
                    &format!("/out/{i}/{f}"),
                    format!("{i}-{f}").as_bytes(),
                )
            })
            .collect();
        writer.record_job(job(&["grow"], batch)).unwrap();
        files += 2000;
        if after.is_none() && roar_store::checkpoint_due(db) && wal_len(db) > SQLITE_AUTOCHECKPOINT
        {
            after = Some(i + 2);
        }
        if after == Some(i) {
            return files;
        }
    }
    panic!("the WAL stayed under {} bytes", roar_store::WAL_LIMIT);
}

fn wal_len(db: &Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map_or(0, |m| m.len())
}

#[test]
fn a_deferring_writer_leaves_the_checkpoint_to_whoever_it_hands_it_to() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let writer = Writer::start_with(&db, Checkpoints::Deferred).unwrap();
    let files = grow_wal(&writer, &db);
    drop(writer);
    // No commit checkpointed (SQLite's own policy would have restarted the WAL every 1000
    // pages) and neither did the exiting writer: every frame written is still in the WAL.
    // (A passive checkpoint answers how many frames the WAL holds; it leaves the file's size.)
    assert!(roar_store::checkpoint_due(&db));
    let frames: i64 = roar_store::open(&db, false)
        .unwrap()
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
        .unwrap();
    assert!(
        frames as u64 * 4096 > roar_store::WAL_LIMIT.max(SQLITE_AUTOCHECKPOINT),
        "only {frames} frames left in the WAL"
    );

    roar_store::checkpoint(&db).unwrap();
    assert_eq!(wal_len(&db), 0, "the checkpoint did not truncate the WAL");
    assert!(!roar_store::checkpoint_due(&db));
    let stats = Store::open(&db).unwrap().stats().unwrap();
    assert_eq!(stats.job_files, files);
}

#[test]
fn an_inline_writer_truncates_a_large_wal_when_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let writer = Writer::start(&db).unwrap();
    let files = grow_wal(&writer, &db);
    drop(writer);
    assert_eq!(wal_len(&db), 0, "the exiting writer left its WAL");
    let stats = Store::open(&db).unwrap().stats().unwrap();
    assert_eq!(stats.job_files, files);
}

#[test]
fn concurrent_writers_in_several_processes_lose_no_rows() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let exe = std::env::current_exe().unwrap();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "concurrent_writer_worker", "--test-threads=1"])
                .env(WORKER_ENV, &db)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut w in workers {
        assert!(w.wait().unwrap().success(), "a writer process failed");
    }
    let stats = Store::open(&db).unwrap().stats().unwrap();
    assert_eq!(stats.jobs, 4 * JOBS_PER_WORKER as i64);
    assert_eq!(
        stats.job_files,
        (4 * JOBS_PER_WORKER * FILES_PER_JOB) as i64
    );
    assert_eq!(
        stats.artifacts,
        (4 * JOBS_PER_WORKER * FILES_PER_JOB) as i64
    );
}

#[test]
fn known_hash_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let opts = HashOptions { sha256: true };
    let cases: [(&[u8], &str, &str); 2] = [
        (
            b"",
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        ),
        (
            b"abc",
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85",
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ),
    ];
    for (i, (content, b3, sha)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("v{i}"));
        std::fs::write(&p, content).unwrap();
        let h = hash_path(&p, opts).unwrap().hash;
        assert_eq!(h.blake3, *b3);
        assert_eq!(h.sha256.as_deref(), Some(*sha));
        assert_eq!(h.size, content.len() as u64);
    }
}

#[test]
fn big_files_hash_the_same_through_the_parallel_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big");
    let content: Vec<u8> = (0..5_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&p, &content).unwrap();
    let h = hash_path(&p, HashOptions { sha256: true }).unwrap().hash;
    assert_eq!(h.blake3, blake3::hash(&content).to_hex().to_string());
    use sha2::Digest;
    assert_eq!(
        h.sha256.unwrap(),
        roar_store::hash::hex(&sha2::Sha256::digest(&content))
    );
}

/// Sets a file's timestamps into the past so its cache entry is not "racy".
fn age(path: &Path, secs_ago: u64) {
    let t = std::time::SystemTime::now() - std::time::Duration::from_secs(secs_ago);
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_times(std::fs::FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
}

#[test]
fn cache_hits_until_content_changes_even_with_the_same_mtime_and_size() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let f = dir.path().join("data.bin");
    std::fs::write(&f, b"version one").unwrap();
    age(&f, 60);
    let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
    let paths = vec![f.clone()];
    let writer = Writer::start(&db).unwrap();
    let store = Store::open(&db).unwrap();
    let opts = HashOptions::default();
    let hash = |prior: Prior<'static>| {
        hash_paths(
            &paths,
            opts,
            &move |_| prior,
            &|| Some(store.conn()),
            &|_| {},
        )
    };
    // ctime cannot be set back: wait out the racy window so the entry is trusted.
    std::thread::sleep(std::time::Duration::from_nanos(
        2 * roar_store::hash::RACY_NS as u64,
    ));

    let first = hash(Prior::MayBeCached);
    assert!(!first.results[0].as_ref().unwrap().from_cache);
    writer.cache(first.new_cache).unwrap();
    writer.flush().unwrap();

    let second = hash(Prior::MayBeCached);
    let second = second.results[0].as_ref().unwrap();
    assert!(
        second.from_cache,
        "an unchanged, old file is answered from the cache"
    );
    assert_eq!(
        second.hash.blake3,
        blake3::hash(b"version one").to_hex().to_string()
    );

    // Content the caller knows is new is read, never looked up.
    let known_new = hash(Prior::New);
    let known_new = known_new.results[0].as_ref().unwrap();
    assert!(!known_new.from_cache);
    assert_eq!(known_new.hash.blake3, second.hash.blake3);

    // Same size, mtime put back: only ctime betrays the change.
    std::fs::write(&f, b"version two").unwrap();
    let file = std::fs::File::options().write(true).open(&f).unwrap();
    file.set_modified(mtime).unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().modified().unwrap(), mtime);
    let third = hash(Prior::MayBeCached);
    let third = third.results[0].as_ref().unwrap();
    assert!(!third.from_cache);
    assert_eq!(
        third.hash.blake3,
        blake3::hash(b"version two").to_hex().to_string()
    );
}

#[test]
fn an_earlier_hash_stands_only_while_the_file_keeps_its_identity() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("model.bin");
    std::fs::write(&f, b"version one").unwrap();
    let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
    let opts = HashOptions::default();
    let paths = vec![f.clone()];
    let reuse = |earlier: &roar_store::hash::Hashed| {
        let batch = hash_paths(&paths, opts, &|_| Prior::Hashed(earlier), &|| None, &|_| {});
        let h = batch.results.into_iter().next().unwrap().unwrap();
        (h.read_ns == earlier.read_ns, h.hash.blake3)
    };

    // Just written: not read, since a hash now could not be trusted later.
    assert!(matches!(
        hash_if_settled(&f, Kind::Regular, opts).unwrap(),
        Settled::Recent(_)
    ));
    std::thread::sleep(std::time::Duration::from_nanos(
        2 * roar_store::hash::RACY_NS as u64,
    ));
    let Settled::Hashed(early) = hash_if_settled(&f, Kind::Regular, opts).unwrap() else {
        panic!("a file left alone past the racy window is hashed");
    };
    assert_eq!(
        reuse(&early),
        (true, blake3::hash(b"version one").to_hex().to_string()),
        "unchanged since: the earlier hash is taken without a read"
    );

    // Same size, mtime put back: only ctime betrays the change, and the file is read again.
    std::fs::write(&f, b"version two").unwrap();
    let file = std::fs::File::options().write(true).open(&f).unwrap();
    file.set_modified(mtime).unwrap();
    assert_eq!(
        reuse(&early),
        (false, blake3::hash(b"version two").to_hex().to_string())
    );

    // An earlier hash taken within the racy window is never trusted, even with the same identity.
    std::fs::write(&f, b"version 3!!").unwrap();
    let racy = roar_store::hash::hash_path(&f, opts).unwrap();
    assert_eq!(
        reuse(&racy),
        (false, blake3::hash(b"version 3!!").to_hex().to_string())
    );
}

#[test]
fn freshly_written_files_are_not_trusted_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let f = dir.path().join("new.bin");
    std::fs::write(&f, b"just written").unwrap();
    let writer = Writer::start(&db).unwrap();
    let store = Store::open(&db).unwrap();
    let paths = vec![f];
    let first = hash_paths(
        &paths,
        HashOptions::default(),
        &|_| Prior::MayBeCached,
        &|| Some(store.conn()),
        &|_| {},
    );
    writer.cache(first.new_cache).unwrap();
    writer.flush().unwrap();
    let again = hash_paths(
        &paths,
        HashOptions::default(),
        &|_| Prior::MayBeCached,
        &|| Some(store.conn()),
        &|_| {},
    );
    assert!(
        !again.results[0].as_ref().unwrap().from_cache,
        "a file hashed within the racy window of its last change must be re-read"
    );
}

#[test]
fn a_fifo_in_place_of_a_file_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // Both ways in: stat first (a possible cache hit) and open first (content known to be new).
    for prior in [Prior::MayBeCached, Prior::New] {
        let batch = hash_paths(
            std::slice::from_ref(&fifo),
            HashOptions::default(),
            &|_| prior,
            &|| None,
            &|_| {},
        );
        assert!(
            matches!(
                batch.results[0],
                Err(roar_store::hash::HashError::NotAFile { .. })
            ),
            "{:?}",
            batch.results[0].as_ref().map(|h| &h.hash)
        );
    }
    // Hashing during a job looks before it opens: a FIFO the job uses is never opened at all
    // (checked by age too: an old FIFO is as much a FIFO).
    std::thread::sleep(std::time::Duration::from_nanos(
        2 * roar_store::hash::RACY_NS as u64,
    ));
    assert!(matches!(
        hash_if_settled(&fifo, Kind::Unknown, HashOptions::default()),
        Err(roar_store::hash::HashError::NotAFile { .. })
    ));
}

#[test]
fn queries_resolve_prefixes_paths_and_uses() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let writer = Writer::start(&db).unwrap();
    let made = writer
        .record_job(job(
            &["make-it"],
            vec![file(Role::Output, "/w/out.txt", b"payload")],
        ))
        .unwrap();
    let used = writer
        .record_job(job(
            &["use-it"],
            vec![
                file(Role::Input, "/w/out.txt", b"payload"),
                file(Role::Output, "/w/sum.txt", b"7"),
            ],
        ))
        .unwrap();
    let store = Store::open(&db).unwrap();
    let full = blake3::hash(b"payload").to_hex().to_string();
    let hash = store.resolve_hash(&full[..6]).unwrap();
    assert_eq!(hash.blake3, full);
    let detail = store.artifact(&hash).unwrap();
    assert_eq!(
        detail.made_by.iter().map(|u| u.job_id).collect::<Vec<_>>(),
        vec![made]
    );
    assert_eq!(
        detail.used_by.iter().map(|u| u.job_id).collect::<Vec<_>>(),
        vec![used]
    );
    assert_eq!(
        store.path(Path::new("/w/out.txt")).unwrap().history.len(),
        2
    );
    assert!(matches!(
        store.path(Path::new("/w/nope")),
        Err(StoreError::UnknownPath { .. })
    ));
    assert!(matches!(
        store.resolve_hash("ffffffff"),
        Err(StoreError::UnknownHash { .. })
    ));
    assert!(matches!(
        store.job(99),
        Err(StoreError::UnknownJob { id: 99 })
    ));
    let jobs = store.jobs(10).unwrap();
    assert_eq!(
        jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![used, made],
        "newest first"
    );
    assert_eq!((jobs[0].inputs, jobs[0].outputs), (1, 1));
}

/// A `roar run` nested in another can have its row written first: the log lists jobs by when
/// they started, not by id, and the index makes that a seek, not a sort of every job.
#[test]
fn the_log_lists_jobs_in_the_order_they_started_whatever_their_ids() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let writer = Writer::start(&db).unwrap();
    let at = |argv: &str, started_ns: i64| {
        let mut j = job(&[argv], vec![]);
        j.started_ns = started_ns;
        writer.record_job(j).unwrap()
    };
    let inner = at("inner", 1_700_000_000_500_000_000);
    let outer = at("outer", 1_700_000_000_000_000_000);
    let after = at("after", 1_700_000_002_000_000_000);
    let same = at("same-tick", 1_700_000_002_000_000_000);
    assert!(inner < outer);
    drop(writer);
    let store = Store::open(&db).unwrap();
    let ids = |n| {
        store
            .jobs(n)
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(10), [same, after, inner, outer], "last started first");
    assert_eq!(ids(2), [same, after]);
    let plan: String = store
        .conn()
        .query_row(
            "EXPLAIN QUERY PLAN SELECT id FROM jobs j ORDER BY j.started_ns DESC, j.id DESC LIMIT 5",
            [],
            |r| r.get(3),
        )
        .unwrap();
    assert!(plan.contains("jobs_started"), "{plan}");
}

#[test]
fn ambiguous_prefixes_list_their_candidates() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let writer = Writer::start(&db).unwrap();
    // Enough distinct artifacts that two share a first hex digit.
    let hashes: Vec<ContentHash> = (0..40)
        .map(|i| ContentHash {
            blake3: blake3::hash(&[i]).to_hex().to_string(),
            sha256: None,
            size: 1,
        })
        .collect();
    writer.artifacts(hashes.clone()).unwrap();
    writer.flush().unwrap();
    let store = Store::open(&db).unwrap();
    let first = &hashes[0].blake3[..1];
    let sharing = hashes
        .iter()
        .filter(|h| h.blake3.starts_with(first))
        .count();
    assert!(
        sharing >= 2,
        "40 hashes over 16 digits must collide on the first"
    );
    match store.resolve_hash(first) {
        Err(StoreError::AmbiguousHash { candidates, .. }) => {
            assert_eq!(candidates.len(), sharing.min(11))
        }
        other => panic!("expected AmbiguousHash, got {other:?}"),
    }
}

/// A hash-cache entry for a small file written in `dir`.
fn cache_entry(dir: &Path) -> roar_store::CacheEntry {
    let f = dir.join("f");
    std::fs::write(&f, b"content").unwrap();
    let hashed = hash_path(&f, HashOptions::default()).unwrap();
    roar_store::CacheEntry {
        stat: hashed.stat,
        hash: hashed.hash,
        hashed_ns: hashed.read_ns,
    }
}

/// Asserts that `err` was caused by the store's refusal carrying `message`.
fn assert_refused(err: &StoreError, message: &str) {
    let cause = std::error::Error::source(err).map(|e| e.to_string());
    assert!(
        cause.as_deref().is_some_and(|c| c.contains(message)),
        "{err}: {cause:?}"
    );
}

#[test]
fn a_failed_hash_record_nobody_waited_for_fails_the_next_flush() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let entry = cache_entry(dir.path());
    let conn = roar_store::open(&db, false).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON hash_cache
         BEGIN SELECT RAISE(ABORT, 'disk says no'); END;",
    )
    .unwrap();
    let writer = Writer::start(&db).unwrap();
    writer.cache(vec![entry]).unwrap();
    // Committed (and failed) on its own before the flush arrives: the flush's own, empty,
    // transaction succeeds, and the earlier failure must not be lost with it.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let err = writer
        .flush()
        .expect_err("the lost cache entry is reported");
    assert_refused(&err, "disk says no");
    writer.flush().expect("reported once");
}

#[test]
fn a_job_streamed_to_the_writer_commits_with_all_its_chunks_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let entry = cache_entry(dir.path());
    let outputs = |from: usize, to: usize| -> Vec<FileRecord> {
        (from..to)
            .map(|i| {
                file(
                    Role::Output,
                    &format!("/out/{i}"),
                    format!("{i}").as_bytes(),
                )
            })
            .collect()
    };
    let count = |sql: &str| -> i64 {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    };

    let writer = Writer::start(&db).unwrap();
    let stream = writer
        .start_job(job(&["train"], vec![file(Role::Input, "/in", b"in")]))
        .unwrap();
    stream.send(roar_store::FileChunk {
        files: outputs(0, 3),
        cache: vec![entry],
    });
    // Not committed while the job's files are still coming.
    assert_eq!(count("SELECT count(*) FROM jobs"), 0);
    stream.send(roar_store::FileChunk {
        files: outputs(3, 5),
        cache: vec![],
    });
    let id = stream.finish().unwrap();
    assert_eq!(
        count(&format!(
            "SELECT count(*) FROM job_files WHERE job_id = {id}"
        )),
        6
    );
    assert_eq!(count("SELECT count(*) FROM hash_cache"), 1);

    // A chunk the store refuses fails the whole job, the chunks before it included.
    let conn = roar_store::open(&db, false).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON job_files WHEN NEW.path = CAST('/out/bad' AS BLOB)
         BEGIN SELECT RAISE(ABORT, 'disk says no'); END;",
    )
    .unwrap();
    let stream = writer.start_job(job(&["train"], outputs(10, 12))).unwrap();
    stream.send(roar_store::FileChunk {
        files: outputs(12, 14),
        cache: vec![],
    });
    stream.send(roar_store::FileChunk {
        files: vec![file(Role::Output, "/out/bad", b"bad")],
        cache: vec![],
    });
    // Sent after the failure: dropped without blocking the sender.
    stream.send(roar_store::FileChunk {
        files: outputs(14, 16),
        cache: vec![],
    });
    let err = stream.finish().expect_err("the refused row fails the job");
    assert_refused(&err, "disk says no");
    assert_eq!(count("SELECT count(*) FROM jobs"), 1);
    assert_eq!(count("SELECT count(*) FROM job_files"), 6);
    // The writer goes on with the next job.
    writer.record_job(job(&["next"], outputs(20, 21))).unwrap();
    assert_eq!(count("SELECT count(*) FROM jobs"), 2);
}

#[test]
fn a_file_truncated_while_it_is_hashed_gives_a_hash_or_changed_never_a_crash() {
    // Hashing used to memory-map big files: a truncate by another process while the map was
    // read raised SIGBUS and killed the hashing process (the mount's daemon). Reads cannot.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    let full = vec![7u8; 24 << 20];
    std::fs::write(&path, &full).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (path, stop, full) = (path.clone(), stop.clone(), full.clone());
        std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                f.set_len(0).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, &full, 0).unwrap();
            }
        })
    };
    let whole = blake3::hash(&full).to_hex().to_string();
    let (mut hashed, mut raced) = (0, 0);
    for _ in 0..60 {
        match hash_path(&path, HashOptions::default()) {
            // A hash that completes is of one state of the file: all of it, or the prefix the
            // rewrite had reached (every byte is 7, so any consistent state is n sevens; the
            // identity check catches any mix).
            Ok(h) if h.hash.size == full.len() as u64 => {
                assert_eq!(h.hash.blake3, whole);
                hashed += 1;
            }
            Ok(h) => {
                let n = h.hash.size as usize;
                assert!(n < full.len());
                assert_eq!(h.hash.blake3, blake3::hash(&full[..n]).to_hex().to_string());
                raced += 1;
            }
            Err(roar_store::hash::HashError::Changed { .. }) => raced += 1,
            Err(e) => panic!("{e}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().unwrap();
    assert!(
        raced > 0,
        "the rewrite never met a hash ({hashed} clean hashes of the whole file)"
    );
}

/// The recorder's writer: callers on several threads commit their own jobs (running row first,
/// then the whole job with its hash-cache entries) and each gets its own row, redacted; once
/// another roar has moved the schema on, it writes nothing and says so.
#[test]
fn a_committer_writes_each_callers_job_and_nothing_once_the_schema_moves_on() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let entry = cache_entry(dir.path());
    let committer = Committer::open(&db, Checkpoints::Deferred).unwrap();
    let ids: Vec<i64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (committer, entry) = (&committer, &entry);
                s.spawn(move || {
                    (0..25)
                        .map(|i| {
                            let mut j = job(
                                &["train", &format!("--run={t}.{i}")],
                                vec![file(Role::Output, &format!("/out/{t}/{i}"), b"x")],
                            );
                            j.env
                                .insert("AWS_SECRET_ACCESS_KEY".into(), "wJalrXUtnFEMI".into());
                            let begun = committer
                                .begin_job_for(&j, "1:1".into())
                                .expect("running row");
                            let id = committer
                                .record(Some(begun), std::slice::from_ref(entry), j)
                                .expect("job");
                            assert_eq!(id, begun, "the job goes into its running row");
                            id
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 100);
    let conn = roar_store::open(&db, false).unwrap();
    let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(
        count("SELECT count(*) FROM jobs WHERE status = 'exited' AND recorder IS NULL"),
        100
    );
    assert_eq!(count("SELECT count(*) FROM job_files"), 100);
    assert_eq!(count("SELECT count(*) FROM hash_cache"), 1);
    assert_eq!(
        count("SELECT count(*) FROM jobs WHERE env LIKE '%wJalrXUtnFEMI%'"),
        0,
        "jobs are redacted on their way in"
    );

    // A write that fails leaves nothing of its transaction, and the next one goes in.
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON processes
         BEGIN SELECT RAISE(ABORT, 'disk says no'); END;",
    )
    .unwrap();
    let mut refused = job(&["refused"], vec![file(Role::Output, "/out/refused", b"r")]);
    refused.processes.push(roar_store::ProcessRecord {
        pid: 7,
        parent_pid: None,
        exe: None,
        argv: vec!["refused".into()],
        started_ns: Some(1),
        ended_ns: None,
    });
    let err = committer.record(None, &[], refused).expect_err("refused");
    assert_refused(&err, "disk says no");
    assert_eq!(count("SELECT count(*) FROM jobs"), 100);
    assert_eq!(count("SELECT count(*) FROM job_files"), 100);
    conn.execute_batch("DROP TRIGGER refuse").unwrap();
    committer
        .record(None, &[], job(&["after"], vec![]))
        .expect("the next write");
    assert_eq!(count("SELECT count(*) FROM jobs"), 101);

    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let late = job(&["late"], vec![]);
    match committer.begin_job_for(&late, "1:1".into()) {
        Err(StoreError::SchemaChanged { found, .. }) => assert_eq!(found, SCHEMA_VERSION + 1),
        other => panic!("expected SchemaChanged, got {other:?}"),
    }
    match committer.record(None, &[], late) {
        Err(StoreError::SchemaChanged { .. }) => {}
        other => panic!("expected SchemaChanged, got {other:?}"),
    }
    assert_eq!(count("SELECT count(*) FROM jobs"), 101, "nothing written");
}

/// A lineage reads each job's files by the range of row ids they were written in (a job's rows
/// are written together), matching the job row by row inside it. Rows of jobs written at the same
/// time can interleave: with every job's rows scattered among the others', the lineage is the
/// same, both when every output is read and when a directory of many is counted.
#[test]
fn a_lineage_is_the_same_whichever_way_a_jobs_rows_lie() {
    let dir = tempfile::tempdir().unwrap();
    let db = new_db(dir.path());
    let writer = Writer::start(&db).unwrap();
    let at = |s: i64, argv: &[&str], files| {
        roar_store::testing::job(argv, "/work", s * 1_000_000_000_000, files)
    };
    let mut shards: Vec<FileRecord> = (0..9)
        .map(|i| file(Role::Output, &format!("/w/data/s{i}"), &[i]))
        .collect();
    shards.push(file(Role::Input, "/w/raw.csv", b"raw"));
    shards.push(file(Role::Output, "/w/meta.json", b"{}"));
    writer.record_job(at(1, &["prep"], shards)).unwrap();
    let mut read: Vec<FileRecord> = (0..9)
        .map(|i| file(Role::Input, &format!("/w/data/s{i}"), &[i]))
        .collect();
    read.push(file(Role::Input, "/w/meta.json", b"{}"));
    read.push(file(Role::Output, "/w/model.pt", b"weights"));
    writer.record_job(at(2, &["train"], read)).unwrap();
    writer
        .record_job(at(
            3,
            &["eval"],
            vec![
                file(Role::Input, "/w/model.pt", b"weights"),
                file(Role::Output, "/w/score", b"0.9"),
            ],
        ))
        .unwrap();
    drop(writer);
    let lineages = || {
        let store = Store::open(&db).unwrap();
        let target = store.version_at(Path::new("/w/score")).unwrap();
        [Outputs::Every, Outputs::Collapsed { at: 6 }]
            .map(|o| serde_json::to_string(&store.lineage_with(&target, o).unwrap()).unwrap())
    };
    let as_written = lineages();
    assert!(as_written[1].contains("/w/data"), "{}", as_written[1]);
    // Every row id moved out of the way, then to (id * 7919) mod 100003: a bijection that
    // scatters each job's rows among the others'.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "UPDATE job_files SET id = id + 1000000;
         UPDATE job_files SET id = ((id - 1000000) * 7919) % 100003;",
    )
    .unwrap();
    let spread: i64 = conn
        .query_row(
            "SELECT MAX(n) FROM (SELECT MAX(id) - MIN(id) + 1 - COUNT(*) AS n FROM job_files GROUP BY job_id)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(spread > 0, "the rows still lie together");
    drop(conn);
    assert_eq!(lineages(), as_written);
}
