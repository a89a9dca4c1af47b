//! The team store's tables in PostgreSQL and their migrations: append-only, applied under an
//! advisory lock so that concurrent first pushes set the schema up once.

/// Append-only, like the SQLite migrations; `roar_schema.version` is how many are applied.
/// Public so that a test can make a team store of an older schema.
pub const MIGRATIONS: &[&str] = &[
    // 1: the first team store.
    r#"
    CREATE TABLE jobs (
        seq          BIGSERIAL PRIMARY KEY,
        uid          TEXT NOT NULL UNIQUE,
        xid          XID8 NOT NULL DEFAULT pg_current_xact_id(),
        pushed_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
        pushed_from  TEXT,
        name         TEXT,
        argv         BYTEA NOT NULL,
        cwd          BYTEA NOT NULL,
        started_ns   BIGINT NOT NULL,
        ended_ns     BIGINT,
        status       TEXT NOT NULL,
        exit_code    INT,
        signal       INT,
        incomplete   BOOLEAN NOT NULL,
        backend      TEXT NOT NULL,
        git_commit   TEXT,
        git_branch   TEXT,
        git_dirty    BOOLEAN,
        git_remote   TEXT,
        git_diff     TEXT,
        env          TEXT NOT NULL,
        host         TEXT,
        runtime      TEXT,
        run_group    TEXT,
        rank         INT,
        world_size   INT,
        local_rank   INT,
        node_rank    INT
    );
    CREATE INDEX jobs_xid ON jobs (xid);
    CREATE INDEX jobs_group ON jobs (run_group) WHERE run_group IS NOT NULL;
    CREATE TABLE artifacts (
        blake3  TEXT PRIMARY KEY,
        sha256  TEXT,
        size    BIGINT NOT NULL
    );
    CREATE TABLE blobs (
        blake3  TEXT PRIMARY KEY,
        data    BYTEA NOT NULL
    );
    CREATE TABLE processes (
        job_seq     BIGINT NOT NULL REFERENCES jobs (seq) ON DELETE CASCADE,
        ord         INT NOT NULL,
        pid         INT NOT NULL,
        parent_pid  INT,
        exe         BYTEA,
        argv        BYTEA NOT NULL,
        started_ns  BIGINT,
        ended_ns    BIGINT,
        PRIMARY KEY (job_seq, ord)
    );
    CREATE TABLE job_files (
        job_seq        BIGINT NOT NULL REFERENCES jobs (seq) ON DELETE CASCADE,
        ord            INT NOT NULL,
        role           TEXT NOT NULL CHECK (role IN ('input', 'output', 'temp')),
        path           BYTEA NOT NULL,
        blake3         TEXT REFERENCES artifacts (blake3),
        before_blake3  TEXT REFERENCES artifacts (blake3),
        ops            TEXT NOT NULL,
        first_ns       BIGINT,
        last_ns        BIGINT,
        s3_bucket      TEXT,
        s3_key         TEXT,
        s3_version_id  TEXT,
        s3_etag        TEXT,
        s3_size        BIGINT,
        s3_range       TEXT,
        PRIMARY KEY (job_seq, ord)
    );
    CREATE INDEX job_files_version ON job_files (path, role, blake3);
    CREATE INDEX job_files_producer ON job_files (blake3, role);
    CREATE TABLE steps (
        job_seq     BIGINT NOT NULL REFERENCES jobs (seq) ON DELETE CASCADE,
        seq         INT NOT NULL,
        parent_seq  INT,
        pid         INT NOT NULL,
        exe         BYTEA,
        argv        BYTEA NOT NULL,
        cwd         BYTEA NOT NULL,
        started_ns  BIGINT,
        ended_ns    BIGINT,
        stdin       BYTEA,
        stdout      BYTEA,
        stderr      BYTEA,
        appends     INT NOT NULL,
        PRIMARY KEY (job_seq, seq)
    );
    CREATE TABLE step_files (
        job_seq   BIGINT NOT NULL,
        step_seq  INT NOT NULL,
        ord       INT NOT NULL,
        role      TEXT NOT NULL,
        path      BYTEA NOT NULL,
        ops       TEXT NOT NULL,
        from_seq  INT,
        content   TEXT NOT NULL,
        first_ns  BIGINT,
        last_ns   BIGINT,
        PRIMARY KEY (job_seq, step_seq, ord),
        FOREIGN KEY (job_seq, step_seq) REFERENCES steps (job_seq, seq) ON DELETE CASCADE
    );
    CREATE TABLE packages (
        id         BIGSERIAL PRIMARY KEY,
        kind       TEXT NOT NULL,
        name       TEXT NOT NULL,
        version    TEXT NOT NULL,
        installer  TEXT,
        location   TEXT NOT NULL,
        commit_id  TEXT NOT NULL,
        UNIQUE (kind, name, version, location, commit_id)
    );
    CREATE TABLE job_packages (
        job_seq     BIGINT NOT NULL REFERENCES jobs (seq) ON DELETE CASCADE,
        package_id  BIGINT NOT NULL REFERENCES packages (id),
        PRIMARY KEY (job_seq, package_id)
    );
    "#,
    // 2 (issue 66): file records coded against dictionaries of paths and contents, and without
    // the two indexes by path and by content. The team store is only ever read by job
    // (read.rs): `--remote` queries answer from the mirror, which has its own. At fleet scale
    // this took a file record from 374 to the bytes bench/team.sh reports, and pushes from the
    // index upkeep of two wide keys. The ops bits are the store's (`Ops`), fixed here.
    r#"
    DROP INDEX job_files_version;
    DROP INDEX job_files_producer;
    CREATE TABLE paths (
        id    BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        path  BYTEA NOT NULL UNIQUE
    );
    INSERT INTO paths (path) SELECT DISTINCT path FROM job_files ORDER BY 1;
    ALTER TABLE artifacts ADD COLUMN id BIGINT GENERATED BY DEFAULT AS IDENTITY;
    ALTER TABLE artifacts ADD CONSTRAINT artifacts_id UNIQUE (id);
    ALTER TABLE job_files RENAME TO job_files_v1;
    ALTER TABLE job_files_v1 RENAME CONSTRAINT job_files_pkey TO job_files_v1_pkey;
    -- No foreign keys: a job's file records are written in the transaction that writes the job,
    -- with the seq its insert returned, and their paths and contents after the dictionaries
    -- (write.rs); the checks cost a fifth of a push (bench/NOTES.md).
    CREATE TABLE job_files (
        job_seq        BIGINT NOT NULL,
        path_id        BIGINT NOT NULL,
        content_id     BIGINT,
        before_id      BIGINT,
        first_ns       BIGINT,
        last_ns        BIGINT,
        ord            INT NOT NULL,
        ops            SMALLINT NOT NULL,
        role           "char" NOT NULL CHECK (role IN ('i', 'o', 't')),
        s3_bucket      TEXT,
        s3_key         TEXT,
        s3_version_id  TEXT,
        s3_etag        TEXT,
        s3_size        BIGINT,
        s3_range       TEXT,
        PRIMARY KEY (job_seq, ord)
    );
    INSERT INTO job_files
    SELECT f.job_seq, p.id, a.id, b.id, f.first_ns, f.last_ns, f.ord,
           (SELECT coalesce(sum(n.bit), 0)
            FROM unnest(string_to_array(f.ops, ',')) AS w (name)
            JOIN (VALUES ('read', 1), ('write', 2), ('create', 4), ('truncate', 8),
                         ('rename', 16), ('unlink', 32)) AS n (name, bit) USING (name))::smallint,
           left(f.role, 1)::"char", f.s3_bucket, f.s3_key, f.s3_version_id, f.s3_etag,
           f.s3_size, f.s3_range
    FROM job_files_v1 f
    JOIN paths p ON p.path = f.path
    LEFT JOIN artifacts a ON a.blake3 = f.blake3
    LEFT JOIN artifacts b ON b.blake3 = f.before_blake3;
    DROP TABLE job_files_v1;
    "#,
];

/// Any number: the advisory lock that makes concurrent first pushes migrate one at a time.
const MIGRATION_LOCK: i64 = 0x726f_6172_7465_616d; // "roarteam"

/// Brings the team store's schema up to date; refuses one written by a newer roar.
pub(crate) fn migrate(client: &mut postgres::Client) -> Result<(), postgres::Error> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS roar_schema (version INT NOT NULL)")?;
    let version: i32 = match tx.query_opt("SELECT version FROM roar_schema", &[])? {
        Some(row) => row.get(0),
        None => {
            tx.execute("INSERT INTO roar_schema VALUES (0)", &[])?;
            0
        }
    };
    for sql in MIGRATIONS.iter().skip(version as usize) {
        tx.batch_execute(sql)?;
    }
    let newest = MIGRATIONS.len() as i32;
    if version < newest {
        tx.execute("UPDATE roar_schema SET version = $1", &[&newest])?;
    }
    tx.commit()?;
    Ok(())
}

/// The team store's schema version (to refuse a newer one before writing).
pub(crate) fn schema_version(client: &mut postgres::Client) -> Result<i32, postgres::Error> {
    let exists: bool = client
        .query_one("SELECT to_regclass('roar_schema') IS NOT NULL", &[])?
        .get(0);
    if !exists {
        return Ok(0);
    }
    Ok(client
        .query_opt("SELECT version FROM roar_schema", &[])?
        .map_or(0, |r| r.get(0)))
}

pub(crate) const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;
