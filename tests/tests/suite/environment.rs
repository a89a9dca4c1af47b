//! Environment capture (issue 29), on real jobs: the Python distributions a job imported (from a
//! real venv, installed by pip, one of them editable) and nothing it did not import; the dpkg
//! package of a shared library it loaded; the interpreter; the machine; a dirty tree's diff that
//! restores the code; parameters first in `roar diff`.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{stderr, stdout, Project};
use serde_json::Value;

fn sh(dir: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {}", stderr(&out));
    stdout(&out).trim().to_owned()
}

fn env_json(p: &Project, job: &str) -> Value {
    let out = p.roar(["show", job, "--env", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn packages(env: &Value, kind: &str) -> Vec<(String, String)> {
    env["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == kind)
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["version"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A pure-Python distribution with its own in-tree PEP 517/660 build backend: pip builds and
/// installs it offline (the venv's setuptools cannot build wheels without `wheel`), editable or
/// not, and writes RECORD, INSTALLER and direct_url.json as for any distribution.
fn write_dist(dir: &Path, name: &str, version: &str) {
    std::fs::create_dir_all(dir.join(name)).unwrap();
    std::fs::write(
        dir.join("pyproject.toml"),
        format!(
            "[build-system]\nrequires = []\nbuild-backend = \"backend\"\nbackend-path = [\".\"]\n\n[project]\nname = \"{name}\"\nversion = \"{version}\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join(name).join("__init__.py"),
        format!("VERSION = '{version}'\n"),
    )
    .unwrap();
    let backend = format!(
        r#"import base64, hashlib, os, zipfile
NAME, VERSION = {name:?}, {version:?}
DI = f"{{NAME}}-{{VERSION}}.dist-info"
HERE = os.path.dirname(os.path.abspath(__file__))

def _wheel(directory, files):
    path = os.path.join(directory, f"{{NAME}}-{{VERSION}}-py3-none-any.whl")
    files = dict(files)
    files[f"{{DI}}/METADATA"] = f"Metadata-Version: 2.1\nName: {{NAME}}\nVersion: {{VERSION}}\n".encode()
    files[f"{{DI}}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for n, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{{n}},sha256={{digest}},{{len(data)}}")
    record.append(f"{{DI}}/RECORD,,")
    files[f"{{DI}}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    return os.path.basename(path)

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    src = open(os.path.join(HERE, NAME, "__init__.py"), "rb").read()
    return _wheel(wheel_directory, {{f"{{NAME}}/__init__.py": src}})

def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {{f"__editable__.{{NAME}}.pth": (HERE + "\n").encode()}})

def build_sdist(sdist_directory, config_settings=None):
    raise NotImplementedError
"#
    );
    std::fs::write(dir.join("backend.py"), backend).unwrap();
}

#[test]
fn a_venv_job_records_exactly_the_distributions_it_imported() {
    if !common::require_tool("python3") {
        return;
    }
    let p = Project::new();
    let root = p.path();
    sh(root, "python3 -m venv v");
    write_dist(&root.join("src/tinypkg"), "tinypkg", "1.2.3");
    write_dist(&root.join("src/unused"), "unusedpkg", "0.1");
    write_dist(&root.join("src/editpkg"), "editpkg", "0.9");
    sh(
        &root.join("src/editpkg"),
        "git init -q && git add -A && git commit -qm init",
    );
    let pip = "v/bin/python -m pip install -q --no-index --no-build-isolation --disable-pip-version-check";
    sh(
        root,
        &format!("{pip} ./src/tinypkg ./src/unused && {pip} -e ./src/editpkg"),
    );
    let edit_commit = sh(&root.join("src/editpkg"), "git rev-parse HEAD");
    let py_version = sh(
        root,
        "v/bin/python -c 'import platform; print(platform.python_version())'",
    );
    p.write(
        "use.py",
        b"import tinypkg, editpkg, sqlite3\nprint(tinypkg.VERSION)\n",
    );
    let want_sqlite = if Path::new("/var/lib/dpkg/status").exists() {
        sh(
            root,
            "dpkg-query -W -f='${Version}' libsqlite3-0 2>/dev/null || true",
        )
    } else {
        String::new()
    };

    let mut tracers = vec!["preload", "ptrace"];
    if common::ebpf_available() {
        tracers.push("ebpf");
    }
    for tracer in tracers {
        let out = p.roar(["run", "--tracer", tracer, "--", "v/bin/python", "use.py"]);
        assert!(out.status.success(), "{tracer}: {}", stderr(&out));
        let env = env_json(&p, &p.last_job()["id"].to_string());
        let py = packages(&env, "python");
        assert_eq!(
            py,
            vec![
                ("editpkg".into(), "0.9".into()),
                ("tinypkg".into(), "1.2.3".into())
            ],
            "{tracer}: only what was imported (not unusedpkg, pip or setuptools): {env}"
        );
        let all = env["packages"].as_array().unwrap();
        let tiny = all.iter().find(|p| p["name"] == "tinypkg").unwrap();
        assert_eq!(tiny["installer"], "pip");
        let site = tiny["location"].as_str().unwrap();
        assert!(
            site.starts_with(&root.join("v/lib").display().to_string())
                && site.ends_with("site-packages"),
            "{site}"
        );
        let edit = all.iter().find(|p| p["name"] == "editpkg").unwrap();
        assert_eq!(
            edit["location"],
            root.join("src/editpkg").display().to_string()
        );
        assert_eq!(edit["commit"], edit_commit.as_str());
        assert_eq!(
            packages(&env, "interpreter"),
            vec![("python".into(), py_version.clone())],
            "{tracer}"
        );
        let text = format!("{env}");
        assert!(
            !text.contains("libroar") && !text.contains("\"roar\""),
            "roar's own files: {text}"
        );
        // The loader mapped libsqlite3 for `import sqlite3`: its dpkg package, seen by every
        // backend (preload reports what the loader mapped; ptrace sees its opens).
        if !want_sqlite.is_empty() {
            assert!(
                packages(&env, "dpkg").contains(&("libsqlite3-0".into(), want_sqlite.clone())),
                "{tracer}: libsqlite3-0 {want_sqlite} not in {env}"
            );
        }
    }
}

#[test]
fn a_system_wide_numpy_is_found_with_its_version() {
    if !common::require_python_modules(&["numpy"]) {
        return;
    }
    let p = Project::new();
    let version = sh(
        p.path(),
        "python3 -c 'import numpy; print(numpy.__version__)'",
    );
    let out = p.roar(["run", "--", "python3", "-c", "import numpy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let env = env_json(&p, "1");
    let py = packages(&env, "python");
    assert!(py.contains(&("numpy".into(), version)), "{env}");
    // Never a distribution that is installed but was not imported (setup.sh installs boto3).
    assert!(!py.iter().any(|(n, _)| n == "boto3" || n == "pip"), "{env}");
}

#[test]
fn the_machine_is_recorded_and_no_gpu_means_no_gpu_fields() {
    let p = Project::new();
    let out = p.roar(["run", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let env = env_json(&p, "1");
    let rt = &env["runtime"];
    assert!(rt["cpus"].as_u64().unwrap() >= 1, "{rt}");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(rt["kernel"], kernel.trim());
    assert_eq!(rt["arch"], std::env::consts::ARCH);
    assert!(rt["memory_bytes"].as_u64().unwrap() > 0);
    if !Path::new("/proc/driver/nvidia").exists() {
        assert!(rt.get("gpus").is_none(), "{rt}");
    }
    // `true` is a dpkg package's program on Debian: that package is recorded.
    if Path::new("/var/lib/dpkg/status").exists() {
        let owner = sh(p.path(), "dpkg -S \"$(readlink -f \"$(command -v true)\")\" 2>/dev/null | cut -d: -f1 | head -1 || true");
        if !owner.is_empty() {
            assert!(
                packages(&env, "dpkg").iter().any(|(n, _)| *n == owner),
                "{owner}: {env}"
            );
        }
    }
    let text = stdout(&p.roar(["show", "1", "--env"]));
    assert!(
        text.contains("machine") && text.contains(kernel.trim()),
        "{text}"
    );
}

#[test]
fn a_dirty_tree_keeps_its_diff_and_the_patch_restores_the_code() {
    let p = Project::new();
    let root = p.path();
    p.write("model.py", b"lr = 0.1\n");
    p.write(".gitignore", b".roar/\n");
    sh(
        root,
        "git init -q && git remote add origin https://alice:s3cr3t-token@git.example.com/team/model.git && git add -A && git commit -qm init",
    );
    // Clean tree: no patch.
    assert!(p.roar(["run", "cat", "model.py"]).status.success());
    let clean = p.roar(["show", "1", "--patch"]);
    assert!(!clean.status.success());
    assert!(stderr(&clean).contains("clean tree"), "{}", stderr(&clean));
    // Dirty tree: a tracked edit, a staged new file and a binary change.
    p.write("model.py", b"lr = 0.01  # tuned\n");
    p.write("extra.py", b"x = 1\n");
    p.write("weights.bin", &[0u8, 159, 146, 150, 255, 0, 1]);
    sh(root, "git add extra.py weights.bin");
    let out = p.roar(["run", "--", "sh", "-c", "cat model.py > out.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let env = env_json(&p, "2");
    let git = &env["git"];
    assert_eq!(git["dirty"], true);
    assert_eq!(
        git["remote"], "https://git.example.com/team/model.git",
        "credentials stripped"
    );
    let diff_hash = git["diff"].as_str().unwrap().to_owned();
    let db = std::fs::read(root.join(".roar/roar.db")).unwrap();
    assert!(!String::from_utf8_lossy(&db).contains("s3cr3t-token"));

    let patch = p.roar(["show", "2", "--patch"]);
    assert!(patch.status.success(), "{}", stderr(&patch));
    assert_eq!(
        blake3::hash(&patch.stdout).to_hex().to_string(),
        diff_hash,
        "the patch is the recorded blob"
    );
    // Back to the commit, then the patch: the exact tree the job ran in.
    std::fs::write(root.join("job2.patch"), &patch.stdout).unwrap();
    sh(
        root,
        "git reset -q --hard && git clean -qfd -e .roar -e job2.patch -e out.txt",
    );
    assert_eq!(std::fs::read(root.join("model.py")).unwrap(), b"lr = 0.1\n");
    sh(root, "git apply --index job2.patch");
    assert_eq!(
        std::fs::read(root.join("model.py")).unwrap(),
        b"lr = 0.01  # tuned\n"
    );
    assert_eq!(std::fs::read(root.join("extra.py")).unwrap(), b"x = 1\n");
    assert_eq!(
        std::fs::read(root.join("weights.bin")).unwrap(),
        [0u8, 159, 146, 150, 255, 0, 1]
    );
    // The reproduce script applies it too.
    let script = stdout(&p.roar(["reproduce", "out.txt"]));
    assert!(
        script.contains("roar show @2 --patch | git apply"),
        "{script}"
    );
    // Forgetting the job frees its diff.
    let blobs = || -> i64 {
        let conn = roar_store::open(&root.join(".roar/roar.db"), false).unwrap();
        conn.query_row("SELECT count(*) FROM blobs", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(blobs(), 1);
    assert!(p.roar(["rm", "2"]).status.success());
    assert_eq!(blobs(), 0);
}

#[test]
fn diff_reports_the_changed_parameter_first() {
    let p = Project::new();
    p.write("train.sh", b"echo \"$@\" > out.txt\n");
    for lr in ["0.1", "0.01"] {
        let out = p.roar([
            "run",
            "--",
            "sh",
            "train.sh",
            "--lr",
            lr,
            "--epochs=5",
            "seed=1",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = p.roar(["diff", "1", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let first = text.lines().nth(2).unwrap_or_default();
    assert_eq!(first, "parameters  lr: 0.1 -> 0.01", "{text}");
    let json: Value = serde_json::from_slice(&p.roar(["diff", "1", "2", "--json"]).stdout).unwrap();
    assert_eq!(
        json["parameters"],
        serde_json::json!([{"name": "lr", "a": "0.1", "b": "0.01"}])
    );
    let env = env_json(&p, "2");
    let params: Vec<(String, String)> = env["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["name"].as_str().unwrap().into(),
                x["value"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        params,
        vec![
            ("#1".into(), "train.sh".into()),
            ("lr".into(), "0.01".into()),
            ("epochs".into(), "5".into()),
            ("seed".into(), "1".into()),
        ]
    );
}

#[test]
fn exports_carry_parameters_and_packages_and_keep_the_job_name() {
    if !common::require_python_modules(&["openlineage.client", "prov", "jsonschema"]) {
        return;
    }
    let p = Project::new();
    p.write(
        "train.py",
        b"import sys, json\nopen('model.txt', 'w').write(sys.argv[-1])\n",
    );
    p.write(".gitignore", b".roar/\nmodel.txt\n");
    sh(
        p.path(),
        "git init -q && git remote add origin https://git.example.com/team/x.git && git add -A && git commit -qm i",
    );
    for lr in ["0.1", "0.01"] {
        let out = p.roar(["run", "--", "python3", "train.py", "--lr", lr]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = p.roar(["export", "--all", "--format", "openlineage"]);
    assert!(out.status.success(), "{}", stderr(&out));
    common::validate_export("openlineage", &out.stdout);
    let events: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["job"]["name"].as_str().unwrap())
        .collect();
    assert!(names.iter().all(|n| *n == "python3 train.py"), "{names:?}");
    let lrs: Vec<&str> = events
        .iter()
        .map(|e| {
            e["run"]["facets"]["parameters"]["parameters"]["lr"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(lrs, ["0.1", "0.1", "0.01", "0.01"]);
    let code = &events[0]["job"]["facets"]["sourceCodeLocation"];
    assert_eq!(code["url"], "https://git.example.com/team/x.git", "{code}");
    assert_eq!(code["type"], "git");
    let packages = &events[0]["run"]["facets"]["environment"]["packages"];
    assert!(
        packages
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["kind"] == "interpreter" && p["name"] == "python"),
        "{packages}"
    );
    let out = p.roar(["export", "--all", "--format", "prov-json"]);
    common::validate_export("prov-json", &out.stdout);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let act = doc["activity"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    assert_eq!(
        act["roar:parameters"],
        serde_json::json!(["#1=train.py", "lr=0.1"])
    );
    assert!(act["roar:packages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p.as_str().unwrap().starts_with("interpreter:python==")));
}

/// The dirty check runs beside the command as a child of roar, which is a subreaper whose tracers
/// wait for any child: a git reaped by them once made a dirty tree read as clean (1 run in 6).
#[test]
fn the_dirty_check_survives_every_backend_in_a_loop() {
    let p = Project::new();
    let root = p.path();
    p.write("m.py", b"a\n");
    p.write(".gitignore", b".roar/\nout.txt\n");
    sh(root, "git init -q && git add -A && git commit -qm x");
    p.write("m.py", b"b\n");
    let mut backends = vec!["preload", "ptrace"];
    if common::ebpf_available() {
        backends.push("ebpf");
    }
    let mut diffs = std::collections::BTreeSet::new();
    for backend in backends {
        for _ in 0..6 {
            let out = p.roar([
                "run",
                "--tracer",
                backend,
                "--json",
                "--",
                "sh",
                "-c",
                "cat m.py > out.txt",
            ]);
            assert!(out.status.success(), "{}", stderr(&out));
            let job = p.last_job();
            let git = &env_json(&p, &job["id"].to_string())["git"];
            assert_eq!(git["dirty"], true, "{backend}: {git}");
            diffs.insert(git["diff"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(diffs.len(), 1, "one tree, one diff: {diffs:?}");
}

/// A dirty tree whose changes add a secret: the diff is not kept (a redacted patch would not
/// apply), the job still says the tree was dirty, and the secret is nowhere in the store.
#[test]
fn a_diff_that_adds_a_secret_is_not_kept() {
    let p = Project::new();
    let root = p.path();
    p.write("settings.py", b"DEBUG = False\n");
    p.write(".gitignore", b".roar/\n");
    sh(root, "git init -q && git add -A && git commit -qm x");
    let secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY";
    p.write(
        "settings.py",
        format!("DEBUG = False\nAWS_SECRET_ACCESS_KEY = \"{secret}\"\n").as_bytes(),
    );
    let out = p.roar(["run", "cat", "settings.py"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let git = &env_json(&p, "1")["git"];
    assert_eq!(git["dirty"], true, "{git}");
    assert!(git.get("diff").is_none(), "{git}");
    let patch = p.roar(["show", "1", "--patch"]);
    assert!(!patch.status.success());
    assert!(
        stderr(&patch).contains("held a secret"),
        "{}",
        stderr(&patch)
    );
    for f in ["roar.db", "roar.db-wal"] {
        let bytes = std::fs::read(root.join(".roar").join(f)).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&bytes).contains(secret), "{f}");
    }
    // An ordinary edit next to it is kept.
    p.write("settings.py", b"DEBUG = True\n");
    assert!(p.roar(["run", "cat", "settings.py"]).status.success());
    assert!(env_json(&p, "2")["git"]["diff"].is_string());
}
