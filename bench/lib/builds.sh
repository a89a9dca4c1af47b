# Sourced by the benchmarks, which need REPO set: the roars they measure.
#   roar_after       sets ROAR to the roar given in ROAR, else this checkout's, built --release.
#   roar_before REV  sets ROAR_BEFORE to an older roar: the one given in ROAR_BEFORE, else built
#                    (once, in a worktree under /tmp) from BEFORE_REV or REV.
roar_after() {
    if [ -n "${ROAR:-}" ]; then
        return
    fi
    (cd "$REPO" && bash scripts/build.sh --release -q)
    ROAR="${CARGO_TARGET_DIR:-$REPO/target}/release/roar"
}

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
