# The Python peer `roar-cli` from PyPI, in its own venv (sourced by the benchmarks).
PEER_VENV="${PEER_VENV:-/tmp/roar-bench-peer-venv}"
if [ ! -x "$PEER_VENV/bin/roar" ]; then
    python3 -m venv "$PEER_VENV" && "$PEER_VENV/bin/pip" install -q --disable-pip-version-check roar-cli
fi

peer_site_packages() {
    "$PEER_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}
