#!/usr/bin/env bash
# Runs on a device machine: bench/chunk-splits.sh's sweep for the codecs with a rotated V
# (their chunk split kernel holds 168 registers, 3 workgroups a multiprocessor, against the
# decode's 4), n = 4 to 64 new tokens, 20 steps after 5; `tuned`: the tuning's own count. Usage: bash bench/chunk-splits-vrot.sh OUTDIR.
set -u
out=${1:?outdir}
end=$((SECONDS + ${BUDGET:-300}))
left() { echo $((end - SECONDS)); }
. "$(dirname "$0")/vulkan-env.sh"
gpu=$(nvidia-smi -L | head -1 | grep -o -E "[HAB][0-9]{2,3}" | head -1 | tr A-Z a-z)
tag="${gpu:-gpu}-$(date -u +%Y-%m-%d)"
sweep=./target/release/examples/sweep
common=(--model qwen3-8b --ctx 32768 --codecs turbo3_sym,iso3_sym,rotor3_sym --queries 4,8,16,64
  --steps 20 --warmup 5 --rounds 1)
csv="$out/chunk-splits-vrot-$tag.csv"
rm -f "$csv"
for s in tuned 64 32 24 16; do
  [ "$(left)" -gt 20 ] || break
  echo "== chunk splits $s ($(left) s left)"
  flag=(--chunk-splits "$s")
  [ "$s" = tuned ] && flag=()
  timeout $(($(left) - 5)) $sweep "${common[@]}" "${flag[@]}" --csv "$out/s.csv" 2>&1 |
    grep -E "^(turbo3_sym|iso3_sym|rotor3_sym) " | awk '{print $1, $2, $5}'
  [ -s "$out/s.csv" ] || continue
  [ -s "$csv" ] || head -1 "$out/s.csv" | sed 's/^/chunk_splits,/' > "$csv"
  tail -n +2 "$out/s.csv" | sed "s/^/$s,/" >> "$csv"
  rm -f "$out/s.csv"
done
