//! What `roar run` adds to a job's record about its environment, once the command has ended:
//! the dirty tree's diff (from the `git diff` that ran alongside the command), the packages the
//! job used (found from the files it loaded), and the machine (probed once per boot). See
//! roar_env.

use std::io::Write;
use std::path::{Path, PathBuf};

use roar_env::git::{DiffJob, Dirt};
use roar_env::Cache;
use roar_store::environment::blake3_hex;
use roar_store::{Environment, EnvironmentDetail, JobDetail, JobRecord, Runtime};
use roar_tracer::collect::Classified;

use crate::fmt::{bold, shown};
pub use roar_env::wanted::{resolve, Wanted};

/// The package cache opened and the machine read (or probed) on a thread of their own while the
/// command runs: neither is on the command's start, and only the join is on roar's exit. A run
/// whose job goes to the resident recorder needs neither: the recorder keeps both.
pub struct Prepared(std::thread::JoinHandle<(Cache, Runtime)>);

pub fn prepare() -> Option<Prepared> {
    std::thread::Builder::new()
        .name("roar-env".into())
        .spawn(|| {
            let cache = Cache::open();
            let machine = roar_env::machine(&cache);
            (cache, machine)
        })
        .ok()
        .map(Prepared)
}

impl Prepared {
    /// The cache and the machine, from the thread if it ran, else read now.
    pub fn take(prepared: Option<Prepared>) -> (Cache, Runtime) {
        prepared.and_then(|p| p.0.join().ok()).unwrap_or_else(|| {
            let cache = Cache::open();
            let machine = roar_env::machine(&cache);
            (cache, machine)
        })
    }
}

/// What the packages of a job are found from, once its command has ended and its events are
/// classified: for [`resolve`], here or in the recorder, which can start on it while the run
/// finishes the rest of the record.
pub fn wanted(
    job: &JobRecord,
    classified: &Classified,
    packages: bool,
    shim: Option<&Path>,
) -> Wanted {
    if !packages {
        return Wanted::default();
    }
    let mut programs: Vec<PathBuf> = job.processes.iter().filter_map(|p| p.exe.clone()).collect();
    programs.sort();
    programs.dedup();
    Wanted {
        packages,
        files: classified.environment.clone(),
        inputs: classified.read_paths().map(Path::to_owned).collect(),
        programs,
        exclude: shim
            .map(Path::to_owned)
            .into_iter()
            .chain(std::env::current_exe().ok())
            .collect(),
    }
}

/// After the command has ended: the dirty state of `job.git` and the tree's diff (from the
/// `git diff` that ran alongside the command) go into `job.environment`.
pub fn capture(job: &mut JobRecord, diff: Option<DiffJob>) {
    let mut env = Environment::default();
    if let (Some(git), Some(Dirt::Dirty(bytes))) =
        (job.git.as_mut(), diff.and_then(DiffJob::finish))
    {
        git.dirty = true;
        git.diff = bytes.as_deref().map(blake3_hex);
        if bytes.is_none() {
            tracing::warn!(
                "the tree's diff is over {} MiB: recorded as dirty, not kept",
                roar_env::git::MAX_DIFF >> 20
            );
        }
        env.diff = bytes;
    }
    job.environment = Some(env);
}

/// `N packages, python 3.11.7, Debian 12 on 2 CPUs`: the environment in `roar show`'s header.
pub fn one_line(e: &EnvironmentDetail) -> String {
    let mut parts = Vec::new();
    let count = |kind: &str| e.packages.iter().filter(|p| p.kind == kind).count();
    let (py, deb) = (count("python"), count("dpkg"));
    if py > 0 {
        parts.push(format!("{py} python"));
    }
    if deb > 0 {
        parts.push(format!("{deb} dpkg"));
    }
    for p in e.packages.iter().filter(|p| p.kind == "interpreter") {
        parts.push(format!("{} {}", p.name, p.version));
    }
    if let Some(rt) = &e.runtime {
        let mut m = rt.os.clone().unwrap_or_else(|| "unknown OS".into());
        m.push_str(&format!(", {} CPUs", rt.cpus));
        if !rt.gpus.is_empty() {
            m.push_str(&format!(", {} GPUs", rt.gpus.len()));
        }
        parts.push(m);
    }
    parts.join(", ")
}

/// `roar show JOB --env`.
pub fn show(job: &JobDetail, json: bool) -> anyhow::Result<()> {
    let s = &job.summary;
    let params = roar_env::params::of_argv(&s.argv);
    let e = &job.environment;
    if json {
        return crate::fmt::print_json(&serde_json::json!({
            "job": s.id,
            "parameters": params,
            "git": s.git,
            "runtime": e.runtime,
            "packages": e.packages,
        }));
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} {}",
        bold(&format!("job {}", s.id)),
        crate::fmt::argv(&s.argv)
    )?;
    if !params.is_empty() {
        writeln!(out, "{}", bold("parameters"))?;
        for p in &params {
            writeln!(out, "  {:<20} {}", shown(&p.name), shown(&p.value))?;
        }
    }
    print_code(&mut out, s.git.as_ref())?;
    if let Some(rt) = &e.runtime {
        print_machine(&mut out, rt)?;
    }
    if !e.packages.is_empty() {
        print_packages(&mut out, &e.packages)?;
    }
    Ok(())
}

/// The code section: commit, branch, remote and whether the tree was clean.
fn print_code(out: &mut impl Write, git: Option<&roar_store::GitState>) -> std::io::Result<()> {
    writeln!(out, "{}", bold("code"))?;
    match git {
        None => writeln!(out, "  not in a git work tree")?,
        Some(g) => {
            writeln!(
                out,
                "  commit     {}",
                g.commit.as_deref().unwrap_or("(none yet)")
            )?;
            writeln!(
                out,
                "  branch     {}",
                g.branch.as_deref().unwrap_or("(detached)")
            )?;
            if let Some(r) = &g.remote {
                writeln!(out, "  remote     {}", shown(r))?;
            }
            let state = match (g.dirty, &g.diff) {
                (false, _) => "clean".to_owned(),
                (true, Some(d)) => format!(
                    "dirty; diff {} kept (`roar reproduce` applies it)",
                    &d[..12.min(d.len())]
                ),
                (true, None) => {
                    "dirty; the diff was not kept (a secret in an added line, over 64 MiB, or env.diff = false)"
                        .to_owned()
                }
            };
            writeln!(out, "  tree       {state}")?;
        }
    }
    Ok(())
}

/// The machine section: host, OS, kernel, CPUs, memory, container, VM and GPUs.
fn print_machine(
    out: &mut impl Write,
    rt: &roar_store::environment::Runtime,
) -> std::io::Result<()> {
    writeln!(out, "{}", bold("machine"))?;
    let mut row = |k: &str, v: Option<String>| match v {
        Some(v) => writeln!(out, "  {k:<10} {}", shown(&v)),
        None => Ok(()),
    };
    row("host", rt.hostname.clone())?;
    row("os", rt.os.clone())?;
    row("kernel", rt.kernel.clone())?;
    row(
        "cpu",
        Some(format!(
            "{} x {}",
            rt.cpus,
            rt.cpu_model.as_deref().unwrap_or("unknown")
        )),
    )?;
    row("arch", rt.arch.clone())?;
    row("memory", rt.memory_bytes.map(crate::fmt::size))?;
    row("container", rt.container.clone())?;
    row("vm", rt.virtualization.clone())?;
    for g in &rt.gpus {
        let mut v = g.model.clone();
        if let Some(d) = &g.driver {
            v.push_str(&format!(", driver {d}"));
        }
        if let Some(c) = &g.cuda {
            v.push_str(&format!(", CUDA {c}"));
        }
        row("gpu", Some(v))?;
    }
    Ok(())
}

/// The packages section, one line each with where it came from.
fn print_packages(
    out: &mut impl Write,
    packages: &[roar_store::environment::Package],
) -> std::io::Result<()> {
    writeln!(out, "{} ({})", bold("packages"), packages.len())?;
    for p in packages {
        let mut extra = Vec::new();
        if let Some(i) = &p.installer {
            extra.push(i.clone());
        }
        if p.kind != "dpkg" {
            if let Some(l) = &p.location {
                extra.push(l.clone());
            }
        }
        if let Some(c) = &p.commit {
            extra.push(format!("commit {}", &c[..12.min(c.len())]));
        }
        let extra = if extra.is_empty() {
            String::new()
        } else {
            format!("  ({})", extra.join(", "))
        };
        writeln!(
            out,
            "  {:<12} {:<32} {}{}",
            p.kind,
            shown(&p.name),
            shown(&p.version),
            shown(&extra)
        )?;
    }
    Ok(())
}
