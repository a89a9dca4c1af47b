//! Servers the tests start: a child process that prints its endpoint on stdout before it serves,
//! killed on drop.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
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
