//! `roar gc`: the object store's bodies nothing needs, removed; kept versions let go to fit the
//! project's budget.

use roar_store::Store;

/// `roar gc`: drops the object store's blobs that nothing needs: no object version, upload,
/// recorded version or pin.
pub fn gc(grace_secs: u64, json: bool) -> anyhow::Result<()> {
    let project = crate::project()?;
    let root = project.dir().join("s3");
    if !root.join("blobs").exists() {
        if json {
            return crate::fmt::print_json(
                &serde_json::json!({"blobs": 0, "bytes": 0, "temps": 0}),
            );
        }
        println!("no object store in {}", project.dir().display());
        return Ok(());
    }
    // Every version the record holds (kept file versions are such) and every pinned one.
    let store = Store::open(&project.db_path())?;
    let mut keep = store.recorded_hashes()?;
    let objects = project.objects();
    let pinned = objects.pinned();
    keep.extend(pinned.iter().cloned());
    let config = crate::config::Config::load(&project)?;
    let budget = (config.keep.budget_bytes > 0)
        .then(|| -> anyhow::Result<roar_gateway::Budget> {
            let mut protected = pinned;
            for job in objects.pinned_jobs() {
                protected.extend(store.job_hashes(job)?);
            }
            Ok(roar_gateway::Budget {
                bytes: config.keep.budget_bytes,
                protected,
            })
        })
        .transpose()?;
    let young_after = store
        .running_since()?
        .map(|ns| std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64));
    let done =
        roar_gateway::Embedded::open(&root)?.gc(&keep, grace_secs, budget.as_ref(), young_after)?;
    if json {
        return crate::fmt::print_json(&serde_json::json!({
            "blobs": done.blobs, "bytes": done.bytes, "temps": done.temps,
            "evicted": done.evicted, "evicted_bytes": done.evicted_bytes,
        }));
    }
    println!(
        "removed {} object bodies ({} bytes) and {} abandoned uploads' temp files; kept every body an object version, upload or recorded job needs",
        done.blobs, done.bytes, done.temps
    );
    if let Some(b) = &budget {
        println!(
            "let {} kept versions ({} bytes) go, least recently used first, to stay within {} bytes; pinned jobs' versions stay",
            done.evicted, done.evicted_bytes, b.bytes
        );
    }
    Ok(())
}
