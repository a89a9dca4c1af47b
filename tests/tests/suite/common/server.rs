//! Servers the tests start: a child process that prints its endpoint on stdout before it serves,
//! killed on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A process printing one line (an endpoint) on stdout before it serves; killed on drop.
pub struct Server {
    child: Child,
    /// The first line the server printed.
    pub line: String,
    log: PathBuf,
}

impl Server {
    pub fn spawn(mut cmd: Command, log: PathBuf) -> Server {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            !line.is_empty(),
            "server exited before it was ready: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Server { child, line, log }
    }

    /// A server that prints nothing to wait for (the caller knows when it is ready), its stderr
    /// in `log`.
    pub fn adopt(child: Child, log: PathBuf) -> Server {
        Server {
            child,
            line: String::new(),
            log,
        }
    }

    /// The endpoint URL in the first line (`http://…`, alone or as AWS_ENDPOINT_URL=…).
    pub fn endpoint(&self) -> String {
        let start = self.line.find("http://").expect("an endpoint URL");
        self.line[start..]
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    }

    /// SIGTERM, then the exit status and everything the server wrote on stderr.
    pub fn stop(mut self) -> (std::process::ExitStatus, String) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let status = self.child.wait().unwrap();
        (
            status,
            std::fs::read_to_string(&self.log).unwrap_or_default(),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// versitygw, as `scripts/setup.sh` installs it (go install into ~/.cache/roar-s3bin).
pub fn versitygw() -> Option<PathBuf> {
    let path = std::env::var_os("ROAR_VERSITYGW").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/roar-s3bin/versitygw")
        },
        PathBuf::from,
    );
    if path.exists() {
        return Some(path);
    }
    super::skip(&format!(
        "no versitygw at {} (scripts/setup.sh installs it)",
        path.display()
    ));
    None
}

/// versitygw's posix backend on `dir` with versioning; waits until it answers.
pub fn start_versitygw(bin: &Path, dir: &Path, access: &str, secret: &str) -> (Server, String) {
    start_versitygw_with(bin, dir, access, secret, &[])
}

/// The same with users of its own (its internal IAM in `dir/iam`; `access` is the root's key,
/// which creates users with `versitygw admin`).
pub fn start_versitygw_iam(bin: &Path, dir: &Path, access: &str, secret: &str) -> (Server, String) {
    let iam = dir.join("iam");
    std::fs::create_dir_all(&iam).unwrap();
    start_versitygw_with(
        bin,
        dir,
        access,
        secret,
        &["--iam-dir", iam.to_str().unwrap()],
    )
}

fn start_versitygw_with(
    bin: &Path,
    dir: &Path,
    access: &str,
    secret: &str,
    global: &[&str],
) -> (Server, String) {
    let (root, versions) = (dir.join("root"), dir.join("versions"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&versions).unwrap();
    let port = super::free_port();
    let child = Command::new(bin)
        .args(["--access", access, "--secret", secret])
        .args(global)
        .args([
            "--port",
            &format!("127.0.0.1:{port}"),
            "posix",
            "--versioning-dir",
        ])
        .arg(&versions)
        .arg(&root)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("versitygw.log")).unwrap())
        .spawn()
        .unwrap();
    let running = Server::adopt(child, dir.join("versitygw.log"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "versitygw did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (running, format!("http://127.0.0.1:{port}"))
}
