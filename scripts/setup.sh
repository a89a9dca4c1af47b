#!/usr/bin/env bash
# Installs what roar needs to build and test on a fresh Debian 12 machine (run as root).
# Idempotent and quiet when everything is already there.
set -euo pipefail

need_apt=()
# cmake builds aws-lc (TLS of the gateway's upstream client); acl (setfacl) is for the mount's ACL tests.
# zsh, fish and groff check that `roar completions` parse and `roar man` renders (tests/tests/suite/cli_habits.rs).
# python3-venv: the environment tests build a real venv (tests/tests/suite/environment.rs).
# zstd (with pzstd), zip and unzip make and extract the archives of the archive-mount tests.
for pkg in clang libelf-dev zlib1g-dev pkg-config make cmake b3sum strace hyperfine git gcc graphviz openssl acl zsh fish groff-base python3-venv zstd zip unzip; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Headless Chromium is the browser the lineage page is tested in (tests/tests/suite/ui.rs), installed
# as Debian installs it (with its recommends: the configuration the tests ran with).
need_browser=()
for pkg in chromium fonts-dejavu-core; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_browser+=("$pkg")
done
if [ ${#need_browser[@]} -gt 0 ]; then
    echo "setup: installing ${need_browser[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    [ ${#need_apt[@]} -gt 0 ] || apt-get update -qq
    apt-get install -y -qq "${need_browser[@]}" >/dev/null
fi

# PostgreSQL is the team store the tests start themselves on 127.0.0.1 with a data directory of
# their own (tests/tests/suite/team.rs, bench/team.sh), never as a system service: installed with
# service starts refused and without the default cluster.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "setup: installing postgresql (no service started, no cluster made)" >&2
    export DEBIAN_FRONTEND=noninteractive
    mkdir -p /etc/postgresql-common
    [ -f /etc/postgresql-common/createcluster.conf ] \
        || echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
    made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        made_policy=1
    fi
    apt-get update -qq
    apt-get install -y -qq -o Dpkg::Options::=--force-confold postgresql >/dev/null
    [ "$made_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is missing; install Rust 1.95 (rustup) first" >&2
    exit 1
fi

# numpy is one of the coverage workloads (np.save / np.load under roar run); jsonschema, prov and
# openlineage-python validate `roar export` (tests/data/validate_export.py); boto3 is the S3 client
# of the `roar run --s3` tests, the demo and bench/s3.sh. Pinned for repeatability.
# awscli is the other S3 client of tests/s3/conformance.py (`aws s3 sync`, `aws s3 rm --recursive`).
# playwright drives Debian's Chromium in the page tests (tests/ui/drive.py; no browser download).
PY_PACKAGES=(numpy jsonschema==4.26.0 prov==3.2.3 openlineage-python==1.54.0 boto3==1.43.11 awscli==1.45.11 playwright==1.56.0)
if ! python3 -c 'import numpy, jsonschema, prov, openlineage.client, boto3, playwright' >/dev/null 2>&1 \
    || ! command -v aws >/dev/null 2>&1 \
    || [ "$(python3 -c 'import importlib.metadata as m; print(m.version("openlineage-python"), m.version("prov"), m.version("boto3"), m.version("awscli"), m.version("playwright"))' 2>/dev/null)" != "1.54.0 3.2.3 1.43.11 1.45.11 1.56.0" ]; then
    echo "setup: installing python packages: ${PY_PACKAGES[*]}" >&2
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "${PY_PACKAGES[@]}"
fi

# versitygw is the real S3 server the S3 tests and bench/s3.sh compare roar's store with and
# forward to; built once through the Go module proxy and cached outside the repository.
VGW="${ROAR_VERSITYGW:-$HOME/.cache/roar-s3bin/versitygw}"
if [ ! -x "$VGW" ]; then
    if ! command -v go >/dev/null 2>&1; then
        echo "setup: go is missing; install Go (https://go.dev/dl) to build versitygw" >&2
        exit 1
    fi
    echo "setup: building versitygw v1.8.0 into $(dirname "$VGW") (a few minutes, once)" >&2
    mkdir -p "$(dirname "$VGW")"
    GOBIN="$(dirname "$VGW")" go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
fi
