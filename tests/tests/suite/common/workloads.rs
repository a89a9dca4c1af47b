//! The coverage workloads of `roar run` (tests/run.rs), reused through the mount (tests/mount.rs):
//! each with the inputs and outputs it must be recorded with, relative to where it runs.

use std::path::Path;
use std::process::Command;

use super::stderr;

pub struct Workload {
    pub name: &'static str,
    /// Untraced preparation, run with `sh -c` in the project.
    pub setup: &'static str,
    pub argv: &'static [&'static str],
    pub inputs: &'static [&'static str],
    pub outputs: &'static [&'static str],
    pub exit: i32,
    /// Whether strace's file set must equal roar's (off where the program chdirs or uses dirfds,
    /// which strace prints unresolved).
    pub oracle: bool,
}

pub const PY_POOL: &str = "
import multiprocessing as mp
def work(i):
    with open(f'w{i}.txt', 'w') as f:
        f.write(str(i) * 100)
if __name__ == '__main__':
    with mp.Pool(4) as p:
        p.map(work, range(8))
";

pub const C_FOPEN: &str = r#"
#include <stdio.h>
int main(void) {
    FILE *in = fopen("f.in", "r"), *out = fopen("f.out", "w");
    int c;
    if (!in || !out) return 2;
    while ((c = fgetc(in)) != EOF) fputc(c, out);
    fclose(in); fclose(out);
    return 0;
}
"#;

/// Re-executes itself with no arguments at all (`argv[0]` NULL; Linux passes an empty string in
/// its place), and writes a file once it runs that way.
pub const C_EMPTY_ARGV: &str = r#"
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc <= 1 && (argc == 0 || argv[0][0] == '\0')) {
        FILE *out = fopen("by_empty_argv", "w");
        return out && fputs("e", out) >= 0 && fclose(out) == 0 ? 0 : 2;
    }
    execl("/proc/self/exe", (char *)0);
    return 9;
}
"#;

pub fn workloads() -> Vec<Workload> {
    vec![
        Workload {
            name: "bash redirect",
            setup: "",
            argv: &["bash", "-c", "echo hi > x"],
            inputs: &[],
            outputs: &["x"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "bash append",
            setup: "echo 1 > a.txt",
            argv: &["bash", "-c", "echo 2 >> a.txt"],
            inputs: &["a.txt"],
            outputs: &["a.txt"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "write, close, reopen and append",
            setup: "",
            argv: &["sh", "-c", "echo a > f; echo b >> f; echo c > g; cat g > /dev/null; echo d >> g"],
            inputs: &[],
            outputs: &["f", "g"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "rename a directory with new files inside",
            setup: "echo in > src.txt",
            argv: &["sh", "-c", "mkdir tmp && cp src.txt tmp/a && echo b > tmp/b && mv tmp done"],
            inputs: &["src.txt"],
            outputs: &["done/a", "done/b"],
            exit: 0,
            oracle: false,
        },
        Workload {
            name: "cp",
            setup: "echo data > src",
            argv: &["cp", "src", "dst"],
            inputs: &["src"],
            outputs: &["dst"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "mv",
            setup: "echo data > m1",
            argv: &["mv", "m1", "m2"],
            inputs: &["m1"],
            outputs: &["m2"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "rm",
            setup: "echo data > r1",
            argv: &["rm", "r1"],
            inputs: &[],
            outputs: &["r1"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "sed -i",
            setup: "echo abc > s.txt",
            argv: &["sed", "-i", "s/a/b/", "s.txt"],
            inputs: &["s.txt"],
            outputs: &["s.txt"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "tar c",
            setup: "mkdir d && echo 1 > d/f1 && echo 2 > d/f2",
            argv: &["tar", "cf", "d.tar", "d"],
            inputs: &["d/f1", "d/f2"],
            outputs: &["d.tar"],
            exit: 0,
            oracle: false,
        },
        Workload {
            name: "tar x",
            setup: "mkdir t && echo 1 > t/g1 && echo 2 > t/g2 && tar cf t.tar t && rm -r t && mkdir out",
            argv: &["tar", "xf", "t.tar", "-C", "out"],
            inputs: &["t.tar"],
            outputs: &["out/t/g1", "out/t/g2"],
            exit: 0,
            oracle: false,
        },
        Workload {
            name: "python open",
            setup: "echo in > p.in",
            argv: &["python3", "-c", "open('p.out','w').write(open('p.in').read())"],
            inputs: &["p.in"],
            outputs: &["p.out"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "python os.rename",
            setup: "",
            argv: &["python3", "-c", "import os; open('t.tmp','w').write('x'); os.rename('t.tmp','final')"],
            inputs: &[],
            outputs: &["final"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "python shutil.copy",
            setup: "echo c > c.in",
            argv: &["python3", "-c", "import shutil; shutil.copy('c.in','c.out')"],
            inputs: &["c.in"],
            outputs: &["c.out"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "numpy save and load",
            setup: "python3 -c \"import numpy as np; np.save('seed.npy', np.ones(3))\"",
            argv: &[
                "python3",
                "-c",
                "import numpy as np; np.save('arr.npy', np.load('seed.npy') * 2)",
            ],
            inputs: &["seed.npy"],
            outputs: &["arr.npy"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "C fopen",
            setup: "echo cfile > f.in && cat > prog.c <<'EOF'\nC_FOPEN\nEOF\ncc -O1 -o prog prog.c",
            argv: &["./prog"],
            inputs: &["f.in"],
            outputs: &["f.out"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "python multiprocessing pool",
            setup: "cat > pool.py <<'EOF'\nPY_POOL\nEOF",
            argv: &["python3", "pool.py"],
            inputs: &["pool.py"],
            outputs: &["w0.txt", "w1.txt", "w2.txt", "w3.txt", "w4.txt", "w5.txt", "w6.txt", "w7.txt"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "make with several steps",
            setup: "echo a > a.txt && printf 'c.txt: b.txt\\n\\tcat b.txt b.txt > c.txt\\nb.txt: a.txt\\n\\tcat a.txt > b.txt\\n' > Makefile",
            argv: &["make", "-s"],
            inputs: &["Makefile", "a.txt"],
            outputs: &["b.txt", "c.txt"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "failing command",
            setup: "",
            argv: &["sh", "-c", "echo x > partial; exit 3"],
            inputs: &[],
            outputs: &["partial"],
            exit: 3,
            oracle: true,
        },
        Workload {
            name: "killed by SIGKILL",
            setup: "",
            argv: &["sh", "-c", "echo y > before; kill -9 $$"],
            inputs: &[],
            outputs: &["before"],
            exit: 137,
            oracle: true,
        },
        Workload {
            name: "relative paths after chdir",
            setup: "mkdir sub && echo top > top.txt",
            argv: &["sh", "-c", "cd sub && cat ../top.txt > here.txt"],
            inputs: &["top.txt"],
            outputs: &["sub/here.txt"],
            exit: 0,
            oracle: false,
        },
        Workload {
            name: "openat with a dirfd",
            setup: "mkdir sub",
            argv: &[
                "python3",
                "-c",
                "import os; d=os.open('sub', os.O_RDONLY); f=os.open('df.txt', os.O_WRONLY|os.O_CREAT, dir_fd=d); os.write(f, b'x')",
            ],
            inputs: &[],
            outputs: &["sub/df.txt"],
            exit: 0,
            oracle: false,
        },
        Workload {
            name: "environment scrubbed with env -i",
            setup: "",
            argv: &["env", "-i", "/bin/sh", "-c", "echo z > scrubbed"],
            inputs: &[],
            outputs: &["scrubbed"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "execle with a scrubbed environment (C varargs)",
            setup: "printf '%s\\n' '#include <unistd.h>' 'int main(int argc, char **argv) {' \
                    '  char *env[] = {\"PATH=/usr/bin:/bin\", 0};' \
                    '  execle(\"/bin/sh\", argv[1], argv[2], argv[3], (char *)0, env);' \
                    '  return 9;' '}' > execle.c && cc -O1 -o execle execle.c && rm execle.c",
            argv: &["./execle", "sh", "-c", "echo e > by_execle"],
            inputs: &[],
            outputs: &["by_execle"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "execl with an empty argument list",
            setup: "cat > empty_argv.c <<'EOF'\nC_EMPTY_ARGV\nEOF\ncc -O1 -o empty_argv empty_argv.c && rm empty_argv.c",
            argv: &["./empty_argv"],
            inputs: &[],
            outputs: &["by_empty_argv"],
            exit: 0,
            oracle: true,
        },
        Workload {
            name: "program that closes all fds",
            setup: "",
            argv: &["python3", "-c", "import os; os.closerange(3, 4096); open('after_close','w').write('x')"],
            inputs: &[],
            outputs: &["after_close"],
            exit: 0,
            oracle: true,
        },
    ]
}

/// Runs a workload's untraced setup script in `dir`.
pub fn sh(dir: &Path, script: &str) {
    let script = script
        .replace("C_FOPEN", C_FOPEN)
        .replace("C_EMPTY_ARGV", C_EMPTY_ARGV)
        .replace("PY_POOL", PY_POOL);
    let out = Command::new("sh")
        .args(["-c", &script])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "setup failed: {script}\n{}",
        stderr(&out)
    );
}
