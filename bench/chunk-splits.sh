#!/usr/bin/env bash
# Runs on a device machine: a chunk's GPU time against its split count per storage segment
# (`--chunk-splits`, a runtime value: the kernels are the same), qwen3-8b over 32k, n = 4 to
# 512 new tokens, in one call. `none` takes the split kernel at every n; `q4_sym` the split
# kernel below 64 tokens and, where the tuning gives it, the f16 prefill kernel from 64 (the
# defaults). Writes chunk-splits-GPU-DATE.csv: the sweep's columns after a chunk_splits one.
# Usage: bash bench/chunk-splits.sh OUTDIR. Needs .gl/ and target/release/examples/sweep;
# BUDGET (s, default 540) bounds the whole run.
set -u
out=${1:?outdir}
end=$((SECONDS + ${BUDGET:-540}))
left() { echo $((end - SECONDS)); }
. "$(dirname "$0")/vulkan-env.sh"
gpu=$(nvidia-smi -L | head -1 | grep -o -E "[HAB][0-9]{2,3}" | head -1 | tr A-Z a-z)
tag="${gpu:-gpu}-$(date -u +%Y-%m-%d)"
nvidia-smi -L > "$out/device-$tag.txt"
sweep=./target/release/examples/sweep
common=(--model qwen3-8b --ctx 32768 --codecs none,q4_sym --queries 4,8,16,64,512
  --steps 5 --warmup 2 --rounds 1)
csv="$out/chunk-splits-$tag.csv"
rm -f "$csv"
# Most telling first: the decode's count (64 on an H200/H100), then fewer.
for s in 64 8 32 16 4 2 1; do
  [ "$(left)" -gt 30 ] || break
  echo "== chunk splits $s ($(left) s left)"
  timeout $(($(left) - 5)) $sweep "${common[@]}" --chunk-splits $s --csv "$out/s.csv" 2>&1 |
    grep -E "^(none|q4_sym) "
  [ -s "$out/s.csv" ] || continue
  [ -s "$csv" ] || head -1 "$out/s.csv" | sed 's/^/chunk_splits,/' > "$csv"
  tail -n +2 "$out/s.csv" | sed "s/^/$s,/" >> "$csv"
  rm -f "$out/s.csv"
done
ls -la "$out"
