//! The lineage page (issue 32) in a real browser: headless Chromium from Debian's packages, driven
//! by Playwright (tests/ui/drive.py), over a recorded 4-step pipeline. Served by `roar ui` (token
//! required, the API answers what `roar dag --json` prints, live updates, stale marks) and written
//! by `roar dag --html` (opens from disk with every network request refused).

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{require_python_modules, require_tool, roar_bin, stderr, Project};
use serde_json::{json, Value};

const HOSTILE: &str = "<img src=x onerror=alert(1)>.txt";

fn browser_available() -> bool {
    require_tool("chromium") && require_python_modules(&["playwright"])
}

fn run(p: &Project, script: &str, args: &[&str]) {
    let mut argv = vec!["run", "--", "sh", "-c", script, "sh"];
    argv.extend(args);
    let out = p.roar(&argv);
    assert!(out.status.success(), "{script}: {}", stderr(&out));
}

/// data/ (raw.csv and seven parts) -> job 1 clean.csv -> job 2 shards/ (8 files) -> job 3
/// model.txt (also from data/) -> job 4 report.txt and a file whose name is markup.
fn pipeline() -> (Project, Value) {
    let p = Project::new();
    // The page's checks below are written for four jobs of one step each (the loop of `head`s
    // would be eight steps): steps on the page have their own test.
    p.append_config("\n[steps]\ndrivers = []\n");
    let mut raw = String::new();
    for i in (1..=100).rev() {
        raw += &format!("{i}\n");
    }
    p.write("data/raw.csv", raw.as_bytes());
    for i in 1..=7 {
        p.write(&format!("data/part{i}.txt"), format!("{i}\n").as_bytes());
    }
    run(&p, "sort -n data/raw.csv > clean.csv", &[]);
    run(
        &p,
        "mkdir -p shards; for i in 1 2 3 4 5 6 7 8; do head -n $((i*10)) clean.csv > shards/s$i.txt; done",
        &[],
    );
    run(
        &p,
        "cat shards/*.txt data/part*.txt | wc -l > model.txt",
        &[],
    );
    // argv may hold what a file name cannot: a tag that would close the page's script.
    run(
        &p,
        "cat model.txt clean.csv > report.txt && cp report.txt \"$1\" # </script><script>alert(2)</script>",
        &[HOSTILE],
    );
    let dag = p.roar(["dag", "--json"]);
    assert!(dag.status.success(), "{}", stderr(&dag));
    let model = std::fs::read(p.path().join("model.txt")).unwrap();
    let expect = json!({
        "jobs": 4,
        "target": "model.txt",
        "target_hash": blake3::hash(&model).to_hex().to_string(),
        "target_job": 3,
        "upstream": ["job 3", "shards/", "job 2", "clean.csv", "job 1", "data/"],
        "first_job": 1,
        "last_job": 4,
        "collapsed_dir": "shards",
        "collapsed_files": 8,
        "root_input": "data/raw.csv",
        "hostile": HOSTILE,
        "dag": serde_json::from_slice::<Value>(&dag.stdout).unwrap(),
    });
    (p, expect)
}

fn drive(mode: &str, target: &str, p: &Project, expect: &Value) {
    let dir = p.path().join(".roar");
    let expect_path = dir.join("expect.json");
    std::fs::write(&expect_path, serde_json::to_vec(expect).unwrap()).unwrap();
    let shot = artifacts().join(format!("ui-{mode}.png"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui/drive.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([mode, target])
        .arg(p.path())
        .arg(roar_bin())
        .arg(&expect_path)
        .arg(&shot)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the browser check failed ({mode}):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    assert!(
        shot.metadata().unwrap().len() > 10_000,
        "the screenshot is empty"
    );
}

/// Screenshots stay where a person can look at them after the run.
fn artifacts() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The server, and the pipe of its output (kept open while it runs).
struct Server(
    Child,
    #[allow(dead_code)] BufReader<std::process::ChildStdout>,
);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `roar ui --port 0` and reads the URL it prints.
fn serve(p: &Project) -> (Server, String) {
    let mut child = p
        .cmd(["ui", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("roar ui printed {line:?}"))
        .to_owned();
    assert!(url.contains("?token="), "{url}");
    (Server(child, out), url)
}

#[test]
fn served_page_in_a_real_browser() {
    if !browser_available() {
        return;
    }
    let (p, expect) = pipeline();
    let (_server, url) = serve(&p);
    drive("served", &url, &p, &expect);
}

#[test]
fn a_job_with_steps_is_drawn_step_by_step() {
    if !browser_available() {
        return;
    }
    let p = Project::new();
    p.write("raw.txt", b"b\na\n");
    p.write(
        "pipeline.sh",
        b"tr a-z A-Z < raw.txt > clean.txt\nsort clean.txt > model.txt\nwc -l model.txt > metrics.txt\n",
    );
    let out = p.roar(["run", "--", "sh", "pipeline.sh"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = p.path().join("steps.html");
    let out = p.roar(["dag".as_ref(), "--html".as_ref(), html.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let expect = json!({
        "step_nodes": ["job 1 step 1", "job 1 step 2", "job 1 step 3", "job 1 step 4"],
        "target": "metrics.txt",
        "upstream": ["job 1 step 2", "raw.txt", "job 1 step 3", "clean.txt", "job 1 step 4", "model.txt"],
    });
    drive("steps", html.to_str().unwrap(), &p, &expect);
}

#[test]
fn html_file_opens_from_disk_without_network() {
    if !browser_available() {
        return;
    }
    let (p, expect) = pipeline();
    let html = p.path().join("lineage.html");
    let out = p.roar(["dag".as_ref(), "--html".as_ref(), html.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = std::fs::read_to_string(&html).unwrap();
    // Self-contained: no address to load anything from.
    for needle in ["src=\"http", "href=\"http", "@import", "url(http"] {
        assert!(
            !page.contains(needle),
            "the file refers to the network: {needle}"
        );
    }
    // A recorded name that closes the script tag stays inside the JSON.
    assert_eq!(
        page.matches("</script>").count(),
        3,
        "a recorded string closed a script tag"
    );
    drive("file", html.to_str().unwrap(), &p, &expect);
}

#[test]
fn ui_refuses_a_port_in_use_with_one_line() {
    let p = Project::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = p.roar(["ui", "--port", &port]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("127.0.0.1:{port}")) && err.contains("--port"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// `roar ui` outlives whoever started it stopping to read its output (a closed pipe is not a
/// reason for a server to die of SIGPIPE): it goes on answering.
#[test]
fn the_server_outlives_a_closed_output() {
    let p = Project::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = p
        .cmd(["ui", "--port", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Nobody will read what it prints.
    drop(child.stdout.take());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut up = false;
    while std::time::Instant::now() < deadline && !up {
        up = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let status = child.try_wait().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        up && status.is_none(),
        "roar ui died with its output closed: {status:?}"
    );
}

/// 200 jobs (20 runs of a 10-stage pipeline, 1,000 file versions, tests/ui/reruns.sh): the page
/// opens on the latest runs with each folded count, its labels legible (>= 11 px) at the default
/// view, jobs counted as jobs, a job whose outputs are all deleted marked so; a job is found by
/// its label, its name's runs open as a table that filters, sorts and compares two rows; "all
/// runs" draws all 200 (issue 60).
#[test]
fn two_hundred_jobs_open_on_the_latest_runs_and_stay_legible() {
    if !browser_available() {
        return;
    }
    let p = Project::new();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui/reruns.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["20", "10", "5"])
        .current_dir(p.path())
        .env("ROAR", roar_bin())
        .env("NO_COLOR", "1")
        .env_remove("ROAR_DIR")
        .output()
        .unwrap();
    assert!(out.status.success(), "reruns.sh: {}", stderr(&out));
    // What the last stage made is gone: its job may not read "up to date".
    for i in 1..=5 {
        std::fs::remove_file(p.path().join(format!("s10/o{i}.txt"))).unwrap();
    }
    let o = p.roar(["label", "200", "best=yes"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (_server, url) = serve(&p);
    let expect = json!({
        "label": "best=yes",
        "labelled": "job 200",
        "runs_name": "stage10",
        "runs": 20,
        "jobs": 200,
        "latest_jobs": 10,
        "earlier": 19,
        "versions": 1000,
        "outputs_deleted": 200,
    });
    drive("scale", &url, &p, &expect);
}
