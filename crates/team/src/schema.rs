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
    // 3 (issue 66): a job's file records as one row of arrays, one array per field in the
    // job's order, each record's path and contents in it (blake3 and sha256 as their 32 bytes).
    // The team store reads file records only by job (read.rs), so a row per record, and the
    // dictionaries of paths and contents schema 2 coded them against, bought nothing but their
    // upkeep: per record a tuple and an index entry, per new path or content a lookup and three
    // index entries -- 70 % of a push's time in PostgreSQL at fleet scale (bench/NOTES.md). The
    // few S3 records keep their object fields in a table of their own, by position. The view
    // `job_files` shows one row per record, for anyone's SQL.
    r#"
    CREATE TABLE job_file_lists (
        job_seq         BIGINT PRIMARY KEY,
        paths           BYTEA[] NOT NULL,
        roles           "char"[] NOT NULL CHECK (roles <@ '{i,o,t}'::"char"[]),
        ops             SMALLINT[] NOT NULL,
        blake3          BYTEA[] NOT NULL,
        sha256          BYTEA[] NOT NULL,
        sizes           BIGINT[] NOT NULL,
        before_blake3   BYTEA[] NOT NULL,
        before_sha256   BYTEA[] NOT NULL,
        before_sizes    BIGINT[] NOT NULL,
        first_ns        BIGINT[] NOT NULL,
        last_ns         BIGINT[] NOT NULL,
        CHECK (cardinality(roles) = cardinality(paths)
               AND cardinality(ops) = cardinality(paths)
               AND cardinality(blake3) = cardinality(paths)
               AND cardinality(sha256) = cardinality(paths)
               AND cardinality(sizes) = cardinality(paths)
               AND cardinality(before_blake3) = cardinality(paths)
               AND cardinality(before_sha256) = cardinality(paths)
               AND cardinality(before_sizes) = cardinality(paths)
               AND cardinality(first_ns) = cardinality(paths)
               AND cardinality(last_ns) = cardinality(paths))
    );
    -- Compressed and kept in the row where it fits a page: out of line only as a last resort.
    ALTER TABLE job_file_lists
        ALTER paths SET STORAGE MAIN, ALTER roles SET STORAGE MAIN, ALTER ops SET STORAGE MAIN,
        ALTER blake3 SET STORAGE MAIN, ALTER sha256 SET STORAGE MAIN,
        ALTER sizes SET STORAGE MAIN, ALTER before_blake3 SET STORAGE MAIN,
        ALTER before_sha256 SET STORAGE MAIN, ALTER before_sizes SET STORAGE MAIN,
        ALTER first_ns SET STORAGE MAIN, ALTER last_ns SET STORAGE MAIN;
    -- LZ4 where the server has it: pglz took a third of PostgreSQL's time in a push.
    DO $$
    BEGIN
        EXECUTE 'ALTER TABLE job_file_lists
            ALTER paths SET COMPRESSION lz4, ALTER roles SET COMPRESSION lz4,
            ALTER ops SET COMPRESSION lz4, ALTER blake3 SET COMPRESSION lz4,
            ALTER sha256 SET COMPRESSION lz4, ALTER sizes SET COMPRESSION lz4,
            ALTER before_blake3 SET COMPRESSION lz4, ALTER before_sha256 SET COMPRESSION lz4,
            ALTER before_sizes SET COMPRESSION lz4, ALTER first_ns SET COMPRESSION lz4,
            ALTER last_ns SET COMPRESSION lz4';
    EXCEPTION WHEN feature_not_supported OR syntax_error THEN
        NULL;
    END
    $$;
    CREATE TABLE job_file_s3 (
        job_seq     BIGINT NOT NULL,
        ord         INT NOT NULL,
        bucket      TEXT NOT NULL,
        key         TEXT,
        version_id  TEXT,
        etag        TEXT,
        size        BIGINT,
        range       TEXT,
        PRIMARY KEY (job_seq, ord)
    );
    INSERT INTO job_file_lists
    SELECT f.job_seq, array_agg(p.path ORDER BY f.ord), array_agg(f.role ORDER BY f.ord),
           array_agg(f.ops ORDER BY f.ord),
           array_agg(decode(a.blake3, 'hex') ORDER BY f.ord),
           array_agg(decode(a.sha256, 'hex') ORDER BY f.ord), array_agg(a.size ORDER BY f.ord),
           array_agg(decode(b.blake3, 'hex') ORDER BY f.ord),
           array_agg(decode(b.sha256, 'hex') ORDER BY f.ord), array_agg(b.size ORDER BY f.ord),
           array_agg(f.first_ns ORDER BY f.ord), array_agg(f.last_ns ORDER BY f.ord)
    FROM job_files f
    JOIN paths p ON p.id = f.path_id
    LEFT JOIN artifacts a ON a.id = f.content_id
    LEFT JOIN artifacts b ON b.id = f.before_id
    GROUP BY f.job_seq;
    INSERT INTO job_file_s3
    SELECT job_seq, ord, s3_bucket, s3_key, s3_version_id, s3_etag, s3_size, s3_range
    FROM job_files WHERE s3_bucket IS NOT NULL;
    DROP TABLE job_files;
    DROP TABLE paths;
    DROP TABLE artifacts;
    CREATE VIEW job_files AS
    SELECT l.job_seq, (f.n - 1)::int AS ord, f.role, f.path, encode(f.blake3, 'hex') AS blake3,
           encode(f.sha256, 'hex') AS sha256, f.size,
           encode(f.before_blake3, 'hex') AS before_blake3,
           encode(f.before_sha256, 'hex') AS before_sha256, f.before_size, f.ops, f.first_ns,
           f.last_ns, s.bucket AS s3_bucket, s.key AS s3_key, s.version_id AS s3_version_id,
           s.etag AS s3_etag, s.size AS s3_size, s.range AS s3_range
    FROM job_file_lists l
    CROSS JOIN LATERAL unnest(l.paths, l.roles, l.ops, l.blake3, l.sha256, l.sizes,
                              l.before_blake3, l.before_sha256, l.before_sizes, l.first_ns,
                              l.last_ns)
         WITH ORDINALITY AS f (path, role, ops, blake3, sha256, size, before_blake3,
                               before_sha256, before_size, first_ns, last_ns, n)
    LEFT JOIN job_file_s3 s ON s.job_seq = l.job_seq AND s.ord = f.n - 1;
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
