//! Reads the members listed in a file (one path per line, `./` allowed) from an archive in
//! process, front to back, and prints how long that took: the decoding cost of `roar mount`'s
//! reads without FUSE (bench/archive.sh measures them through it). With `VERIFY=1`, each member's
//! bytes are hashed too (outside the time) and must be what the index says.
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, archive, list, cache] = args.as_slice() else {
        eprintln!("usage: read_members ARCHIVE MEMBER-LIST INDEX-DIR");
        std::process::exit(2);
    };
    let (index, _) =
        roar_archive::cache::open(archive.as_ref(), cache.as_ref(), &|_| {}).expect("index");
    let by_path: std::collections::HashMap<Vec<u8>, usize> = (index.members.iter().enumerate())
        .map(|(i, m)| (m.path.clone(), i))
        .collect();
    let source = roar_archive::read::Source::open(index).expect("open");
    let names = std::fs::read_to_string(list).expect("list");
    let verify = std::env::var_os("VERIFY").is_some();
    let mut hashing = std::time::Duration::ZERO;
    let t = Instant::now();
    let mut bytes = 0u64;
    let mut buf = vec![0u8; 128 << 10];
    for name in names.lines() {
        let m = by_path[name.trim_start_matches("./").as_bytes()];
        let mut r = source.reader(m);
        let mut off = 0u64;
        let mut hash = blake3::Hasher::new();
        loop {
            let n = r.read_at(&source, off, &mut buf).expect("read");
            if n == 0 {
                break;
            }
            if verify {
                let h = Instant::now();
                hash.update(&buf[..n]);
                hashing += h.elapsed();
            }
            off += n as u64;
        }
        if verify {
            let want = source.index.members[m].blake3;
            assert_eq!(*hash.finalize().as_bytes(), want, "{name}: not its content");
        }
        bytes += off;
        source.park(r);
    }
    println!(
        "{} members, {} MiB in {:.0} ms",
        names.lines().count(),
        bytes >> 20,
        (t.elapsed() - hashing).as_secs_f64() * 1e3
    );
}
