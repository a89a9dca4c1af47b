# Sourced by the benchmarks that mount (mount.sh, pipeline.sh, wakeup.sh). URING=1: their mounts
# use FUSE over io_uring (ROAR_MOUNT_URING=1), with the kernel's enable_uring turned on for the
# run; `uring_restore` (from the benchmark's EXIT trap) puts the setting back. Rows marked "over
# /dev/fuse" keep /dev/fuse either way.
URING_PARAM=/sys/module/fuse/parameters/enable_uring
URING_WAS=""
if [ -n "${URING:-}" ]; then
    if [ ! -w "$URING_PARAM" ]; then
        echo "bench: URING=1 needs $URING_PARAM (Linux 6.14+ with CONFIG_FUSE_IO_URING, root)" >&2
        exit 2
    fi
    URING_WAS=$(cat "$URING_PARAM")
    echo Y > "$URING_PARAM"
    export ROAR_MOUNT_URING=1
fi
uring_restore() {
    if [ -n "$URING_WAS" ]; then echo "$URING_WAS" > "$URING_PARAM"; fi
    return 0
}
