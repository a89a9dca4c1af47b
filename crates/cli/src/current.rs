//! The content files have now, hashed through the store's hash cache, and the cache told of the
//! new hashes: what `roar status` and `roar reproduce` compare the record with.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use roar_store::hash::{hash_paths, HashOptions, Prior};
use roar_store::{ContentHash, Store};

/// Current content of `paths` (hash cache first), keyed by path; missing files are absent.
pub(crate) fn current_hashes(
    store: &Store,
    paths: &[PathBuf],
    sha256: bool,
) -> HashMap<PathBuf, ContentHash> {
    let batch = hash_paths(
        paths,
        HashOptions { sha256 },
        &|_| Prior::MayBeCached,
        &|| Some(store.conn()),
        &|_| {},
    );
    let mut out = HashMap::new();
    for (p, r) in paths.iter().zip(batch.results) {
        if let Ok(h) = r {
            out.insert(p.clone(), h.hash);
        }
    }
    remember(store, batch.new_cache);
    out
}

/// Saves hashes computed by a query in the hash cache: the next status or reproduce is cheap.
pub(crate) fn remember(store: &Store, entries: Vec<roar_store::CacheEntry>) {
    if entries.is_empty() {
        return;
    }
    if let Some(Ok(w)) = store
        .conn()
        .path()
        .map(|p| roar_store::Writer::start(Path::new(p)))
    {
        let _ = w.cache(entries);
    }
}
