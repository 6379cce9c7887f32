#!/usr/bin/env bash
# Runs on a device machine: a chunk's GPU time against its split count per storage segment
# (`--chunk-splits`, a runtime value: the kernels are the same), qwen3-8b over 32k, in one
# call. By default `none` (the split kernel at every n) and `q4_sym` (the split kernel below
# 64 tokens and, where the tuning gives it, the f16 prefill kernel from 64), n = 4 to 512.
# Writes NAME-GPU-DATE.csv: the sweep's columns after a chunk_splits one (`tuned`: the
# tuning's own count).
# Usage: bash bench/chunk-splits.sh OUTDIR. Needs .gl/ and target/release/examples/sweep.
# Settings (environment): BUDGET (s, default 540) bounds the whole run; CODECS, QUERIES,
# COUNTS (split counts in the order run, most telling first), STEPS, WARMUP, NAME. The codecs
# with a rotated V were measured with
#   NAME=chunk-splits-vrot CODECS=turbo3_sym,iso3_sym,rotor3_sym QUERIES=4,8,16,64 \
#   COUNTS="tuned 64 32 24 16" STEPS=20 WARMUP=5 BUDGET=200 bash bench/chunk-splits.sh OUTDIR
set -u
out=${1:?outdir}
end=$((SECONDS + ${BUDGET:-540}))
left() { echo $((end - SECONDS)); }
. "$(dirname "$0")/vulkan-env.sh"
gpu=$(nvidia-smi -L | head -1 | grep -o -E "[HAB][0-9]{2,3}" | head -1 | tr A-Z a-z)
tag="${gpu:-gpu}-$(date -u +%Y-%m-%d)"
nvidia-smi -L > "$out/device-$tag.txt"
sweep=./target/release/examples/sweep
common=(--model qwen3-8b --ctx 32768 --codecs "${CODECS:-none,q4_sym}"
  --queries "${QUERIES:-4,8,16,64,512}" --steps "${STEPS:-5}" --warmup "${WARMUP:-2}" --rounds 1)
csv="$out/${NAME:-chunk-splits}-$tag.csv"
rm -f "$csv"
for s in ${COUNTS:-64 8 32 16 4 2 1}; do
  [ "$(left)" -gt 30 ] || break
  echo "== chunk splits $s ($(left) s left)"
  flag=(--chunk-splits "$s")
  [ "$s" = tuned ] && flag=()
  timeout $(($(left) - 5)) $sweep "${common[@]}" "${flag[@]}" --csv "$out/s.csv" 2>&1 |
    grep -E "^[a-z0-9_=,+]+ n="
  [ -s "$out/s.csv" ] || continue
  [ -s "$csv" ] || head -1 "$out/s.csv" | sed 's/^/chunk_splits,/' > "$csv"
  tail -n +2 "$out/s.csv" | sed "s/^/$s,/" >> "$csv"
  rm -f "$out/s.csv"
done
ls -la "$out"
