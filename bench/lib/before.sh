# Sourced by the after/before benchmarks: sets ROAR_BEFORE to an older roar — the one given in
# ROAR_BEFORE, else built (once, in a worktree under /tmp) from BEFORE_REV or the default
# revision the benchmark passes: `roar_before REV`.
roar_before() {
    if [ -n "${ROAR_BEFORE:-}" ]; then
        return
    fi
    local rev="${BEFORE_REV:-$1}"
    local base="/tmp/roar-before-$rev"
    [ -d "$base" ] || git -C "$REPO" worktree add -f "$base" "$rev" > /dev/null
    (cd "$base" && CARGO_TARGET_DIR="$base/target" bash scripts/build.sh --release -q)
    ROAR_BEFORE="$base/target/release/roar"
}
