//! Archives made by the real tools (tar, gzip, zstd, xz, bzip2, zip): every member indexed with the hash of
//! its bytes, and every byte readable at random offsets, equal to the files archived.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use roar_archive::read::Source;
use roar_archive::{cache, scan, Data, Format, Kind};

/// A small deterministic generator (xorshift): the same tree on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Files of many sizes (empty, tiny, one block, several MiB), compressible and not, with odd
/// names; returns relative path -> content.
fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut files = BTreeMap::new();
    let names = [
        "a.txt",
        "empty",
        "dir/with space.bin",
        "dir/sub/deep/ünï.json",
        "dir/sub/new\nline",
        "big/random.bin",
        "big/text.csv",
        "x/y/z/-dash",
    ];
    for (i, name) in names.iter().enumerate() {
        let size = match i {
            1 => 0,
            5 => 5 << 20,
            6 => 7 << 20,
            _ => rng.below(300_000) as usize,
        };
        let content: Vec<u8> = if i == 6 {
            (0..size)
                .map(|k| b"0123456789,abc\n"[(k * 7 + k / 13) % 15])
                .collect()
        } else {
            (0..size).map(|_| rng.next() as u8).collect()
        };
        files.insert(name.to_string(), content);
    }
    for i in 0..300 {
        let size = rng.below(40_000) as usize;
        let content = (0..size).map(|_| (rng.next() % 7) as u8 + b'a').collect();
        files.insert(format!("many/{:04}.dat", i), content);
    }
    for (name, content) in &files {
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    files
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Concatenates two independently compressed halves of `plain` (what pigz, bgzip and
/// multi-threaded zstd produce: several gzip members or zstd frames).
fn two_parts(plain: &Path, out: &Path, tool: &str) {
    let bytes = std::fs::read(plain).unwrap();
    let half = bytes.len() / 2;
    let mut joined = Vec::new();
    for (k, part) in [&bytes[..half], &bytes[half..]].iter().enumerate() {
        let p = out.with_extension(format!("part{k}"));
        std::fs::write(&p, part).unwrap();
        // xz at its fastest preset: the decoder's paths are the same, making it 7x faster.
        let fast = if tool == "xz" { "-0" } else { "-q" };
        run(Command::new(tool).arg("-q").arg(fast).arg("-f").arg(&p));
        let ext = match tool {
            "gzip" => "gz",
            "bzip2" => "bz2",
            "xz" => "xz",
            _ => "zst",
        };
        let z = PathBuf::from(format!("{}.{ext}", p.display()));
        joined.extend(std::fs::read(&z).unwrap());
    }
    std::fs::write(out, joined).unwrap();
}

fn check(archive: &Path, format: Format, files: &BTreeMap<String, Vec<u8>>, seed: u64) {
    check_reads(archive, format, files, seed, 400)
}

/// [`check`] with `reads` random slices (a file of one xz block decodes from its start for each).
fn check_reads(
    archive: &Path,
    format: Format,
    files: &BTreeMap<String, Vec<u8>>,
    seed: u64,
    reads: usize,
) {
    assert_eq!(
        Format::detect(archive).unwrap(),
        format,
        "{}",
        archive.display()
    );
    let index = scan::scan(archive, &|_| {}).unwrap();
    assert_eq!(index.format, format);
    assert_eq!(
        index.blake3,
        *blake3::hash(&std::fs::read(archive).unwrap()).as_bytes()
    );
    for (name, &i) in &file_members(&index, files) {
        let m = &index.members[i];
        assert_eq!(m.size, files[name].len() as u64, "{name}");
        assert_eq!(m.blake3, *blake3::hash(&files[name]).as_bytes(), "{name}");
    }
    let source = Source::open(index.clone()).unwrap();
    read_back(&source, files, seed, reads);
}

/// The index's file members by name, which must be exactly the files archived.
fn file_members(
    index: &roar_archive::Index,
    files: &BTreeMap<String, Vec<u8>>,
) -> BTreeMap<String, usize> {
    let got: BTreeMap<String, usize> = (index.members.iter().enumerate())
        .filter(|(_, m)| m.kind == Kind::File)
        .map(|(i, m)| (String::from_utf8(m.path.clone()).unwrap(), i))
        .collect();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        files.keys().collect::<Vec<_>>(),
        "{}: members",
        index.archive.display()
    );
    got
}

/// Every member of `source` read front to back in archive order, then `reads` random slices,
/// each equal to the file archived.
fn read_back(source: &Source, files: &BTreeMap<String, Vec<u8>>, seed: u64, reads: usize) {
    let archive = &source.index.archive;
    let got = file_members(&source.index, files);
    let mut rng = Rng(seed);
    // Whole members front to back in odd chunk sizes, in archive order (as a loader reads a
    // shard), then random slices of random members.
    let in_order: Vec<(&String, &usize)> = {
        let mut v: Vec<_> = got.iter().collect();
        v.sort_by_key(|(_, &i)| i);
        v
    };
    for (name, &i) in in_order {
        let want = &files[name];
        let mut r = source.reader(i);
        let mut back = Vec::new();
        let mut buf = vec![0u8; 1 + rng.below(200_000) as usize];
        loop {
            let n = r.read_at(source, back.len() as u64, &mut buf).unwrap();
            if n == 0 {
                break;
            }
            back.extend_from_slice(&buf[..n]);
        }
        assert!(
            back == *want,
            "{}: {name} read back differs",
            archive.display()
        );
        // As the mount does: the next member starts from where this one's decoder stopped.
        source.park(r);
    }
    let names: Vec<&String> = got.keys().collect();
    for _ in 0..reads {
        let name = names[rng.below(names.len() as u64) as usize];
        let want = &files[name];
        let off = rng.below(want.len() as u64 + 10);
        let len = rng.below(150_000) as usize;
        let mut r = source.reader(got[name]);
        let mut buf = vec![0u8; len];
        let n = r.read_at(source, off, &mut buf).unwrap();
        let from = (off as usize).min(want.len());
        let to = (from + len).min(want.len());
        assert_eq!(n, to - from, "{name} at {off}+{len}");
        assert!(
            buf[..n] == want[from..to],
            "{}: {name} at {off}+{len}",
            archive.display()
        );
    }
}

#[test]
fn every_format_indexes_and_reads_back_every_member() {
    let scratch = tempfile::tempdir().unwrap();
    let src = scratch.path().join("src");
    let files = tree(&src);
    let out = scratch.path();
    let tar = out.join("t.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg("."));
    check(&tar, Format::Tar, &files, 1);

    let tgz = out.join("t.tar.gz");
    run(Command::new("tar")
        .arg("-czf")
        .arg(&tgz)
        .arg("-C")
        .arg(&src)
        .arg("."));
    check(&tgz, Format::TarGz, &files, 2);
    let index = scan::scan(&tgz, &|_| {}).unwrap();
    assert!(index.points.len() >= 10, "a point every 1 MiB of ~16 MiB");

    let multi = out.join("multi.tar.gz");
    two_parts(&tar, &multi, "gzip");
    check(&multi, Format::TarGz, &files, 3);

    let zst = out.join("t.tar.zst");
    run(Command::new("zstd")
        .arg("-q")
        .arg("-f")
        .arg(&tar)
        .arg("-o")
        .arg(&zst));
    check(&zst, Format::TarZst, &files, 4);
    let frames = out.join("frames.tar.zst");
    two_parts(&tar, &frames, "zstd");
    check(&frames, Format::TarZst, &files, 5);
    assert_eq!(scan::scan(&frames, &|_| {}).unwrap().points.len(), 2);

    // xz as `xz` alone writes it (one block), as `xz -T0` and pixz do (many), and two streams.
    let txz = out.join("t.tar.xz");
    run(Command::new("sh")
        .arg("-c")
        .arg("xz -q -0 -c \"$0\" > \"$1\"")
        .arg(&tar)
        .arg(&txz));
    check_reads(&txz, Format::TarXz, &files, 8, 40);
    assert_eq!(scan::scan(&txz, &|_| {}).unwrap().points.len(), 1);
    let blocks = out.join("blocks.tar.xz");
    run(Command::new("sh")
        .arg("-c")
        .arg("xz -q -0 -T2 --block-size=1MiB -c \"$0\" > \"$1\"")
        .arg(&tar)
        .arg(&blocks));
    check(&blocks, Format::TarXz, &files, 9);
    assert!(scan::scan(&blocks, &|_| {}).unwrap().points.len() >= 16);
    let streams = out.join("streams.tar.xz");
    two_parts(&tar, &streams, "xz");
    // Two streams of one block each: a slice decodes from its stream's start.
    check_reads(&streams, Format::TarXz, &files, 10, 40);

    // bzip2: 100 kB blocks at -1, 900 kB at -9; two streams as pbzip2 writes them.
    for (level, seed) in [("-1", 11), ("-9", 12)] {
        let tbz = out.join(format!("t{level}.tar.bz2"));
        run(Command::new("sh")
            .arg("-c")
            .arg(format!("bzip2 -q {level} -c \"$0\" > \"$1\""))
            .arg(&tar)
            .arg(&tbz));
        // A slice decodes from its block's start: at -9, ~450 kB on average at ~15 MB/s.
        check_reads(&tbz, Format::TarBz2, &files, seed, 100);
        let points = scan::scan(&tbz, &|_| {}).unwrap().points.len();
        assert!(points >= 16, "{points} blocks at {level}");
    }
    let bz_streams = out.join("streams.tar.bz2");
    two_parts(&tar, &bz_streams, "bzip2");
    check_reads(&bz_streams, Format::TarBz2, &files, 13, 100);

    let zip = out.join("t.zip");
    run(Command::new("zip")
        .arg("-q")
        .arg("-r")
        .arg(&zip)
        .arg(".")
        .current_dir(&src));
    check(&zip, Format::Zip, &files, 6);
    let stored = out.join("stored.zip");
    run(Command::new("zip")
        .arg("-q")
        .arg("-0")
        .arg("-r")
        .arg(&stored)
        .arg(".")
        .current_dir(&src));
    check(&stored, Format::Zip, &files, 7);
}

/// A member read to its end gives its decoder back at once, not when its reader is dropped: the
/// mount releases a handle only after the next member's open (FUSE sends releases late), and the
/// next member read in archive order must decode on from where this one ended.
#[test]
fn a_member_read_to_its_end_parks_its_decoder_for_the_next() {
    let scratch = tempfile::tempdir().unwrap();
    let src = scratch.path().join("src");
    for i in 0..3 {
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join(format!("m{i}")), vec![b'a' + i; 3000]).unwrap();
    }
    for (flag, format) in [("-z", Format::TarGz), ("-J", Format::TarXz)] {
        let archive = scratch.path().join(format!("t{flag}"));
        run(Command::new("tar")
            .arg(flag)
            .arg("-cf")
            .arg(&archive)
            .arg("-C")
            .arg(&src)
            .args(["m0", "m1", "m2"]));
        let index = scan::scan(&archive, &|_| {}).unwrap();
        assert_eq!(index.format, format);
        let source = Source::open(index).unwrap();
        let mut first = source.reader(0);
        let mut buf = vec![0u8; 2000];
        assert_eq!(first.read_at(&source, 0, &mut buf).unwrap(), 2000);
        assert_eq!(
            source.parked(),
            0,
            "{flag}: mid-member, the decoder is the reader's"
        );
        assert_eq!(first.read_at(&source, 2000, &mut buf).unwrap(), 1000);
        assert_eq!(source.parked(), 1, "{flag}: at its end, parked");
        let mut second = source.reader(1);
        assert_eq!(source.parked(), 0, "{flag}: the next member took it");
        assert_eq!(second.read_at(&source, 0, &mut buf).unwrap(), 2000);
        assert_eq!(buf, vec![b'b'; 2000]);
        // The first reader reads again: a decoder of its own, from the access point.
        assert_eq!(first.read_at(&source, 10, &mut buf[..5]).unwrap(), 5);
        assert_eq!(&buf[..5], b"aaaaa");
        drop(first);
    }
}

#[test]
fn links_duplicates_and_escaping_paths_in_tar() {
    let scratch = tempfile::tempdir().unwrap();
    let src = scratch.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/orig"), b"original bytes").unwrap();
    std::fs::hard_link(src.join("d/orig"), src.join("hard")).unwrap();
    std::os::unix::fs::symlink("d/orig", src.join("soft")).unwrap();
    let tar = scratch.path().join("l.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg("d")
        .arg("hard")
        .arg("soft"));
    // A second copy of d/orig appended: extraction leaves the later one.
    std::fs::write(src.join("d/orig"), b"replaced").unwrap();
    run(Command::new("tar")
        .arg("-rf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg("d/orig"));
    // A member whose name climbs out of the archive (`tar -P` keeps it as given).
    std::fs::write(scratch.path().join("evil"), b"x").unwrap();
    run(Command::new("tar")
        .arg("-rPf")
        .arg(&tar)
        .arg(format!("{}/../evil", src.display())));
    let index = scan::scan(&tar, &|_| {}).unwrap();
    let by: BTreeMap<String, &roar_archive::Member> = index
        .members
        .iter()
        .map(|m| (String::from_utf8(m.path.clone()).unwrap(), m))
        .collect();
    assert_eq!(by["d/orig"].blake3, *blake3::hash(b"replaced").as_bytes());
    assert_eq!(
        by["hard"].blake3,
        *blake3::hash(b"original bytes").as_bytes()
    );
    assert_eq!(by["soft"].kind, Kind::Symlink);
    assert_eq!(by["soft"].link.as_deref(), Some(&b"d/orig"[..]));
    assert!(!by.keys().any(|k| k.contains("evil")));
    assert!(index
        .skipped
        .iter()
        .any(|(p, _)| String::from_utf8_lossy(p).contains("evil")));
}

#[test]
fn the_index_is_reused_until_the_archive_changes() {
    let scratch = tempfile::tempdir().unwrap();
    let src = scratch.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"one").unwrap();
    let tar = scratch.path().join("c.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg("f"));
    let dir = scratch.path().join("idx");
    let (first, o1) = cache::open(&tar, &dir, &|_| {}).unwrap();
    let (again, o2) = cache::open(&tar, &dir, &|_| {}).unwrap();
    assert_eq!((o1, o2), (cache::Origin::Built, cache::Origin::Reused));
    assert_eq!(first.members, again.members);
    assert_eq!(first.blake3, again.blake3);
    std::fs::write(src.join("f"), b"two!").unwrap();
    run(Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg("f"));
    let (changed, o3) = cache::open(&tar, &dir, &|_| {}).unwrap();
    assert_eq!(o3, cache::Origin::Built);
    assert_eq!(changed.members[0].blake3, *blake3::hash(b"two!").as_bytes());
    // A damaged index file is rebuilt, not trusted.
    std::fs::write(
        cache::index_path(&dir, &std::fs::canonicalize(&tar).unwrap()),
        b"junk",
    )
    .unwrap();
    assert_eq!(
        cache::open(&tar, &dir, &|_| {}).unwrap().1,
        cache::Origin::Built
    );
}

#[test]
fn what_is_not_an_archive_is_said_in_one_line() {
    let scratch = tempfile::tempdir().unwrap();
    let p = scratch.path().join("notes.tar");
    std::fs::write(&p, b"just some text, not a tar").unwrap();
    let e = scan::scan(&p, &|_| {}).unwrap_err().to_string();
    assert!(e.contains("not an archive roar can mount"), "{e}");
    let truncated = scratch.path().join("cut.tar.gz");
    let src = scratch.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), vec![7u8; 1 << 20]).unwrap();
    let full = scratch.path().join("full.tar.gz");
    run(Command::new("tar")
        .arg("-czf")
        .arg(&full)
        .arg("-C")
        .arg(&src)
        .arg("f"));
    let bytes = std::fs::read(&full).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let e = scan::scan(&truncated, &|_| {}).unwrap_err().to_string();
    assert!(e.contains("damaged"), "{e}");
}

/// A compressed file that is not a tar (`data.csv.xz`) mounts as the one file it holds, named
/// without the suffix, readable at random offsets, in every compressed format.
#[test]
fn a_compressed_file_that_is_not_a_tar_is_one_member() {
    let scratch = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed);
    // Several MiB of text (1 MiB xz blocks, 100 kB bzip2 blocks: many access points).
    let csv: Vec<u8> = (0..3_000_000)
        .map(|_| b"0123456789,.abc\n"[rng.below(16) as usize])
        .collect();
    let plain = scratch.path().join("data.csv");
    std::fs::write(&plain, &csv).unwrap();
    for (tool, args, suffix, format) in [
        ("gzip", "-c", "gz", Format::TarGz),
        ("zstd", "-q -c", "zst", Format::TarZst),
        ("xz", "-T2 --block-size=1MiB -c", "xz", Format::TarXz),
        ("bzip2", "-1 -c", "bz2", Format::TarBz2),
    ] {
        let packed = scratch.path().join(format!("data.csv.{suffix}"));
        run(Command::new("sh")
            .arg("-c")
            .arg(format!("{tool} {args} \"$0\" > \"$1\""))
            .arg(&plain)
            .arg(&packed));
        let index = scan::scan(&packed, &|_| {}).unwrap();
        assert_eq!(index.format, format);
        assert_eq!(index.members.len(), 1, "{suffix}");
        let m = &index.members[0];
        assert_eq!(m.path, b"data.csv", "{suffix}");
        assert_eq!(m.size, csv.len() as u64, "{suffix}");
        assert_eq!(m.blake3, *blake3::hash(&csv).as_bytes(), "{suffix}");
        let source = Source::open(index.clone()).unwrap();
        for _ in 0..50 {
            let off = rng.below(csv.len() as u64 + 10);
            let mut buf = vec![0u8; rng.below(300_000) as usize];
            let n = source.reader(0).read_at(&source, off, &mut buf).unwrap();
            let from = (off as usize).min(csv.len());
            let to = (from + buf.len()).min(csv.len());
            assert_eq!(n, to - from, "{suffix} at {off}");
            assert!(buf[..n] == csv[from..to], "{suffix} at {off}");
        }
    }
}

/// A small tree for nesting (the big one's 12 MiB would be compressed at every level).
fn small_tree(root: &Path, seed: u64) -> BTreeMap<String, Vec<u8>> {
    let mut rng = Rng(seed);
    let mut files = BTreeMap::new();
    for i in 0..60 {
        let size = match i % 6 {
            0 => 0,
            5 => 600_000 + rng.below(900_000) as usize,
            _ => rng.below(30_000) as usize,
        };
        let content = (0..size).map(|_| (rng.next() % 11) as u8 + b'a').collect();
        let name = match i % 4 {
            0 => format!("in/{i:02} sp\u{e4}ce.bin"),
            1 => format!("in/sub/{i:02}\nnl"),
            _ => format!("in/{i:02}.dat"),
        };
        files.insert(name, content);
    }
    for (name, content) in &files {
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    files
}

#[test]
fn archives_inside_archives_index_and_read_like_files() {
    use roar_archive::nested::{self, Found, Lookup};
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path();
    let src = root.join("src");
    let files = small_tree(&src, 0x5eed_0063);
    let outer_src = root.join("outer");
    std::fs::create_dir_all(outer_src.join("deep")).unwrap();
    let tar_of = |out: &Path, flags: &[&str]| {
        run(Command::new("tar")
            .args(flags)
            .arg("-cf")
            .arg(out)
            .arg("-C")
            .arg(&src)
            .arg("in"));
    };
    // A tar, a zip, and a multi-block xz inside a tar, all inside a tar.gz; beside them a name
    // that says tar over text, and a tar.gz cut short.
    tar_of(&outer_src.join("inner.tar"), &[]);
    run(Command::new("zip")
        .args(["-q", "-r"])
        .arg(outer_src.join("inner.zip"))
        .arg("in")
        .current_dir(&src));
    let txz = root.join("inner.tar.xz");
    tar_of(&txz, &["-I", "xz -0 -T2 --block-size=256KiB"]);
    run(Command::new("tar")
        .arg("-cf")
        .arg(outer_src.join("deep/mid.tar"))
        .arg("-C")
        .arg(root)
        .arg("inner.tar.xz"));
    std::fs::write(outer_src.join("fake.tar"), b"not a tar at all\n").unwrap();
    let cut = root.join("cut.tar.gz");
    tar_of(&cut, &["-z"]);
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(outer_src.join("cut.tar.gz"), &bytes[..bytes.len() / 2]).unwrap();
    let outer = root.join("outer.tar.gz");
    run(Command::new("tar")
        .arg("-czf")
        .arg(&outer)
        .arg("-C")
        .arg(&outer_src)
        .arg("."));

    let dir = root.join("indexes");
    let open_all = |want: Origin| {
        let top = Source::open(scan::scan(&outer, &|_| {}).unwrap()).unwrap();
        let mut left = Vec::new();
        let placed = nested::expand(top, &dir, &|_| {}, &mut |f| match f {
            Found::Indexed(i, origin) => assert_eq!(origin, want, "{}", i.archive.display()),
            Found::Left(name, why) => left.push((name, why.to_string())),
        });
        (placed, left)
    };
    use roar_archive::cache::Origin;
    let (placed, left) = open_all(Origin::Built);
    let at: Vec<String> = placed
        .iter()
        .map(|p| String::from_utf8(p.at.clone()).unwrap())
        .collect();
    // Depth first: the given archive, then each inner one followed by those inside it.
    assert_eq!(at[0], "");
    let mid = at.iter().position(|a| a == "deep/mid.tar").unwrap();
    assert_eq!(at[mid + 1], "deep/mid.tar/inner.tar.xz");
    let mut sorted = at.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "",
            "deep/mid.tar",
            "deep/mid.tar/inner.tar.xz",
            "inner.tar",
            "inner.zip"
        ]
    );
    let outer_name = std::fs::canonicalize(&outer).unwrap();
    let named = |rel: &str| format!("{}!/{rel}", outer_name.display());
    let left: BTreeMap<String, String> = left
        .into_iter()
        .map(|(n, why)| (n.display().to_string(), why))
        .collect();
    assert_eq!(
        left.keys().collect::<Vec<_>>(),
        [&named("cut.tar.gz"), &named("fake.tar")]
    );
    assert!(
        left[&named("cut.tar.gz")].contains("is damaged"),
        "{left:?}"
    );
    assert!(
        left[&named("fake.tar")].contains("not an archive"),
        "{left:?}"
    );
    // Every nested archive reads back like the files it holds, named through every level, and
    // knows the archives it is inside, innermost first.
    for (k, p) in placed.iter().enumerate().skip(1) {
        let at = String::from_utf8(p.at.clone()).unwrap();
        if at != "deep/mid.tar" {
            read_back(&p.source, &files, 100 + k as u64, 60);
        }
        let name = p.source.index.archive.display().to_string();
        assert_eq!(name, named(&at.replace("mid.tar/", "mid.tar!/")));
        let made = match at.as_str() {
            "deep/mid.tar/inner.tar.xz" => std::fs::read(&txz).unwrap(),
            _ => std::fs::read(outer_src.join(&at)).unwrap(),
        };
        assert_eq!(
            p.source.index.blake3,
            *blake3::hash(&made).as_bytes(),
            "{name}"
        );
        let within: Vec<String> = p
            .within
            .iter()
            .map(|v| v.path.display().to_string())
            .collect();
        let mut want = vec![outer_name.display().to_string()];
        if at == "deep/mid.tar/inner.tar.xz" {
            want.insert(0, named("deep/mid.tar"));
        }
        assert_eq!(within, want, "{name}");
    }
    // Indexed once: the next mount reuses every index.
    let (again, _) = open_all(Origin::Reused);
    assert_eq!(again.len(), placed.len());
    // A member named through the levels is found again, as `roar status` looks it up.
    let mut lookup = Lookup::new(scan::scan(&outer, &|_| {}).unwrap(), &dir).unwrap();
    for (rel, name) in [
        ("inner.tar!/", "in/06.dat"),
        ("deep/mid.tar!/inner.tar.xz!/", "in/11.dat"),
        ("inner.zip!/", "in/sub/01\nnl"),
    ] {
        let m = lookup.file(format!("{rel}{name}").as_bytes()).unwrap();
        assert_eq!(
            m.blake3,
            *blake3::hash(&files[name]).as_bytes(),
            "{rel}{name}"
        );
    }
    assert!(lookup.file(b"inner.tar!/in/missing").is_none());
    assert!(lookup.file(b"fake.tar!/x").is_none());
}

#[test]
fn incompressible_xz_data_is_read_where_it_is_stored() {
    let scratch = tempfile::tempdir().unwrap();
    let src = scratch.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut rng = Rng(0x0063_5704_ed00);
    let noise: Vec<u8> = (0..3 << 20).map(|_| rng.next() as u8).collect();
    let text: Vec<u8> = (0..1 << 20).map(|k| b"abcab cabc\n"[k % 11]).collect();
    let files: BTreeMap<String, Vec<u8>> = [("noise.jpg", noise), ("text.txt", text)]
        .into_iter()
        .map(|(n, c)| (n.to_string(), c))
        .collect();
    for (n, c) in &files {
        std::fs::write(src.join(n), c).unwrap();
    }
    let tar = scratch.path().join("t.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg("noise.jpg")
        .arg("text.txt"));
    let xz = |name: &str, flags: &str| {
        let out = scratch.path().join(name);
        run(Command::new("sh")
            .arg("-c")
            .arg(format!("xz -q {flags} -c \"$0\" > \"$1\""))
            .arg(&tar)
            .arg(&out));
        out
    };
    for (name, flags, stored) in [
        ("blocks.tar.xz", "-0 -T2 --block-size=512KiB", true),
        ("one.tar.xz", "-6", true),
        // A BCJ filter before LZMA2: what is stored is not the member's bytes.
        ("bcj.tar.xz", "--x86 --lzma2=preset=0", false),
    ] {
        let archive = xz(name, flags);
        let index = scan::scan(&archive, &|_| {}).unwrap();
        let noise = index
            .members
            .iter()
            .find(|m| m.path == b"noise.jpg")
            .unwrap();
        let Data::Stream { offset } = noise.data else {
            panic!("{name}: a stream member")
        };
        // The noise is stored as it is, nearly all of it; the text never.
        let covered = (0..noise.size)
            .step_by(4096)
            .filter(|&o| {
                index
                    .stored_at(offset + o, 4096.min(noise.size - o))
                    .is_some()
            })
            .count() as u64;
        let blocks = noise.size.div_ceil(4096);
        if stored {
            assert!(
                covered * 100 >= blocks * 95,
                "{name}: {covered} of {blocks}"
            );
        } else {
            assert_eq!(index.stored, [], "{name}");
        }
        let text = index
            .members
            .iter()
            .find(|m| m.path == b"text.txt")
            .unwrap();
        let Data::Stream { offset } = text.data else {
            panic!("{name}: a stream member")
        };
        assert!(index.stored_at(offset, text.size).is_none(), "{name}");
        // Read back: the stored stretches and the decoded ones alike, from the index kept.
        let dir = scratch.path().join(format!("idx-{name}"));
        let (again, origin) = cache::open(&archive, &dir, &|_| {}).unwrap();
        assert_eq!(origin, cache::Origin::Built);
        let (kept, _) = cache::open(&archive, &dir, &|_| {}).unwrap();
        assert_eq!(kept.stored, again.stored, "{name}: the index keeps them");
        read_back(&Source::open(kept).unwrap(), &files, 21, 200);
    }
}
