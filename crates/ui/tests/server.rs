//! The server of `roar ui` over HTTP, with answers of the test's own: the token is required on
//! every path, only reads are served, each kind of API error is its status, and a change of the
//! watched revision reaches an open event stream.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roar_ui::{Answers, ApiError, Params, Server};

struct Echo;

impl Answers for Echo {
    fn answer(&self, path: &str, params: &Params) -> Result<Vec<u8>, ApiError> {
        match path {
            "/api/bad" => Err(ApiError::BadRequest("bad request here".into())),
            "/api/missing" => Err(ApiError::NotFound("nothing here".into())),
            "/api/broken" => Err(ApiError::Internal("broken here".into())),
            _ => Ok(format!("{path} a={:?}", params.get("a")).into_bytes()),
        }
    }
}

/// The server on a free port, serving on a thread of its own; its port, token and the revision
/// it watches.
fn start() -> (u16, String, Arc<AtomicU64>) {
    let config = roar_ui::page::Config {
        mode: "server",
        root: "/p",
        collapse_at: 6,
        generated_ns: None,
    };
    let server = Server::bind(0, &config).unwrap();
    let (port, url) = (server.port(), server.url());
    let token = url.split_once("?token=").unwrap().1.to_owned();
    let revision = Arc::new(AtomicU64::new(0));
    let watched = revision.clone();
    std::thread::spawn(move || server.run(Echo, move || Some(watched.load(Ordering::SeqCst))));
    (port, token, revision)
}

/// One request on a fresh connection: the status code and the whole response.
fn request(port: u16, method: &str, target: &str, headers: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {out:?}"));
    (status, out)
}

#[test]
fn every_path_needs_the_token_and_only_reads_are_served() {
    let (port, token, _) = start();
    for target in ["/", "/api/x", "/api/events", "/nowhere", "/?token=00"] {
        let (status, body) = request(port, "GET", target, "");
        assert_eq!(status, 401, "{target}: {body}");
        assert!(!body.contains("<script"), "{target} gave the page away");
    }
    let (status, _) = request(port, "POST", &format!("/api/x?token={token}"), "");
    assert_eq!(status, 405);
    let (status, page) = request(port, "GET", &format!("/?token={token}"), "");
    assert_eq!(status, 200);
    assert!(page.contains("frame-ancestors 'none'") && page.contains("<script"));
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let (status, body) = request(port, "GET", "/api/x?a=b%2Fc+d", &bearer);
    assert_eq!(status, 200);
    assert!(body.ends_with("/api/x a=Some(\"b/c d\")"), "{body}");
    let (status, _) = request(port, "GET", "/elsewhere", &bearer);
    assert_eq!(status, 404);
}

#[test]
fn each_kind_of_api_error_is_its_status_and_says_why() {
    let (port, token, _) = start();
    for (path, code, says) in [
        ("/api/bad", 400, "bad request here"),
        ("/api/missing", 404, "nothing here"),
        ("/api/broken", 500, "broken here"),
    ] {
        let (status, body) = request(port, "GET", &format!("{path}?token={token}"), "");
        assert_eq!(status, code, "{path}: {body}");
        assert!(body.ends_with(&format!("{says}\n")), "{path}: {body}");
    }
}

#[test]
fn a_change_of_the_revision_reaches_an_open_event_stream() {
    let (port, token, revision) = start();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET /api/events?token={token} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut seen = String::new();
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    // Changed once the stream is open (its headers read), so the change cannot come before it.
    let mut changed = false;
    while !seen.contains("event: change") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no change event: {seen:?}"
        );
        if let Ok(n) = s.read(&mut buf) {
            assert!(n > 0, "the stream ended: {seen:?}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        if !changed && seen.contains("text/event-stream") {
            revision.fetch_add(1, Ordering::SeqCst);
            changed = true;
        }
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
}
