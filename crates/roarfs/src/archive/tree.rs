//! The tree an archive union shows: one node per entry, inode numbers their positions (the
//! same on every mount of the same layers); later layers win where paths collide.

use std::collections::{BTreeMap, HashMap};

use roar_archive::Kind;

use super::Layer;

pub(super) enum What {
    Dir {
        children: BTreeMap<Vec<u8>, u64>,
        /// The archive's own entry for the directory (its mode, owner, time), if it has one.
        member: Option<(usize, usize)>,
    },
    Member {
        source: usize,
        member: usize,
    },
}

pub(super) struct Node {
    pub parent: u64,
    pub what: What,
}

/// The nodes of the union of `layers`, each directory's link count, and each file's
/// `NAME.versions/` directory by the file's inode.
pub(super) fn build(layers: &[Layer]) -> (Vec<Node>, Vec<u32>, HashMap<u64, u64>) {
    let mut nodes = vec![Node {
        parent: 1,
        what: What::Dir {
            children: BTreeMap::new(),
            member: None,
        },
    }];
    for (s, layer) in layers.iter().enumerate() {
        let (at, entries) = match layer {
            Layer::Archive(p) => (&p.at[..], &p.source.index.members),
            Layer::Folder(f) => (&[][..], &f.entries),
        };
        if !at.is_empty() {
            // An archive inside another: a directory where its member was.
            insert(&mut nodes, at, Kind::Dir, None);
        }
        for (m, member) in entries.iter().enumerate() {
            let path = if at.is_empty() {
                member.path.clone()
            } else {
                [at, b"/", &member.path].concat()
            };
            insert(&mut nodes, &path, member.kind, Some((s, m)));
        }
    }
    let mut dir_links = vec![0u32; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        if let What::Dir { .. } = n.what {
            dir_links[i] += 2;
            if i > 0 {
                dir_links[n.parent as usize - 1] += 1;
            }
        }
    }
    let versions = add_versions(&mut nodes, layers);
    // A versions directory is not listed: it adds no link to its parent.
    dir_links.resize(nodes.len(), 2);
    (nodes, dir_links, versions)
}

/// Adds a hidden `NAME.versions/` directory for each file shown whose archive lists it more than
/// once, holding `1`..`n` (oldest first; `n` is the file shown); gives them by the file's inode.
fn add_versions(nodes: &mut Vec<Node>, layers: &[Layer]) -> HashMap<u64, u64> {
    let earlier: Vec<_> = (layers.iter())
        .map(|l| match l {
            Layer::Archive(p) => p.source.index.earlier_by_path(),
            Layer::Folder(_) => HashMap::new(),
        })
        .collect();
    let mut out = HashMap::new();
    if earlier.iter().all(|e| e.is_empty()) {
        return out;
    }
    for i in 0..nodes.len() {
        let (parent, (s, m)) = match nodes[i].what {
            What::Member { source, member } => (nodes[i].parent, (source, member)),
            What::Dir { .. } => continue,
        };
        let Layer::Archive(p) = &layers[s] else {
            continue;
        };
        let Some(older) = earlier[s].get(p.source.index.entry(m).path.as_slice()) else {
            continue;
        };
        let dir = nodes.len() as u64 + 1;
        let mut children = BTreeMap::new();
        for k in 0..=older.len() {
            children.insert((k + 1).to_string().into_bytes(), dir + 1 + k as u64);
        }
        nodes.push(Node {
            parent,
            what: What::Dir {
                children,
                member: None,
            },
        });
        for &e in older.iter().chain([&m]) {
            nodes.push(Node {
                parent: dir,
                what: What::Member {
                    source: s,
                    member: e,
                },
            });
        }
        out.insert(i as u64 + 1, dir);
    }
    out
}

/// Adds an entry at `path` to the tree, creating the directories above it: member `m` of
/// archive `s` (`entry`), or with no entry, the directory a nested archive is mounted as.
fn insert(nodes: &mut Vec<Node>, path: &[u8], kind: Kind, entry: Option<(usize, usize)>) {
    let parts: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
    let mut cur = 1u64;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let existing = match &nodes[cur as usize - 1].what {
            What::Dir { children, .. } => children.get(*part).copied(),
            What::Member { .. } => unreachable!("descending only through directories"),
        };
        let dir_here = !last || kind == Kind::Dir;
        let leaf = || match entry {
            Some((source, member)) if !dir_here => What::Member { source, member },
            _ => What::Dir {
                children: BTreeMap::new(),
                member: entry.filter(|_| last),
            },
        };
        match existing {
            None => {
                let ino = nodes.len() as u64 + 1;
                nodes.push(Node {
                    parent: cur,
                    what: leaf(),
                });
                if let What::Dir { children, .. } = &mut nodes[cur as usize - 1].what {
                    children.insert(part.to_vec(), ino);
                }
                cur = ino;
            }
            Some(at) => {
                let node = &mut nodes[at as usize - 1].what;
                match node {
                    What::Dir { .. } if !last => {}
                    What::Dir { children, .. } if !dir_here && !children.is_empty() => {
                        tracing::warn!(
                            "roarfs: {} is a file in a later archive and a directory with entries in an earlier one; the directory is kept",
                            roar_store::quote::shown(&String::from_utf8_lossy(path))
                        );
                        return;
                    }
                    // A directory's own entry taken; a directory without one keeps none.
                    What::Dir { member, .. } if dir_here => {
                        if entry.is_some() {
                            *member = entry;
                        }
                    }
                    // The later entry wins (a file replaced by a file, a directory or the
                    // directories above a later member).
                    _ => *node = leaf(),
                }
                cur = at;
            }
        }
    }
}
