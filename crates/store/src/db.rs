//! Opening the SQLite store: pragmas, schema migrations and error classification.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::error::{Result, StoreError};

/// Append-only: a released migration is never edited, only followed by a new one.
/// The index + 1 of each entry is the `PRAGMA user_version` it leaves behind.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: jobs, their processes, artifacts and the files each job touched.
    r#"
    CREATE TABLE jobs (
        id          INTEGER PRIMARY KEY,
        name        TEXT,
        argv        BLOB NOT NULL,           -- NUL-separated, exact bytes
        cwd         BLOB NOT NULL,
        started_ns  INTEGER NOT NULL,
        ended_ns    INTEGER,
        status      TEXT NOT NULL,           -- running | exited | signaled | failed_to_start
        exit_code   INTEGER,
        signal      INTEGER,
        incomplete  INTEGER NOT NULL DEFAULT 0,
        backend     TEXT NOT NULL,
        git_commit  TEXT,
        git_branch  TEXT,
        git_dirty   INTEGER,
        env         TEXT NOT NULL DEFAULT '{}',  -- JSON object, secrets redacted
        host        TEXT
    );
    CREATE TABLE processes (
        id          INTEGER PRIMARY KEY,
        job_id      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        pid         INTEGER NOT NULL,
        parent_pid  INTEGER,
        exe         BLOB,
        argv        BLOB,
        started_ns  INTEGER,
        ended_ns    INTEGER
    );
    CREATE INDEX processes_job ON processes(job_id);
    CREATE TABLE artifacts (
        id      INTEGER PRIMARY KEY,
        blake3  TEXT NOT NULL UNIQUE,
        sha256  TEXT,
        size    INTEGER NOT NULL
    );
    CREATE TABLE s3_objects (
        id          INTEGER PRIMARY KEY,
        bucket      TEXT NOT NULL,
        key         TEXT NOT NULL,
        version_id  TEXT,
        etag        TEXT,
        artifact_id INTEGER REFERENCES artifacts(id)
    );
    CREATE TABLE job_files (
        id                 INTEGER PRIMARY KEY,
        job_id             INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        role               TEXT NOT NULL CHECK (role IN ('input', 'output', 'temp')),
        kind               TEXT NOT NULL CHECK (kind IN ('file', 's3')),
        path               BLOB NOT NULL,    -- absolute path, or s3://bucket/key
        artifact_id        INTEGER REFERENCES artifacts(id),
        before_artifact_id INTEGER REFERENCES artifacts(id),
        s3_object_id       INTEGER REFERENCES s3_objects(id),
        ops                TEXT NOT NULL,    -- comma list: read,write,create,truncate,rename,unlink
        first_ns           INTEGER,
        last_ns            INTEGER
    );
    CREATE INDEX job_files_job ON job_files(job_id);
    CREATE INDEX job_files_artifact ON job_files(artifact_id);
    CREATE INDEX job_files_path ON job_files(path);
    "#,
    // 2: the hash cache, keyed by inode and validated by size and timestamps.
    r#"
    CREATE TABLE hash_cache (
        dev        INTEGER NOT NULL,
        ino        INTEGER NOT NULL,
        size       INTEGER NOT NULL,
        mtime_ns   INTEGER NOT NULL,
        ctime_ns   INTEGER NOT NULL,
        blake3     TEXT NOT NULL,
        sha256     TEXT,
        hashed_ns  INTEGER NOT NULL,
        PRIMARY KEY (dev, ino)
    ) WITHOUT ROWID;
    "#,
    // 3: "which job last wrote this content before job N" is the step of every lineage walk; with
    // only (artifact_id), a dataset read by 10k jobs made each lookup scan 10k rows.
    r#"
    CREATE INDEX job_files_producer ON job_files(artifact_id, role, job_id);
    DROP INDEX job_files_artifact;
    "#,
    // 4: the gateway records an object's size and the range a ranged read got, and looks up the
    // hash of an object version it has seen before by (bucket, key, ETag).
    r#"
    ALTER TABLE s3_objects ADD COLUMN size INTEGER;
    ALTER TABLE s3_objects ADD COLUMN range TEXT;
    CREATE INDEX s3_objects_version ON s3_objects(bucket, key, etag);
    "#,
    // 5: `role IN ('input', 'output', 'temp')` made SQLite build a temporary index for the list on
    // every row inserted (a tenth of the cost of recording a file); the same check as comparisons.
    // SQLite cannot alter a CHECK, so the table is rebuilt (nothing references job_files).
    r#"
    CREATE TABLE job_files_v5 (
        id                 INTEGER PRIMARY KEY,
        job_id             INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        role               TEXT NOT NULL
                           CHECK (role = 'input' OR role = 'output' OR role = 'temp'),
        kind               TEXT NOT NULL CHECK (kind = 'file' OR kind = 's3'),
        path               BLOB NOT NULL,    -- absolute path, or s3://bucket/key
        artifact_id        INTEGER REFERENCES artifacts(id),
        before_artifact_id INTEGER REFERENCES artifacts(id),
        s3_object_id       INTEGER REFERENCES s3_objects(id),
        ops                TEXT NOT NULL,    -- comma list: read,write,create,truncate,rename,unlink
        first_ns           INTEGER,
        last_ns            INTEGER
    );
    INSERT INTO job_files_v5 (id, job_id, role, kind, path, artifact_id, before_artifact_id,
                              s3_object_id, ops, first_ns, last_ns)
        SELECT id, job_id, role, kind, path, artifact_id, before_artifact_id,
               s3_object_id, ops, first_ns, last_ns FROM job_files;
    DROP TABLE job_files;
    ALTER TABLE job_files_v5 RENAME TO job_files;
    CREATE INDEX job_files_job ON job_files(job_id);
    CREATE INDEX job_files_path ON job_files(path);
    CREATE INDEX job_files_producer ON job_files(artifact_id, role, job_id);
    "#,
    // 6: a lineage node is a file version, (location, content): the producer of an input is the
    // last job that wrote that path with that content, looked up by (path, role, artifact_id). The
    // index also serves every lookup by path alone, so the path-only index goes.
    r#"
    CREATE INDEX job_files_version ON job_files(path, role, artifact_id);
    DROP INDEX job_files_path;
    "#,
    // 7: a job's row is written when it starts (status `running`) and completed when it ends;
    // `recorder` names the process recording it (`pid:start time`), so a row whose recorder died
    // (roar killed) reads as killed instead of running forever.
    r#"
    ALTER TABLE jobs ADD COLUMN recorder TEXT;
    "#,
    // 8: the environment (crate::environment): packages a job used, the machine, the exact code
    // (remote, and a dirty tree's diff as a content-addressed blob).
    r#"
    ALTER TABLE jobs ADD COLUMN git_remote TEXT;
    ALTER TABLE jobs ADD COLUMN git_diff TEXT;       -- blake3 of the diff in blobs
    ALTER TABLE jobs ADD COLUMN runtime_id INTEGER;  -- runtimes.id (never deleted)
    CREATE TABLE blobs (
        blake3  TEXT PRIMARY KEY,
        data    BLOB NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE runtimes (
        id       INTEGER PRIMARY KEY,
        digest   TEXT NOT NULL UNIQUE,               -- blake3 of info
        info     TEXT NOT NULL                       -- JSON
    );
    CREATE TABLE packages (
        id         INTEGER PRIMARY KEY,
        kind       TEXT NOT NULL,                    -- python | dpkg | interpreter
        name       TEXT NOT NULL,
        version    TEXT NOT NULL,
        installer  TEXT,
        location   TEXT NOT NULL DEFAULT '',
        commit_id  TEXT NOT NULL DEFAULT '',
        UNIQUE (kind, name, version, location, commit_id)
    );
    CREATE TABLE job_packages (
        job_id      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        package_id  INTEGER NOT NULL REFERENCES packages(id),
        PRIMARY KEY (job_id, package_id)
    ) WITHOUT ROWID;
    "#,
    // 9: steps inside a job (model::StepRecord). A step is named by its job and its number in
    // the job (`seq`), so a job's global identity is enough to name its steps in a shared store.
    // A step's file holds no content of its own: `content` says which of the job's records for
    // the path (input: prior, output: final) has it.
    r#"
    CREATE TABLE steps (
        id          INTEGER PRIMARY KEY,
        job_id      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        seq         INTEGER NOT NULL,
        parent_seq  INTEGER,
        pid         INTEGER NOT NULL,
        exe         BLOB,
        argv        BLOB NOT NULL,
        cwd         BLOB NOT NULL,
        started_ns  INTEGER,
        ended_ns    INTEGER,
        stdin       BLOB,                    -- a redirection's path, for each standard stream
        stdout      BLOB,
        stderr      BLOB,
        appends     INTEGER NOT NULL DEFAULT 0,  -- 1: stdout is `>>`; 2: stderr is
        UNIQUE (job_id, seq)
    );
    CREATE TABLE step_files (
        step_id     INTEGER NOT NULL REFERENCES steps(id) ON DELETE CASCADE,
        role        TEXT NOT NULL CHECK (role = 'input' OR role = 'output' OR role = 'temp'),
        path        BLOB NOT NULL,
        ops         TEXT NOT NULL,
        from_seq    INTEGER,                 -- input: the step of the same job that wrote it
        content     TEXT NOT NULL CHECK (content = 'prior' OR content = 'final' OR content = 'unknown'),
        first_ns    INTEGER,
        last_ns     INTEGER
    );
    CREATE INDEX step_files_step ON step_files(step_id);
    CREATE INDEX step_files_path ON step_files(path, role);
    "#,
    // 10: the team store (the roar-team crate). Every job gets a global identity, `uid`, made here for
    // the jobs recorded so far; a job copied from the team store keeps its own. A distributed
    // run's jobs name their group and rank (model::Distributed). `pushed` lists the jobs each
    // remote (by its URL without credentials) already holds; `fetched` is how far a remote's
    // mirror has read the team store's jobs (the transaction-id horizon of its last read).
    r#"
    ALTER TABLE jobs ADD COLUMN uid TEXT;
    UPDATE jobs SET uid = lower(hex(randomblob(16)));
    CREATE UNIQUE INDEX jobs_uid ON jobs(uid);
    ALTER TABLE jobs ADD COLUMN run_group TEXT;
    ALTER TABLE jobs ADD COLUMN rank INTEGER;
    ALTER TABLE jobs ADD COLUMN world_size INTEGER;
    ALTER TABLE jobs ADD COLUMN local_rank INTEGER;
    ALTER TABLE jobs ADD COLUMN node_rank INTEGER;
    CREATE INDEX jobs_group ON jobs(run_group) WHERE run_group IS NOT NULL;
    CREATE TABLE pushed (
        remote   TEXT NOT NULL,
        job_uid  TEXT NOT NULL,
        PRIMARY KEY (remote, job_uid)
    ) WITHOUT ROWID;
    CREATE TABLE fetched (
        remote       TEXT PRIMARY KEY,
        xid_horizon  INTEGER NOT NULL   -- team::read::horizon at the last read
    );
    "#,
    // 11: jobs are listed in the order they started. Ids are given as rows are written, and two
    // jobs that start within milliseconds (a `roar run` nested in another, two terminals at
    // once) may have their rows written in either order.
    r#"
    CREATE INDEX jobs_started ON jobs(started_ns, id);
    "#,
    // 12: labels people put on jobs (`roar label`, `roar run --label`), and roar's own under
    // `roar.` (`roar.rerun_of`: the job `roar run @N` ran again). Not part of what was observed:
    // set and removed at any time.
    r#"
    CREATE TABLE labels (
        job_id  INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        key     TEXT NOT NULL,
        value   TEXT NOT NULL,
        PRIMARY KEY (job_id, key)
    ) WITHOUT ROWID;
    CREATE INDEX labels_key ON labels(key, value);
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Opens (creating if `create`) the store at `path`, sets the pragmas every
/// connection needs and brings the schema up to date.
pub fn open(path: &Path, create: bool) -> Result<Connection> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
        // A failure (a read-only directory, say) is left to SQLite to report.
        let _ = crate::private::create_file(path);
    }
    crate::private::narrow(path);
    let conn = Connection::open_with_flags(path, flags).map_err(|e| classify(path, e))?;
    // Refuse a newer or foreign database before anything (even the WAL switch) writes to it.
    check_version(&conn, path)?;
    configure(&conn).map_err(|e| classify(path, e))?;
    migrate(&conn, path, MIGRATIONS.len())?;
    Ok(conn)
}

/// Another connection to a store already open (its schema checked, its WAL set up by the
/// first): only what reading needs.
pub(crate) fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    configure_reading(&conn)?;
    Ok(conn)
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    configure_reading(conn)?;
    // journal_mode answers with a row, so it is read rather than executed.
    let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.execute_batch(
        "PRAGMA synchronous = NORMAL;
         PRAGMA foreign_keys = ON;",
    )
}

/// What every connection to a store needs, the first one and a lineage's extra readers alike.
fn configure_reading(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(Duration::from_secs(30))?;
    // Every roar process is usually the store's only connection: without this, each one would
    // checkpoint the WAL into the database (with an fsync) and delete it when it exits. Writers
    // truncate the WAL once it is big (see `writer::Checkpoints`).
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )?;
    // Plans never depend on the values bound: otherwise SQLite (built with STAT4) marks a
    // statement to be prepared again at every new value bound to a parameter compared with an
    // indexed column, and a lineage walk, which runs the same few statements thousands of times,
    // spent 39 % of its time re-preparing them (perf, bench/team.sh: 7,512 re-prepares in one
    // `roar lineage`). Without statistics tables the plans are the same.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    conn.execute_batch(
        "PRAGMA temp_store = MEMORY;
         -- Index lookups on a store with millions of rows: keep more pages than the default 2 MiB.
         PRAGMA cache_size = -65536;",
    )
}

/// Applies migrations until the database is at version `target`.
/// Exposed to tests through [`crate::testing`] to build databases of an older schema.
fn check_version(conn: &Connection, path: &Path) -> Result<i64> {
    let version = user_version(conn).map_err(|e| classify(path, e))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(version)
}

pub(crate) fn migrate(conn: &Connection, path: &Path, target: usize) -> Result<()> {
    let version = check_version(conn, path)?;
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .take(target)
        .skip(version as usize)
    {
        let step = || -> rusqlite::Result<()> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let applied = conn
                .execute_batch(sql)
                .and_then(|()| conn.pragma_update(None, "user_version", (i + 1) as i64));
            match applied {
                Ok(()) => conn.execute_batch("COMMIT"),
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    Err(e)
                }
            }
        };
        // Another process may have migrated between our read and our lock.
        if user_version(conn).map_err(|e| classify(path, e))? > i as i64 {
            continue;
        }
        step().map_err(|e| classify(path, e))?;
    }
    Ok(())
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

/// Turns a raw SQLite error into the store error a user can act on.
pub(crate) fn classify(path: &Path, e: rusqlite::Error) -> StoreError {
    StoreError::sqlite(path, e)
}
