#!/usr/bin/env python3
"""The code's shape, measured (issue 64): functions over 100 lines, files over 600 lines,
import circles between the modules of a crate, and dependencies that break the crates' layers. Test code (tests/ directories, `#[cfg(test)]`
modules) and build output are left out; the preload shim counts (it is ours).

    python3 scripts/structure.py            # the figures and every offender
    python3 scripts/structure.py --check    # also fail if a figure grew past scripts/structure.toml

--check is a ratchet: the limits in scripts/structure.toml are today's figures, so a change may
leave them or lower them (then lower the file too), never raise them. CI runs it.
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FN_LIMIT = 100
FILE_LIMIT = 600
FN_RE = re.compile(
    r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:default\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?'
    r'(?:extern\s+"[^"]*"\s+)?fn\s+(\w+)')


def sources():
    """Every Rust source file of ours that is not test code."""
    for base in ("crates",):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, base)):
            dirnames[:] = [d for d in dirnames if d not in ("tests", "target", "benches", "examples")]
            for f in filenames:
                if f.endswith(".rs") and f not in ("build.rs", "tests.rs"):
                    yield os.path.join(dirpath, f)


def code_mask(text):
    """For each character, whether it is code (not inside a comment, string or char literal)."""
    n = len(text)
    mask = bytearray(b"\x01") * n
    i = 0

    def blank(a, b):
        for k in range(a, min(b, n)):
            if text[k] != "\n":
                mask[k] = 0

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif (c == "r" or text.startswith("br", i)) and re.match(r'b?r#*"', text[i:i + 8]) \
                and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'b?r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            blank(i, end)
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            if text.startswith("\\", i + 1):
                j = text.find("'", i + 2)
                blank(i, j + 1)
                i = j + 1
            elif i + 2 < n and text[i + 2] == "'":
                blank(i, i + 3)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return mask


def test_start(lines):
    """The line where a file's test module begins (`#[cfg(test)]` before `mod`), else None."""
    for k, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]":
            for nxt in lines[k + 1:k + 3]:
                if re.match(r"\s*(pub\s+)?mod\s+\w+\s*\{", nxt):
                    return k
    return None


def functions(text, mask, stop):
    """(name, first line, length in lines) of every function body before line `stop`."""
    lines = text.split("\n")
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    out = []
    for k, line in enumerate(lines[:stop]):
        m = FN_RE.match(line)
        if not m or not mask[offsets[k] + m.start(1)]:
            continue
        # The body: the first `{` in code after the signature, unless a `;` comes first (a
        # declaration without a body: a trait method, an extern item).
        i = offsets[k] + m.end()
        while i < len(text) and not (mask[i] and text[i] in "{;"):
            i += 1
        if i >= len(text) or text[i] == ";":
            continue
        depth, j = 0, i
        while j < len(text):
            if mask[j]:
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
            j += 1
        end_line = text.count("\n", 0, j)
        out.append((m.group(1), k + 1, end_line - k + 1))
    return out


def module_of(path):
    """(crate directory, top-level module) of a source file: crates/store/src/status/held.rs is
    ("crates/store", "status")."""
    rel = os.path.relpath(path, ROOT).split(os.sep)
    crate = os.sep.join(rel[:2])
    inside = rel[3:] if len(rel) > 3 and rel[2] == "src" else rel[2:]
    top = inside[0][:-3] if len(inside) == 1 else inside[0]
    return crate, top


def circles(uses):
    """Strongly connected components of more than one module, per crate (Tarjan)."""
    found = []
    for crate, graph in sorted(uses.items()):
        index, low, stack, on, count = {}, {}, [], set(), [0]

        def visit(v):
            index[v] = low[v] = count[0]
            count[0] += 1
            stack.append(v)
            on.add(v)
            for w in sorted(graph.get(v, ())):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append((crate, sorted(comp)))

        for v in sorted(graph):
            if v not in index:
                visit(v)
    return found


# The crates' layers (docs/ARCHITECTURE.md, "Invariants"): the roar crates each may depend on
# (normal dependencies; dev-dependencies aside), and the outside crates only some may use.
LAYERS = {
    "cli": {"store", "env", "tracer", "engine", "wire", "roarfs", "archive", "gateway", "spin", "team", "recorder", "ui"},
    "tracer": {"engine", "store", "spin", "archive", "wire"},
    "roarfs": {"tracer", "engine", "store", "archive", "spin"},
    "gateway": {"engine", "store", "env"},
    "engine": {"store"},
    "env": {"store"},
    "fleet": {"store"},
    "team": {"store"},
    "recorder": {"store", "env", "tracer"},
    "ui": {"store"},
    "store": set(),
    "archive": set(),
    "spin": set(),
    "wire": set(),
    "preload": {"wire"},
}
ONLY_IN = {
    "postgres": {"team"},           # the team store alone talks to PostgreSQL
    "tokio": {"gateway", "team", "ui"},
    "clap": {"cli", "fleet"},       # command lines: the binaries
    "anyhow": {"cli", "gateway"},   # library crates return their own error types
    "fuser": {"roarfs"},
    "s3s": {"gateway"},
}
# The shim is loaded into every traced process: libc and the event format, nothing else.
SHIM_DEPS = {"libc", "roar-wire"}


def dependencies(toml_path):
    """The names in a Cargo.toml's [dependencies] (and target-specific ones)."""
    import tomllib
    with open(toml_path, "rb") as f:
        doc = tomllib.load(f)
    names = set(doc.get("dependencies", {}))
    for target in doc.get("target", {}).values():
        names |= set(target.get("dependencies", {}))
    return names


def layer_violations():
    """Every dependency that breaks the layers above, as a sentence."""
    found = []
    crates_dir = os.path.join(ROOT, "crates")
    for crate in sorted(os.listdir(crates_dir)):
        toml_path = os.path.join(crates_dir, crate, "Cargo.toml")
        if not os.path.exists(toml_path):
            continue
        deps = dependencies(toml_path)
        if crate not in LAYERS:
            found.append(f"crates/{crate} is in no layer: add it to LAYERS in scripts/structure.py")
            continue
        for dep in sorted(deps):
            if dep.startswith("roar-") and dep[5:] not in LAYERS[crate]:
                found.append(f"crates/{crate} depends on {dep}, below it in no layer")
            if dep in ONLY_IN and crate not in ONLY_IN[dep]:
                found.append(f"crates/{crate} depends on {dep} (only {', '.join(sorted(ONLY_IN[dep]))} may)")
        if crate == "preload" and deps - SHIM_DEPS:
            found.append(f"the shim depends on {', '.join(sorted(deps - SHIM_DEPS))} (libc and roar-wire only)")
    return found


def measure():
    long_fns, long_files = [], []
    uses = defaultdict(lambda: defaultdict(set))
    modules = defaultdict(set)
    for path in sources():
        crate, top = module_of(path)
        modules[crate].add(top)
    for path in sorted(sources()):
        text = open(path, encoding="utf-8").read()
        mask = code_mask(text)
        lines = text.split("\n")
        stop = test_start(lines)
        stop = len(lines) if stop is None else stop
        rel = os.path.relpath(path, ROOT)
        if stop > FILE_LIMIT:
            long_files.append((stop, rel))
        for name, line, length in functions(text, mask, stop):
            if length > FN_LIMIT:
                long_fns.append((length, f"{rel}:{line}", name))
        crate, top = module_of(path)
        code = "".join(ch if mask[k] else " " for k, ch in enumerate(text[:sum(len(x) + 1 for x in lines[:stop])]))
        # An edge from one top-level module to another it names (`crate::other`); the crate's
        # root (lib.rs, main.rs) is every module's parent, not a peer.
        if top in ("lib", "main"):
            continue
        for m in re.finditer(r"\bcrate::(\w+)", code):
            other = m.group(1)
            if other != top and other in modules[crate] and other not in ("lib", "main"):
                uses[crate][top].add(other)
    return sorted(long_fns, reverse=True), sorted(long_files, reverse=True), circles(uses)


def main():
    check = "--check" in sys.argv[1:]
    long_fns, long_files, found = measure()
    print(f"functions over {FN_LIMIT} lines: {len(long_fns)}")
    for length, where, name in long_fns:
        print(f"  {length:5d}  {name}  {where}")
    print(f"files over {FILE_LIMIT} lines (test modules aside): {len(long_files)}")
    for length, rel in long_files:
        print(f"  {length:5d}  {rel}")
    print(f"import circles between a crate's modules: {len(found)}")
    for crate, comp in found:
        print(f"  {crate}: {' <-> '.join(comp)}")
    layers = layer_violations()
    print(f"dependencies against the crates' layers: {len(layers)}")
    for v in layers:
        print(f"  {v}")
    if not check:
        return 0
    if layers:
        print("structure: a dependency breaks the crates' layers (docs/ARCHITECTURE.md)", file=sys.stderr)
        return 1
    limits = {}
    for line in open(os.path.join(ROOT, "scripts", "structure.toml")):
        m = re.match(r"\s*(\w+)\s*=\s*(\d+)", line)
        if m:
            limits[m.group(1)] = int(m.group(2))
    now = {"long_functions": len(long_fns), "long_files": len(long_files), "import_circles": len(found)}
    grew = [f"{k} {v} > {limits[k]}" for k, v in now.items() if v > limits.get(k, 0)]
    if grew:
        print("structure: grew past scripts/structure.toml: " + ", ".join(grew)
              + "; split what this change made long, or untangle the circle", file=sys.stderr)
        return 1
    lower = [k for k, v in now.items() if v < limits.get(k, 0)]
    if lower:
        print("structure: lower than scripts/structure.toml (" + ", ".join(lower) + "): lower the file to keep it so")
    return 0


if __name__ == "__main__":
    sys.exit(main())
