//! A real PostgreSQL server for a test: the distribution's binaries, a data directory of its own,
//! listening on 127.0.0.1 on a free port (and a socket in its directory), stopped on drop. Never
//! the system service. As root (CI), the server runs as the `postgres` user, as initdb requires.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    as_user: Option<String>,
    running: bool,
    /// Plain TCP refused: psql goes through TLS too.
    tls_only: bool,
}

/// The newest installed server's bin directory (`/usr/lib/postgresql/N/bin`).
fn server_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

impl Postgres {
    /// A fresh server with an empty database `team` (user `roar`, trusted on loopback); None
    /// (skipped loudly) where PostgreSQL is not installed, a failure under CI=true.
    pub fn start() -> Option<Postgres> {
        let Some(bin) = server_bin() else {
            super::skip("PostgreSQL is not installed (scripts/setup.sh installs it)");
            return None;
        };
        // SAFETY: geteuid takes nothing and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::Builder::new()
            .prefix("roar-pg-")
            .tempdir()
            .unwrap();
        let as_user = root.then(|| "postgres".to_owned());
        if root {
            let ok = Command::new("chown")
                .args(["postgres:postgres", dir.path().to_str().unwrap()])
                .status()
                .unwrap()
                .success();
            assert!(
                ok,
                "cannot hand {} to the postgres user",
                dir.path().display()
            );
        }
        let mut pg = Postgres {
            dir,
            bin,
            port: super::free_port(),
            as_user,
            running: false,
            tls_only: false,
        };
        let data = pg.data();
        pg.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "roar",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        pg.start_again();
        let ok = Command::new(pg.bin.join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &pg.port.to_string(),
                "-U",
                "roar",
                "team",
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok, "createdb failed: {}", pg.log());
        Some(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// A server tool, run as the server's user.
    fn command(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        let mut cmd = match &self.as_user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.current_dir(self.dir.path());
        cmd
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let out = self.command(tool).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// Starts the server (again, after [`Postgres::stop_now`]) on the same port and data.
    pub fn start_again(&mut self) {
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c max_connections=100",
            self.port,
            self.dir.path().display()
        );
        let data = self.data();
        let log = self.dir.path().join("log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        );
        self.running = true;
    }

    /// Stops the server at once (`immediate`: connections are cut, as a crash would).
    pub fn stop_now(&mut self) {
        let data = self.data();
        self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
        self.running = false;
    }

    /// The URL `roar remote add` takes (no password: trust on loopback).
    pub fn url(&self) -> String {
        format!("postgres://roar@127.0.0.1:{}/team", self.port)
    }

    fn psql(&self) -> Command {
        let mut c = Command::new(self.bin.join("psql"));
        c.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "roar",
            "-d",
            "team",
        ]);
        if self.tls_only {
            c.env("PGSSLMODE", "require");
        }
        c
    }

    /// Serves TLS with a certificate for 127.0.0.1 from a CA made here, and refuses plain TCP
    /// from then on; returns the CA's certificate file.
    pub fn require_tls(&mut self) -> PathBuf {
        let d = self.dir.path().join("tls");
        std::fs::create_dir_all(&d).unwrap();
        let sh = |script: &str| {
            let out = Command::new("sh")
                .args(["-ec", script])
                .current_dir(&d)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{script}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        sh(
            "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
              -subj /CN=roar-test-ca 2>/dev/null
            openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
              -subj /CN=127.0.0.1 2>/dev/null
            printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > ext.cnf
            openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
              -out server.crt -days 2 -extfile ext.cnf 2>/dev/null",
        );
        let data = self.data();
        for f in ["server.crt", "server.key"] {
            std::fs::copy(d.join(f), data.join(f)).unwrap();
        }
        let owner = self.as_user.clone().unwrap_or_else(|| "root".into());
        sh(&format!(
            "chown {owner} {data}/server.crt {data}/server.key && chmod 600 {data}/server.key",
            data = data.display()
        ));
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text.push_str("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        std::fs::write(&conf, text).unwrap();
        let hba = data.join("pg_hba.conf");
        let text = std::fs::read_to_string(&hba).unwrap();
        std::fs::write(
            &hba,
            format!("hostnossl all all 127.0.0.1/32 reject\n{text}"),
        )
        .unwrap();
        self.stop_now();
        self.start_again();
        self.tls_only = true;
        d.join("ca.crt")
    }

    /// One value per line of `sql`'s result, through psql.
    pub fn query(&self, sql: &str) -> Vec<String> {
        let out = self
            .psql()
            .args(["-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.query(sql)[0].parse().unwrap()
    }

    /// [`Postgres::count`], or None if the query fails (a table not made yet).
    pub fn try_count(&self, sql: &str) -> Option<i64> {
        let out = self.psql().args(["-At", "-c", sql]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.running {
            let data = self.data();
            let _ = self
                .command("pg_ctl")
                .args([
                    "-D",
                    data.to_str().unwrap(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ])
                .output();
        }
    }
}
