//! What a store keeps and who can read it: a corpus of secrets in argv and env under every
//! backend, the mount and the gateway (none reaches the database, its WAL or any output; harmless
//! values under the same names stay); hostile file names through `reproduce` and the terminal; the
//! store's permissions; and events forged by another user against a running job.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::mount::{require_fuse, Mounted};
use common::server::Server;
use common::{stderr, stdout, Project};

/// Secrets in argv, in every form the rules know. Each value is unique and never appears
/// elsewhere, so finding it anywhere is a leak.
fn argv_secrets() -> Vec<(Vec<&'static str>, &'static str)> {
    vec![
        (vec!["--password", "Sx1-hunter2"], "Sx1-hunter2"),
        (vec!["--token=Sx2-abc"], "Sx2-abc"),
        (vec!["--api-key", "Sx3-key"], "Sx3-key"),
        (vec!["mysql", "-u", "root", "-pSx4-mysql"], "Sx4-mysql"),
        (vec!["https://user:Sx5-url@host/x"], "Sx5-url"),
        (vec!["postgresql://u:Sx6-dsn@h/db"], "Sx6-dsn"),
        (vec!["Authorization: Bearer Sx7-bearer"], "Sx7-bearer"),
        (vec!["AWS_SECRET_ACCESS_KEY=Sx8-awsarg"], "Sx8-awsarg"),
        (
            vec!["ghp_Sx9aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456"],
            "Sx9aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456",
        ),
        (vec!["-storepass", "Sx10-keystore"], "Sx10-keystore"),
        (
            vec!["https://b.s3.amazonaws.com/k?X-Amz-Signature=Sx11sig&x-id=GetObject"],
            "Sx11sig",
        ),
        (vec!["--header=Cookie: session=Sx12-cookie"], "Sx12-cookie"),
    ]
}

/// Token-shaped values under innocent variable names.
fn env_secrets() -> Vec<(&'static str, String, &'static str)> {
    let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpQIBAAKCAQEAse1PEMbodyline\n-----END RSA PRIVATE KEY-----";
    vec![
        ("SEC_A", "ghp_Se1aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456".into(), "Se1aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456"),
        ("SEC_B", "AKIASE2EXAMPLE7Q4XYZ".into(), "AKIASE2EXAMPLE7Q4XYZ"),
        ("SEC_C", pem.into(), "MIIEpQIBAAKCAQEAse1PEMbodyline"),
        (
            "SEC_D",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJTZTRqd3QifQ.Se4SignatureAbc123xyz".into(),
            "Se4SignatureAbc123xyz",
        ),
        (
            "SEC_E",
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=Se5azureKey==;EndpointSuffix=core.windows.net".into(),
            "Se5azureKey",
        ),
        (
            "SEC_F",
            "https://5e6f0123456789abcdef0123456789ab@o1.ingest.sentry.io/42".into(),
            "5e6f0123456789abcdef0123456789ab",
        ),
        (
            "SEC_G",
            "https://hooks.slack.com/services/T0SE7/B0SE7/Se7slackHookPath".into(),
            "Se7slackHookPath",
        ),
        ("SEC_H", "glpat-Se8gitlabTokenValue12".into(), "Se8gitlabTokenValue12"),
        ("SEC_I", "hf_Se9HuggingFaceTokenValue0123456789".into(), "Se9HuggingFaceTokenValue0123456789"),
        ("SEC_J", "sk-proj-Se10OpenAiKeyValue0123456789abcdefXYZ".into(), "Se10OpenAiKeyValue0123456789abcdefXYZ"),
        ("DB_PASSWORD", "Se11-plain".into(), "Se11-plain"),
    ]
}

/// Harmless values under the same names and forms: kept as they are.
fn harmless() -> (Vec<&'static str>, Vec<(&'static str, &'static str)>) {
    (
        vec![
            "--key",
            "data/Hk1.csv",
            "https://example.com/Hk2",
            "--max-tokens",
            "Hk3",
        ],
        vec![
            ("SEC_A", "Hk4 plain words"),
            ("SEC_B", "s3://bucket/Hk5"),
            ("SEC_E", "AccountName=Hk6"),
        ],
    )
}

fn all_argv() -> Vec<String> {
    let mut argv: Vec<String> = ["sh", "-c", "echo made > out.txt", "sh"]
        .map(String::from)
        .into();
    for (words, _) in argv_secrets() {
        argv.extend(words.into_iter().map(String::from));
    }
    argv
}

fn needles() -> Vec<String> {
    argv_secrets()
        .into_iter()
        .map(|(_, s)| s.to_owned())
        .chain(env_secrets().into_iter().map(|(_, _, s)| s.to_owned()))
        .collect()
}

/// The database and its WAL, as bytes.
fn store_bytes(project: &Path) -> Vec<u8> {
    ["roar.db", "roar.db-wal"]
        .iter()
        .flat_map(|f| std::fs::read(project.join(".roar").join(f)).unwrap_or_default())
        .collect()
}

/// Runs a `roar reproduce` script with `sh`, with the built `roar` first on PATH.
fn run_script(project: &Path, script: &[u8]) -> std::process::Output {
    std::fs::write(project.join("r.sh"), script).unwrap();
    let bin_dir = common::roar_bin().parent().unwrap().to_owned();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    Command::new("sh")
        .arg("r.sh")
        .current_dir(project)
        .env("PATH", path)
        .output()
        .unwrap()
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Every byte of the store's files, and every output a user or an export can get.
fn everything_shown(p: &Project, job: &str) -> Vec<(String, Vec<u8>)> {
    let mut seen = Vec::new();
    for f in ["roar.db", "roar.db-wal", "roar.db-shm"] {
        if let Ok(b) = std::fs::read(p.path().join(".roar").join(f)) {
            seen.push((f.to_owned(), b));
        }
    }
    let out_txt = p.path().join("out.txt");
    let out = out_txt.to_str().unwrap();
    for args in [
        vec!["log"],
        vec!["log", "--json"],
        vec!["show", job],
        vec!["show", job, "--json"],
        vec!["dag"],
        vec!["dag", "--json"],
        vec!["dag", "--dot"],
        vec!["lineage", out],
        vec!["lineage", out, "--json"],
        vec!["reproduce", out],
        vec!["export", "--format", "prov-json"],
        vec!["export", "--format", "openlineage"],
        vec!["diff", "1", job],
    ] {
        let o = p.roar(&args);
        seen.push((args.join(" "), [o.stdout, o.stderr].concat()));
    }
    seen
}

fn assert_no_secret(p: &Project, job: &str, what: &str) {
    for (source, bytes) in everything_shown(p, job) {
        for n in needles() {
            assert!(!contains(&bytes, &n), "{what}: secret {n:?} is in {source}");
        }
    }
}

fn harmless_kept(p: &Project, job: &str) {
    let shown = stdout(&p.roar(["show", job, "--json"]));
    for v in [
        "Hk1",
        "Hk2",
        "Hk3",
        "Hk4 plain words",
        "s3://bucket/Hk5",
        "AccountName=Hk6",
    ] {
        assert!(shown.contains(v), "harmless {v:?} was redacted: {shown}");
    }
}

/// A harmless job first (job 1, so `diff 1 N` compares against it), then the secret one.
fn run_both(p: &Project, backend: &str) {
    let (h_argv, h_env) = harmless();
    let mut cmd = p.cmd([
        "run",
        "--tracer",
        backend,
        "--",
        "sh",
        "-c",
        "echo made > out.txt",
        "sh",
    ]);
    cmd.args(h_argv);
    for (k, v) in h_env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{backend}: {}", stderr(&o));
    harmless_kept(p, "1");

    let argv = all_argv();
    let mut cmd = p.cmd(["run", "--tracer", backend, "--"]);
    cmd.args(&argv);
    for (k, v, _) in env_secrets() {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{backend}: {}", stderr(&o));
}

#[test]
fn no_secret_from_any_backend_reaches_the_store_or_an_output() {
    for backend in common::backends() {
        let p = Project::new();
        run_both(&p, backend);
        assert_no_secret(&p, "2", backend);
        // The redacted job still says what it ran, and which arguments were secrets.
        let job = p.job_json(2);
        let argv: Vec<&str> = job["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(argv.len(), all_argv().len(), "{backend}: {argv:?}");
        assert!(
            argv.contains(&"--password") && argv.contains(&"<redacted>"),
            "{argv:?}"
        );
        assert!(argv.contains(&"https://user:<redacted>@host/x"), "{argv:?}");
        assert_eq!(job["env"]["SEC_B"], "<redacted>", "{backend}");
    }
}

/// A journal is on disk while its job runs (and after a kill, until it is recovered): every
/// record in it — the job's header with its environment, each exec's argv — is redacted as the
/// store would redact it. Read while the command is still running, under every backend.
#[test]
fn no_secret_reaches_a_running_jobs_journal() {
    for backend in common::backends() {
        let p = Project::new();
        let mut argv = all_argv();
        // The command (exec'd with every secret in its argv) then execs `/bin/true mark<its pid>`,
        // which only an exec event (never the header) names; it waits until the journal was read.
        argv[2] =
            "/bin/true mark$$; echo $$ > started; while [ ! -e go ]; do sleep 0.01; done".into();
        let mut cmd = p.cmd(["run", "--tracer", backend, "--"]);
        cmd.args(&argv).stdout(Stdio::null()).stderr(Stdio::null());
        for (k, v, _) in env_secrets() {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let started = p.path().join("started");
        let pid = || {
            std::fs::read_to_string(&started)
                .ok()
                .filter(|s| s.ends_with('\n'))
        };
        assert!(
            common::wait_for(Duration::from_secs(30), || pid().is_some()),
            "{backend}: the command never started"
        );
        let mark = format!("mark{}", pid().unwrap().trim());
        let journals = || -> Vec<(std::path::PathBuf, Vec<u8>)> {
            std::fs::read_dir(p.path().join(".roar/journal"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| Some((e.path(), std::fs::read(e.path()).ok()?)))
                .collect()
        };
        // Every exec before the mark's is in the journal once the mark's is.
        assert!(
            common::wait_for(Duration::from_secs(10), || journals()
                .iter()
                .any(|(_, b)| contains(b, &mark))),
            "{backend}: the command's execs never reached its journal"
        );
        for (j, bytes) in journals() {
            for n in needles() {
                assert!(
                    !contains(&bytes, &n),
                    "{backend}: secret {n:?} is in {}",
                    j.display()
                );
            }
        }
        std::fs::write(p.path().join("go"), b"").unwrap();
        assert!(child.wait().unwrap().success(), "{backend}");
    }
}

#[test]
fn the_projects_own_rules_add_and_allow() {
    let p = Project::new();
    let config = p.path().join(".roar/config.toml");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("names = []\n", "names = [\"LICENSE_*\", \"seed\"]\n");
    let text = text
        .replace("allow = []\n", "allow = [\"DB_PASSWORD\"]\n")
        .replace("patterns = []\n", "patterns = [\"corp-[0-9]{6}\"]\n");
    std::fs::write(&config, text).unwrap();
    let o = p
        .cmd([
            "run",
            "--",
            "sh",
            "-c",
            "true",
            "sh",
            "--seed",
            "Cf1",
            "note corp-123456",
        ])
        .env("LICENSE_CODE", "Cf2")
        .env("DB_PASSWORD", "Cf3-allowed")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let db = store_bytes(p.path());
    for leaked in ["Cf1", "Cf2", "corp-123456"] {
        assert!(!contains(&db, leaked), "{leaked} reached the store");
    }
    assert_eq!(p.last_job()["env"]["DB_PASSWORD"], "Cf3-allowed");

    // A bad pattern is one clear line, and nothing runs.
    std::fs::write(&config, "[redact]\npatterns = [\"(\"]\n").unwrap();
    let o = p.roar(["run", "--", "touch", "never"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not a regular expression"), "{err}");
    assert!(!p.path().join("never").exists());
}

#[test]
fn no_secret_from_a_mount_job() {
    if !require_fuse() {
        return;
    }
    let mut m = Mounted::new(|_| {});
    let mut argv = all_argv();
    argv[2] = "echo made > out.txt".into();
    // Its own process group, as an interactive shell starts a command: the mount's job.
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(&m.data)
        .process_group(0)
        .status()
        .unwrap();
    assert!(status.success());
    m.unmount();
    let db = store_bytes(m.p.path());
    let shown = [
        stdout(&m.p.roar(["log"])),
        stdout(&m.p.roar(["log", "--json"])),
        stdout(&m.p.roar(["dag", "--json"])),
    ]
    .concat();
    assert!(
        shown.contains("<redacted>"),
        "the mount recorded no job: {shown}"
    );
    for (_, s) in argv_secrets() {
        assert!(!contains(&db, s), "mount: {s} reached the store");
        assert!(!shown.contains(s), "mount: {s} is shown");
    }
}

#[test]
fn no_secret_from_a_gateway_client() {
    if !common::require_tool("aws") {
        return;
    }
    let p = Project::new();
    // An access key id shaped like a real AWS one names the client's job.
    let (access, secret) = (
        "AKIAGWSECRET7EXAMPLE",
        "gateway-secret-gateway-secret-gateway-00",
    );
    p.write("keys.txt", format!("{access} {secret}\n").as_bytes());
    p.write("obj.bin", b"object");
    let cmd = p.cmd([
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--credentials",
        "keys.txt",
    ]);
    let gw = Server::spawn(cmd, p.path().join("gateway.log"));
    let aws = |args: &[&str]| {
        let o = Command::new("aws")
            .args(["--endpoint-url", &gw.endpoint(), "--region", "us-east-1"])
            .args(args)
            .current_dir(p.path())
            .env("AWS_ACCESS_KEY_ID", access)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .env_remove("AWS_PROFILE")
            .output()
            .unwrap();
        assert!(o.status.success(), "aws {args:?}: {}", stderr(&o));
    };
    aws(&["s3", "mb", "s3://sec-bucket"]);
    aws(&["s3", "cp", "obj.bin", "s3://sec-bucket/obj.bin"]);
    let (status, log) = gw.stop();
    assert!(status.success(), "{log}");
    let log_json = stdout(&p.roar(["log", "--json"]));
    assert!(log_json.contains("gateway"), "{log_json}");
    let db = store_bytes(p.path());
    for leaked in [access, secret] {
        assert!(!contains(&db, leaked), "{leaked} reached the store");
        assert!(!log_json.contains(leaked), "{leaked} is shown");
    }
}

/// Every byte 1..=255 but `/` in some name (16 to a name), and names built to inject.
fn hostile_names() -> Vec<Vec<u8>> {
    let bytes: Vec<u8> = (1..=255u8).filter(|b| *b != b'/').collect();
    let mut names: Vec<Vec<u8>> = bytes
        .chunks(16)
        .map(|c| [b"n".as_slice(), c, b"x"].concat())
        .collect();
    names.push(b"inj\ntouch PWNED #".to_vec());
    names.push(b"q'uote\"$(touch PWNED2)`touch PWNED3`".to_vec());
    names.push(b"\x1b]0;title\x07\x1b[31mred".to_vec());
    names
}

/// What in `out` a terminal would act on, or that is not text: C0 but newline, DEL, C1 (raw or
/// as UTF-8), the bidirectional controls, bytes that are not UTF-8.
fn unsafe_bytes(out: &[u8]) -> Vec<String> {
    let mut bad = Vec::new();
    for chunk in out.utf8_chunks() {
        bad.extend(
            chunk
                .valid()
                .chars()
                .filter(|c| {
                    (c.is_control() && *c != '\n')
                        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
                })
                .map(|c| format!("{c:?}")),
        );
        bad.extend(chunk.invalid().iter().map(|b| format!("{b:#x}")));
    }
    bad
}

/// Every command that prints what the record holds, on a store whose names are `names`: its
/// stdout and stderr carry no byte a terminal acts on (text, JSON, DOT, the script, PROV, an
/// error naming a path), and the SVG Graphviz makes of the DOT is well-formed XML.
fn every_output_is_terminal_safe(p: &Project, names: &[Vec<u8>]) {
    use std::os::unix::ffi::OsStrExt;
    let target = p
        .path()
        .join(std::ffi::OsStr::from_bytes(&names[names.len() - 1]));
    let target = target.to_str().map(str::to_owned).unwrap_or_default();
    let mut commands: Vec<Vec<String>> = [
        &["log", "-n", "1000"][..],
        &["--json", "log", "-n", "1000"],
        &["dag"],
        &["dag", "--dot"],
        &["--json", "dag"],
        &["show", "3"],
        &["--json", "show", "3"],
        &["diff", "2", "3"],
        &["status"],
        &["--json", "status"],
        &["export"],
        &["export", "--format", "openlineage"],
        &["db", "--secrets-scan"],
        &["show", "/no/such\x1b]0;pwned\x07file"],
    ]
    .iter()
    .map(|c| c.iter().map(|s| s.to_string()).collect())
    .collect();
    for query in ["lineage", "inputs", "reproduce", "dag", "show"] {
        commands.push(vec![query.to_owned(), target.clone()]);
    }
    for argv in &commands {
        let o = p.roar(argv);
        for (stream, bytes) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
            let bad = unsafe_bytes(bytes);
            assert!(bad.is_empty(), "roar {argv:?} {stream}: {bad:?}");
        }
    }
    // A damaged archive's error quotes its bytes.
    let archive = p.path().join("bad.tar");
    // One good member, then a header whose name is an escape sequence and whose fields are not.
    let damage = "import io, sys, tarfile\nb = io.BytesIO()\nt = tarfile.open(fileobj=b, mode='w')\ni = tarfile.TarInfo('ok.txt'); i.size = 2; t.addfile(i, io.BytesIO(b'ok')); t.close()\nd = bytearray(b.getvalue()); d[1024:1033] = b'\\x1b]0;pwned'\nopen(sys.argv[1], 'wb').write(d)\n";
    let o = Command::new("python3")
        .args(["-c", damage])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mnt = p.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let o = p.cmd(["mount"]).arg(&archive).arg(&mnt).output().unwrap();
    if o.status.success() {
        p.cmd(["unmount"]).arg(&mnt).output().unwrap();
    }
    assert!(!o.status.success(), "a damaged archive mounted");
    let bad = unsafe_bytes(&o.stderr);
    assert!(bad.is_empty(), "mount of a damaged archive: {bad:?}");
    let svg = p.path().join("g.svg");
    let o = p.cmd(["dag", "--svg"]).arg(&svg).output().unwrap();
    if o.status.success() {
        let parsed = Command::new("python3")
            .args([
                "-c",
                "import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])",
            ])
            .arg(&svg)
            .output()
            .unwrap();
        assert!(
            parsed.status.success(),
            "the SVG is not XML: {}",
            stderr(&parsed)
        );
    } else {
        common::skip(&format!("dag --svg needs Graphviz: {}", stderr(&o)));
    }
}

#[test]
fn reproduce_recreates_hostile_names_exactly_and_the_terminal_sees_no_control_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let p = Project::new();
    let names = hostile_names();
    // One job per name: the name is in its argv, as a user's script would pass it.
    let writer = "import os, sys; n = os.fsencode(sys.argv[1]); open(n, 'wb').write(n)";
    for name in &names {
        let o = p
            .cmd(["run", "--", "python3", "-c", writer])
            .arg(std::ffi::OsStr::from_bytes(name))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
    every_output_is_terminal_safe(&p, &names);

    for name in &names {
        let file = p.path().join(std::ffi::OsStr::from_bytes(name));
        let o = p.cmd(["reproduce"]).arg(&file).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let bad = unsafe_bytes(&o.stdout);
        assert!(bad.is_empty(), "the script of {name:?} shows {bad:?}");
        std::fs::remove_file(&file).unwrap();
        let run = run_script(p.path(), &o.stdout);
        assert!(run.status.success(), "{:?}: {}", name, stderr(&run));
        assert_eq!(
            std::fs::read(&file).unwrap(),
            *name,
            "{name:?} not recreated"
        );
    }
    for pwned in ["PWNED", "PWNED2", "PWNED3"] {
        assert!(
            !p.path().join(pwned).exists(),
            "{pwned}: a name injected a command"
        );
    }
}

#[test]
fn a_reproduced_redacted_argument_must_be_supplied() {
    let p = Project::new();
    let o = p.roar([
        "run",
        "--",
        "sh",
        "-c",
        "echo \"$1\" > out.txt",
        "sh",
        "--token=Rs1-value",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = p.path().join("out.txt");
    let script = stdout(&p.cmd(["reproduce"]).arg(&out).output().unwrap());
    assert!(script.contains("ROAR_SECRET_1"), "{script}");
    let o = run_script(p.path(), script.as_bytes());
    assert!(!o.status.success());
    assert!(stderr(&o).contains("ROAR_SECRET_1"), "{}", stderr(&o));
    // `--run` reads the same variable: the rebuilt output matches the record.
    let o = p
        .cmd(["reproduce", "--run"])
        .arg(&out)
        .env("ROAR_SECRET_1", "Rs1-value")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("matches"), "{}", stdout(&o));
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_store_is_private_and_an_old_wide_one_is_narrowed() {
    let p = Project::new();
    let o = p.roar(["run", "--", "true"]);
    assert!(o.status.success());
    let dir = p.path().join(".roar");
    assert_eq!(mode(&dir), 0o700);
    for f in ["roar.db", "roar.db-wal", "roar.db-shm"] {
        assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
    }
    // As an older roar left it.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for f in ["roar.db", "roar.db-wal", "roar.db-shm"] {
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    assert!(p.roar(["log"]).status.success());
    assert_eq!(mode(&dir), 0o700);
    for f in ["roar.db", "roar.db-wal", "roar.db-shm"] {
        assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
    }
    if !common::can_switch_user("reading the store as user nobody needs root and setpriv") {
        return;
    }
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(dir.join("roar.db"))
        .output()
        .unwrap();
    assert!(!o.status.success(), "user nobody read the store");
}

/// The abstract event socket of the `roar run` with process id `pid` (`roar-PID-NONCE`), from
/// /proc/net/unix: named by the run's pid, so neither the recorder's and eBPF helper's sockets
/// (`roar-recorder-...`, `roar-ebpf-...`) nor another test's run can be taken for it.
fn job_socket(pid: u32) -> Option<String> {
    let prefix = format!("@roar-{pid}-");
    std::fs::read_to_string("/proc/net/unix")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .find(|n| n.starts_with(&prefix))
        .map(|n| n[1..].to_owned())
}

#[test]
fn events_forged_by_another_user_are_not_recorded() {
    if !can_forge() {
        return;
    }
    let p = Project::new();
    let job = p
        .cmd([
            "run",
            "--tracer",
            "preload",
            "--",
            "sh",
            "-c",
            "sleep 3; echo real > real.txt",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let sock = loop {
        if let Some(s) = job_socket(job.id()) {
            break s;
        }
        assert!(Instant::now() < deadline, "the job's socket never appeared");
        std::thread::sleep(Duration::from_millis(20));
    };
    // As user nobody: garbage, then a well-formed Open event (header + strings) claiming the job
    // wrote /etc/forged, without the run's key.
    let forger = r#"
import socket, struct, sys, time
name = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(b"garbage", "\0" + name)
path = b"/etc/forged"
stat = struct.pack("=QQQqqII", 1, 2, 0, 0, 0, 0o100644, 0)
hdr = struct.pack("=HHiqiiq", 3, 0, 1, 0o1101, 3, 0, time.time_ns()) + stat + struct.pack("=IIII", 0, len(path), 0, 0)
s.sendto(hdr + path, "\0" + name)
s.sendto(hdr + path + b"\0" * 16, "\0" + name)
"#;
    let o = Command::new("setpriv")
        // The system interpreter: user nobody cannot reach a pyenv under /root.
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            forger,
            &sock,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "the forger failed: {}", stderr(&o));
    refused_and_recorded(&p, job, "refused 3 event datagrams", "real.txt");
}

/// The run `job` ended well, said `said` on stderr, is marked incomplete (refused unread: what
/// the forger said is not in the record, and the job says some events were), recorded its own
/// output `kept`, and nothing the forger wrote.
fn refused_and_recorded(p: &Project, job: std::process::Child, said: &str, kept: &str) {
    let out = job.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    assert!(err.contains(said), "the refusal is said: {err}");
    let job = p.last_job();
    assert_eq!(job["incomplete"], true, "{job}");
    let outputs = p.files(&job, "output");
    assert!(
        outputs.iter().any(|f| f.ends_with(kept)),
        "the run's own part is recorded: {outputs:?}"
    );
    assert!(
        !outputs.iter().any(|f| f.contains("forged")),
        "a forged event was recorded: {outputs:?}"
    );
}

/// A root job whose command drops to user nobody hands that user the run's key (in its own
/// environ, which it may read): an unrelated process of nobody's, with the shim preloaded and
/// that key, still cannot add a file to root's job. The kernel says who sent each datagram, and
/// only the run's own processes (by ancestry) are heard; the dropped-privilege part of the job
/// itself is.
#[test]
fn the_key_handed_to_another_user_does_not_let_it_forge_events() {
    if !can_forge() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let p = Project::new();
    let shared = p.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    for dir in [p.path(), shared.as_path()] {
        let mode = if dir == shared { 0o777 } else { 0o755 };
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let dropped = "env > shared/env.txt; echo legit > shared/legit.txt; sleep 4";
    let job = p
        .cmd([
            "run",
            "--tracer",
            "preload",
            "--",
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            dropped,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let env = loop {
        let env = std::fs::read_to_string(shared.join("env.txt")).unwrap_or_default();
        if env.contains("ROAR_INTERNAL_SOCK=") && env.ends_with('\n') {
            break env;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped command never wrote its environ"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} not in the job's environ"))
            .to_owned()
    };
    // The shim where user nobody can read it.
    let shim = shared.join("shim.so");
    std::fs::copy(var("ROAR_INTERNAL_LIB"), &shim).unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    // As user nobody from the start (the shim comes in after the switch: a root process with
    // it would be a process of roar's own user, whom roar does not guard against).
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "env"])
        .arg(format!("LD_PRELOAD={}", shim.display()))
        .arg(format!("ROAR_INTERNAL_LIB={}", shim.display()))
        .arg(format!("ROAR_INTERNAL_SOCK={}", var("ROAR_INTERNAL_SOCK")))
        .args(["sh", "-c", "echo forged > shared/forged.txt"])
        .current_dir(p.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "the forger failed: {}", stderr(&o));
    assert!(shared.join("forged.txt").exists());
    refused_and_recorded(&p, job, "refused", "legit.txt");
}

/// Under `--tracer ptrace` run by an unprivileged user, the kernel runs a setuid program without
/// its privileges (it would not let the tracer control a process it could not otherwise): the
/// job did not run as it would bare, and roar says so and marks it.
#[test]
fn a_setuid_program_that_loses_its_privileges_under_ptrace_is_said_and_marked() {
    if !common::can_switch_user("running roar as user nobody needs root and setpriv") {
        return;
    }
    let p = Project::new();
    let suid = p.path().join("suid-id");
    common::copy_executable(Path::new("/usr/bin/id"), &suid);
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let o = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(p.path().join(".roar"))
        .arg(p.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // The program stays root's and setuid (chown dropped the bit on it; set it again).
    let o = Command::new("sh")
        .arg("-c")
        .arg("chown root:root \"$0\" && chmod 4755 \"$0\"")
        .arg(&suid)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let as_nobody = |args: &[&std::ffi::OsStr]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args)
            .current_dir(p.path())
            .env("HOME", p.path())
            .output()
            .unwrap()
    };
    let bare = as_nobody(&[suid.as_os_str(), "-u".as_ref()]);
    if stdout(&bare).trim() != "0" {
        common::skip(&format!(
            "setuid has no effect on this filesystem: {}",
            stdout(&bare)
        ));
        return;
    }
    let roar = common::roar_bin();
    let o = as_nobody(&[
        roar.as_os_str(),
        "run".as_ref(),
        "--tracer".as_ref(),
        "ptrace".as_ref(),
        "--".as_ref(),
        suid.as_os_str(),
        "-u".as_ref(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).trim(),
        "65534",
        "the kernel ran it without its privileges"
    );
    let err = stderr(&o);
    assert!(
        err.contains("without its setuid/setgid privileges"),
        "{err}"
    );
    assert_eq!(p.last_job()["incomplete"], true);
}

fn can_forge() -> bool {
    common::can_switch_user("sending datagrams as user nobody needs root and setpriv")
}

#[test]
fn an_old_store_is_audited_and_redacted_in_place() {
    let p = Project::new();
    // Recorded before the project's rule existed: stored as it was.
    let o = p.roar([
        "run",
        "--",
        "sh",
        "-c",
        "true",
        "sh",
        "--license",
        "Au1-licence-value",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = p.roar(["db", "--secrets-scan"]);
    assert!(o.status.success(), "{}", stdout(&o));
    let config = p.path().join(".roar/config.toml");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("names = []\n", "names = [\"license\"]\n");
    std::fs::write(&config, text).unwrap();

    let o = p.roar(["db", "--secrets-scan", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let found: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(found[0]["field"], "argv[5]", "{found}");
    assert!(!stdout(&o).contains("Au1"), "the scan printed the secret");

    let o = p.roar(["db", "--redact"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(p.roar(["db", "--secrets-scan"]).status.success());
    for f in ["roar.db", "roar.db-wal"] {
        let bytes = std::fs::read(p.path().join(".roar").join(f)).unwrap_or_default();
        assert!(
            !contains(&bytes, "Au1-licence-value"),
            "the old value survives in {f}"
        );
    }
    assert_eq!(p.job_json(1)["argv"][5], "<redacted>");
}
