#!/usr/bin/env bash
# Runs on a device machine: the chunk split kernel's time against its split count (qwen3-8b,
# 32k; n = 4, 64 and 512 new tokens), and the prefill kernel beside it, in one call.
# Usage: bash bench/chunk-splits.sh OUTDIR. Needs .gl/ and target/release/examples/sweep.
set -u
out=${1:?outdir}
. "$(dirname "$0")/vulkan-env.sh"
nvidia-smi -L > "$out/device.txt"
sweep=./target/release/examples/sweep
common=(--model qwen3-8b --ctx 32768 --codecs none,q4_sym,turbo3_sym --queries 4,64,512
  --steps 5 --warmup 2 --rounds 1)
for s in 64 32 16 8; do
  echo "== splits $s, split kernel"
  timeout 100 $sweep "${common[@]}" --splits $s --prefill-from 4294967295 --csv "$out/splits-$s.csv" 2>&1 |
    grep -E "^(none|q4_sym|turbo3_sym) "
done
echo "== splits 64, prefill kernel from 64"
timeout 100 $sweep "${common[@]}" --splits 64 --prefill-from 64 --csv "$out/splits-64-prefill.csv" 2>&1 |
  grep -E "^(none|q4_sym|turbo3_sym) "
(cd "$out" && cat splits-64.csv > chunk-splits.csv && for f in splits-32 splits-16 splits-8 splits-64-prefill; do
  tail -n +2 $f.csv >> chunk-splits.csv; done)
