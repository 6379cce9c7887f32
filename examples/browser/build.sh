#!/usr/bin/env bash
# Builds the page's wasm into examples/browser/pkg/ (kvq_browser.js, kvq_browser_bg.wasm):
# kvq and this crate for wasm32-unknown-unknown in release, then the wasm-bindgen CLI of
# exactly the version Cargo.lock names (the JS glue must match the crate). The CLI is built
# from its crate with `cargo install` (no prebuilt download; only the `wasm-bindgen` binary,
# without its default TLS features, which it needs only to download test browsers), once,
# into target/wasm-bindgen-<version>/ unless one of that version is on PATH.
#
# Shares the library's target directory (same lockfile versions and release profile), so
# after `cargo build --release --target wasm32-unknown-unknown` of the library only kvq and
# this crate compile again. Adds the wasm32 target with rustup where it is missing.
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$(cd ../.. && pwd)/target}"
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi

version=$(awk '$0 == "name = \"wasm-bindgen\"" { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
[ -n "$version" ] || { echo "build.sh: no wasm-bindgen in Cargo.lock" >&2; exit 1; }
cli_ok() { [ -x "$1" ] && [ "$("$1" --version 2>/dev/null)" = "wasm-bindgen $version" ]; }
cli=$(command -v wasm-bindgen || true)
if ! cli_ok "$cli"; then
  root="$CARGO_TARGET_DIR/wasm-bindgen-$version"
  cli="$root/bin/wasm-bindgen"
  if ! cli_ok "$cli"; then
    echo "== building the wasm-bindgen CLI $version from its crate (once)"
    # The dev profile: it compiles in about half the time of release, and the CLI's work here
    # (a 2 MB module) takes about a second either way.
    cargo install wasm-bindgen-cli --version "=$version" --no-default-features \
      --bin wasm-bindgen --debug --root "$root"
  fi
fi

echo "== kvq and the page's crate for wasm32 (release)"
cargo build --release --locked --target wasm32-unknown-unknown
"$cli" --target web --no-typescript --out-dir pkg \
  "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/kvq_browser.wasm"
ls -l pkg
