#!/usr/bin/env bash
# Takes gitleaks' maintained secret rules (config/gitleaks.toml, MIT) from the Go module proxy at
# the version pinned here, into crates/store/rules/gitleaks/ with its licence and a SOURCE file
# naming version and sha256. roar's redaction compiles them in (crates/store/build.rs) beside its
# own context rules; a test checks the file is the one SOURCE names. To update: change VERSION,
# run `bash scripts/update-secret-rules.sh`, run the tests, commit the three files.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=v8.30.1
MODULE=github.com/zricethezav/gitleaks/v8
dest=crates/store/rules/gitleaks
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --retry 3 -o "$tmp/m.zip" "https://proxy.golang.org/$MODULE/@v/$VERSION.zip"
prefix="$MODULE@$VERSION"
unzip -q -o "$tmp/m.zip" "$prefix/config/gitleaks.toml" "$prefix/LICENSE" -d "$tmp"
cp "$tmp/$prefix/config/gitleaks.toml" "$dest/gitleaks.toml"
cp "$tmp/$prefix/LICENSE" "$dest/LICENSE"
sum=$(sha256sum "$dest/gitleaks.toml" | cut -d' ' -f1)
cat > "$dest/SOURCE" <<SRC
module $MODULE
version $VERSION
file config/gitleaks.toml
from https://proxy.golang.org/$MODULE/@v/$VERSION.zip
sha256 $sum
SRC
echo "gitleaks $VERSION rules: $(grep -c '^\[\[rules\]\]' "$dest/gitleaks.toml") rules, sha256 $sum"
