//! Rendering the lineage graph for people: text and Graphviz, with directories of many files of
//! one role collapsed into one node (`ckpt/ (100 files)`) unless asked to expand them.
//!
//! A node is a file version, keyed by (location, producer); a collapsed node is the versions one
//! producer (or none, for root inputs) left in one directory, so the checkpoints a training job
//! wrote are one node and the evaluation that read one of them points at it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use roar_store::{shell_join, Dag, Edge, Step, Store};

use crate::fmt::{self, bold, rel, short_hash};

/// A step lists at most this many files of one directory before they are shown as one line.
pub const COLLAPSE_AT: usize = 6;
/// Inputs and outputs a text listing shows per step before "... N more".
const SHOWN_INPUTS: usize = 12;
const SHOWN_OUTPUTS: usize = 6;

/// The project's whole graph as `roar dag`, `roar ui` and `roar dag --html` show it: every step,
/// re-runs marked by [`Dag::fold_reruns`] — the runs of one command are its steps of one name
/// (`--name`, else the script's) in one directory; a step of a job goes by its own command.
pub fn project_dag(store: &Store) -> anyhow::Result<Dag> {
    let mut dag = store.dag(None)?;
    dag.fold_reruns(|s| {
        let argv: Vec<String> = s
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let name = if s.step.is_some() {
            None
        } else {
            s.name.as_deref()
        };
        let run = roar_env::params::run_name(name, &argv).unwrap_or_else(|| shell_join(&s.argv));
        format!("{run}\0{}", s.cwd)
    });
    Ok(dag)
}

/// Which directories are shown expanded.
#[derive(Debug, Clone, Default)]
pub struct Expand {
    pub all: bool,
    pub dirs: Vec<PathBuf>,
}

impl Expand {
    /// Whether nothing is expanded: every directory of many outputs is one line, so a lineage
    /// can count them rather than read each (`Outputs::Collapsed`).
    pub fn collapses_all(&self) -> bool {
        !self.all && self.dirs.is_empty()
    }

    fn keeps(&self, dir: &str) -> bool {
        self.all || self.dirs.iter().any(|d| Path::new(dir).starts_with(d))
    }
}

/// The directories collapsed in this graph: those holding `COLLAPSE_AT` or more files of one
/// role of one step (a lineage read with `Outputs::Collapsed` counts such outputs in
/// `output_dirs`).
pub fn collapsed(steps: &[Step], expand: &Expand) -> HashSet<String> {
    let mut out = HashSet::new();
    for s in steps {
        for edges in [&s.inputs, &s.outputs] {
            let mut count: HashMap<&str, usize> = HashMap::new();
            for e in edges.iter() {
                *count.entry(parent(&e.path)).or_default() += 1;
            }
            out.extend(
                count
                    .into_iter()
                    .filter(|(d, n)| *n >= COLLAPSE_AT && !expand.keeps(d))
                    .map(|(d, _)| d.to_owned()),
            );
        }
        out.extend(s.output_dirs.iter().map(|(d, _)| d.clone()));
    }
    out
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) => "/",
        Some(i) => &path[..i],
        None => "",
    }
}

/// One line of a step's listing: a file version, or the versions of one producer in a collapsed
/// directory.
enum Item<'a> {
    File(&'a Edge),
    Dir {
        dir: &'a str,
        files: usize,
        producer: Option<Node>,
    },
}

/// A producer: a job, or one of its steps.
type Node = (i64, Option<u32>);

fn producer(e: &Edge) -> Option<Node> {
    e.producer.map(|j| (j, e.producer_step))
}

/// `job 3`, or `job 3 step 2`.
pub fn title(job: i64, step: Option<u32>) -> String {
    match step {
        Some(s) => format!("job {job} step {s}"),
        None => format!("job {job}"),
    }
}

/// The Graphviz name of a job or step box.
fn box_key(job: i64, step: Option<u32>) -> String {
    format!("j{}", roar_store::node_name(job, step))
}

/// A step's files as listed: each file not in a collapsed directory, then a line per collapsed
/// directory and producer; `counted` are directories whose files were counted, not read.
fn items<'a>(
    edges: &'a [Edge],
    counted: &'a [(String, usize)],
    dirs: &HashSet<String>,
) -> Vec<Item<'a>> {
    let mut groups: BTreeMap<(&str, Option<Node>), usize> = BTreeMap::new();
    for (dir, n) in counted {
        *groups.entry((dir.as_str(), None)).or_default() += n;
    }
    let mut out = Vec::new();
    for e in edges {
        let d = parent(&e.path);
        if dirs.contains(d) {
            *groups.entry((d, producer(e))).or_default() += 1;
        } else {
            out.push(Item::File(e));
        }
    }
    out.extend(
        groups
            .into_iter()
            .map(|((dir, producer), files)| Item::Dir {
                dir,
                files,
                producer,
            }),
    );
    out
}

/// A job's or step's command as listed, with a step's redirections (paths as `rel` shows them).
pub fn label(step: &Step, root: &Path) -> String {
    let name = step
        .name
        .as_deref()
        .map(|n| format!("[{}] ", fmt::shown(n)))
        .unwrap_or_default();
    let streams: String = step
        .streams
        .iter()
        .map(|r| format!(" {} {}", r.operator(), rel(&r.path, root)))
        .collect();
    format!("{name}{}{streams}", shell_join(&step.argv))
}

fn from(producer: Option<Node>) -> String {
    producer
        .map(|(j, s)| format!("  ({})", title(j, s)))
        .unwrap_or_default()
}

fn print_item(out: &mut impl Write, arrow: &str, item: &Item, root: &Path) -> std::io::Result<()> {
    match item {
        Item::File(e) => print_edge(out, arrow, e, root),
        Item::Dir {
            dir,
            files,
            producer,
        } => writeln!(
            out,
            "    {arrow} {:width$}  {}/ ({files} files){}",
            "",
            rel(dir, root),
            from(*producer),
            width = fmt::SHORT_HASH
        ),
    }
}

pub fn print_edge(out: &mut impl Write, arrow: &str, e: &Edge, root: &Path) -> std::io::Result<()> {
    let hash = e
        .hash
        .as_ref()
        .map(short_hash)
        .unwrap_or_else(|| "?".repeat(fmt::SHORT_HASH));
    let copy = e
        .copy_of
        .as_deref()
        .map(|c| format!("  = copy of {}", rel(c, root)))
        .unwrap_or_default();
    writeln!(
        out,
        "    {arrow} {hash}  {}{copy}{}",
        rel(&e.path, root),
        from(producer(e))
    )
}

struct Listing<'a> {
    arrow: &'a str,
    edges: &'a [Edge],
    counted: &'a [(String, usize)],
    max: usize,
    what: &'a str,
}

fn print_list(
    out: &mut impl Write,
    list: Listing,
    dirs: &HashSet<String>,
    root: &Path,
) -> std::io::Result<()> {
    let Listing {
        arrow,
        edges,
        counted,
        max,
        what,
    } = list;
    let items = items(edges, counted, dirs);
    for i in items.iter().take(max) {
        print_item(out, arrow, i, root)?;
    }
    if items.len() > max {
        let hidden: usize = items[max..]
            .iter()
            .map(|i| match i {
                Item::File(_) => 1,
                Item::Dir { files, .. } => *files,
            })
            .sum();
        writeln!(out, "    {arrow} ... {hidden} more {what}")?;
    }
    Ok(())
}

pub fn print_steps(
    out: &mut impl Write,
    steps: &[Step],
    expand: &Expand,
    root: &Path,
) -> std::io::Result<()> {
    let dirs = collapsed(steps, expand);
    for s in steps {
        writeln!(out, "{} {}", bold(&title(s.job_id, s.step)), label(s, root))?;
        let inputs = Listing {
            arrow: "<-",
            edges: &s.inputs,
            counted: &[],
            max: SHOWN_INPUTS,
            what: "inputs",
        };
        print_list(out, inputs, &dirs, root)?;
        let outputs = Listing {
            arrow: "->",
            edges: &s.outputs,
            counted: &s.output_dirs,
            max: SHOWN_OUTPUTS,
            what: "outputs",
        };
        print_list(out, outputs, &dirs, root)?;
    }
    Ok(())
}

/// A label's longest line in a drawing (the whole text is the node's tooltip): a graph as wide
/// as its longest command line cannot be read on a page.
const DOT_LINE: usize = 44;

fn clipped(s: &str) -> String {
    match s.char_indices().nth(DOT_LINE - 1) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Graphviz source: jobs are boxes, file versions (or collapsed directories) are notes. Every
/// edge joins two declared nodes (Graphviz would draw an undeclared end as a node labelled with
/// its internal key).
pub fn dot(steps: &[Step], expand: &Expand, root: &Path) -> String {
    let esc = roar_store::quote::dot_escaped;
    let dirs = collapsed(steps, expand);
    let mut s = String::from(
        "digraph roar {\n  rankdir=TB;\n  ranksep=0.3;\n  nodesep=0.2;\n  node [fontname=\"monospace\", fontsize=10];\n",
    );
    let boxes: HashSet<String> = steps.iter().map(|st| box_key(st.job_id, st.step)).collect();
    let mut declared = HashSet::new();
    for st in steps {
        let me = box_key(st.job_id, st.step);
        let earlier = match st.earlier_runs {
            0 => String::new(),
            n => format!("  (+{n} earlier runs)"),
        };
        let command = label(st, root);
        s += &format!(
            "  \"{me}\" [shape=box, style=bold, label=\"{}{earlier}\\n{}\", tooltip=\"{}\"];\n",
            title(st.job_id, st.step),
            esc(&clipped(&command)),
            esc(&command)
        );
        // A step inside its parent step, when the parent is drawn.
        if let (Some(_), Some(parent)) = (st.step, st.parent_step) {
            let up = box_key(st.job_id, Some(parent));
            if boxes.contains(&up) {
                s += &format!("  \"{up}\" -> \"{me}\" [style=dotted, arrowhead=none];\n");
            }
        }
        for item in items(&st.inputs, &[], &dirs) {
            let producer = match &item {
                Item::File(e) => producer(e),
                Item::Dir { producer, .. } => *producer,
            };
            let n = dot_node(&mut s, &mut declared, &item, producer, root);
            s += &format!("  \"{n}\" -> \"{me}\";\n");
            // The same bytes found at another location, from where its producer wrote them
            // (that version's node, or its collapsed directory's), when that node is drawn.
            if let (Item::File(e), Some((pj, ps))) = (&item, producer) {
                if let Some(from) = &e.copy_of {
                    let at = roar_store::node_name(pj, ps);
                    let source = [
                        format!("v{}@{at}", esc(from)),
                        format!("d{}@{at}", esc(parent(from))),
                    ]
                    .into_iter()
                    .find(|k| declared.contains(k));
                    if let Some(source) = source {
                        s +=
                            &format!("  \"{source}\" -> \"{n}\" [style=dashed, label=\"copy\"];\n");
                    }
                }
            }
        }
        for item in items(&st.outputs, &st.output_dirs, &dirs) {
            let n = dot_node(
                &mut s,
                &mut declared,
                &item,
                Some((st.job_id, st.step)),
                root,
            );
            s += &format!("  \"{me}\" -> \"{n}\";\n");
        }
    }
    s += "}\n";
    s
}

/// Declares a file version's (or a collapsed directory's) note once; returns its key.
fn dot_node(
    s: &mut String,
    declared: &mut HashSet<String>,
    item: &Item,
    producer: Option<Node>,
    root: &Path,
) -> String {
    let esc = roar_store::quote::dot_escaped;
    let at = producer.map_or("0".into(), |(j, st)| roar_store::node_name(j, st));
    let (key, path, second) = match item {
        Item::File(e) => {
            let hash = e
                .hash
                .as_ref()
                .map(short_hash)
                .unwrap_or_else(|| "?".into());
            (format!("v{}@{at}", esc(&e.path)), rel(&e.path, root), hash)
        }
        Item::Dir { dir, files, .. } => (
            format!("d{}@{at}", esc(dir)),
            format!("{}/", rel(dir, root)),
            format!("({files} files)"),
        ),
    };
    if declared.insert(key.clone()) {
        *s += &format!(
            "  \"{key}\" [shape=note, label=\"{}\\n{second}\", tooltip=\"{}\"];\n",
            esc(&clipped(&path)),
            esc(&path)
        );
    }
    key
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    use roar_store::ignore::Ignore;
    use roar_store::{ContentHash, FileRecord, JobRecord, Ops, Outputs, Role, Writer};

    use super::*;

    fn content(bytes: &[u8]) -> ContentHash {
        ContentHash {
            blake3: blake3::hash(bytes).to_hex().to_string(),
            sha256: None,
            size: bytes.len() as u64,
        }
    }

    fn file(role: Role, path: Vec<u8>, hash: Option<ContentHash>) -> FileRecord {
        FileRecord {
            role,
            path: PathBuf::from(OsString::from_vec(path)),
            hash,
            before: None,
            ops: match role {
                Role::Input => Ops::READ,
                _ => Ops::WRITE | Ops::CREATE,
            },
            first_ns: None,
            last_ns: None,
            s3: None,
        }
    }

    fn job(n: usize, files: Vec<FileRecord>) -> JobRecord {
        let argv = format!("step-{n}");
        let started_ns = 1_700_000_000_000_000_000 + n as i64 * 1_000_000;
        roar_store::testing::job(&[&argv], "/w", started_ns, files)
    }

    /// Seeded pipelines whose jobs write 0-14 files into each of a few directories (some of them
    /// noise, one name not UTF-8, some outputs copies of an input) and read earlier outputs: a
    /// lineage read with outputs collapsed lists exactly what reading every output lists, and
    /// each directory it counted holds that many of the step's outputs. `ROAR_GRAPH_SEED`
    /// replays a seed.
    #[test]
    fn a_listing_from_counted_outputs_is_the_listing_from_every_output() {
        let mut rng = roar_store::testing::Rng::from_env("ROAR_GRAPH_SEED", 20261201);
        let seed = rng.seed();
        let mut rnd = move |n: usize| rng.below(n);
        let dirs: [&[u8]; 6] = [
            b"/w/data",
            b"/w/ckpt",
            b"/w/pkg/__pycache__",
            b"/usr/lib",
            b"/w/odd\xff",
            b"",
        ];
        for case in 0..30 {
            let tmp = tempfile::tempdir().unwrap();
            let db = tmp.path().join("roar.db");
            roar_store::open(&db, true).unwrap();
            let writer = Writer::start(&db).unwrap();
            let mut made: Vec<(Vec<u8>, ContentHash)> = Vec::new();
            let mut last = Vec::new();
            for n in 0..1 + rnd(8) {
                let mut files = Vec::new();
                let mut read = Vec::new();
                for _ in 0..rnd(4).min(made.len()) {
                    let (p, h) = made[rnd(made.len())].clone();
                    read.push(h.clone());
                    files.push(file(Role::Input, p, Some(h)));
                }
                for d in dirs {
                    for k in 0..[0, 1, 5, 6, 7, 14][rnd(6)] {
                        let mut p = d.to_vec();
                        p.extend_from_slice(format!("/f{n}-{k}.pyc").as_bytes());
                        if rnd(3) > 0 {
                            p.truncate(p.len() - 4);
                        }
                        let hash = match rnd(5) {
                            0 if !read.is_empty() => Some(read[rnd(read.len())].clone()),
                            1 => None,
                            _ => Some(content(&p)),
                        };
                        if let Some(h) = &hash {
                            made.push((p.clone(), h.clone()));
                            last = p.clone();
                        }
                        files.push(file(Role::Output, p, hash));
                    }
                }
                writer.record_job(job(n, files)).unwrap();
            }
            writer.flush().unwrap();
            if last.is_empty() {
                continue;
            }
            let mut store = Store::open(&db).unwrap();
            store.hide(Some(Ignore::new(&[]))).unwrap();
            let target = store
                .version_at(Path::new(&OsString::from_vec(last)))
                .unwrap();
            let every = store.lineage_with(&target, Outputs::Every).unwrap();
            let counted = store
                .lineage_with(&target, Outputs::Collapsed { at: COLLAPSE_AT })
                .unwrap();
            let listing = |steps: &[Step]| {
                let mut out = Vec::new();
                print_steps(&mut out, steps, &Expand::default(), Path::new("/w")).unwrap();
                String::from_utf8(out).unwrap()
            };
            assert_eq!(
                listing(&counted.steps),
                listing(&every.steps),
                "case {case} (ROAR_GRAPH_SEED={seed})"
            );
            for (c, e) in counted.steps.iter().zip(&every.steps) {
                let mut per_dir: HashMap<&str, usize> = HashMap::new();
                for o in &e.outputs {
                    *per_dir.entry(parent(&o.path)).or_default() += 1;
                }
                for (dir, n) in &c.output_dirs {
                    assert_eq!(
                        per_dir.get(dir.as_str()),
                        Some(n),
                        "case {case} (ROAR_GRAPH_SEED={seed}): {dir}"
                    );
                    assert!(*n >= COLLAPSE_AT);
                }
                let listed: Vec<&Edge> = e
                    .outputs
                    .iter()
                    .filter(|o| per_dir[parent(&o.path)] < COLLAPSE_AT)
                    .collect();
                assert_eq!(
                    serde_json::to_string(&c.outputs).unwrap(),
                    serde_json::to_string(&listed).unwrap(),
                    "case {case} (ROAR_GRAPH_SEED={seed})"
                );
                assert_eq!(
                    serde_json::to_string(&c.inputs).unwrap(),
                    serde_json::to_string(&e.inputs).unwrap()
                );
            }
        }
    }
}
