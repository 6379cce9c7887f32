#!/usr/bin/env bash
# On the GPU machine: the shape numbers' A/B (BENCHMARKS.md, "One compile per kernel"). One
# sweep binary, run with the shape numbers baked back into the kernels' text group by group
# (KVQ_BAKE, src/kernels/shape.rs), from all baked (the kernels as they were) to none baked
# (as shipped), interleaved ROUNDS times; then the start-up example. qwen3-8b, `none`,
# `q4_sym`, `turbo3_sym`, `k_iso3` at 4k and 32k: decode steps and chunks of 4, then chunks
# of 512. Usage: BIN=bench/bin-shape bash bench/ab-shape.sh OUTDIR
# (BIN holds `sweep` and `startup`, built here with --release and stripped; BUDGET: seconds.)
set -u
out=${1:?outdir}
bin=${BIN:-bench/bin-shape}
end=$((SECONDS + ${BUDGET:-540}))
. "$(dirname "$0")/vulkan-env.sh"
nvidia-smi -L > "$out/device.txt"
cat "$out/device.txt"
echo "== start-up"
"$bin/startup" --model qwen3-8b --codecs none,q4_sym,turbo3_sym,k_iso3 2>&1 | tee "$out/startup.txt"
# Each variant bakes the groups not yet moved to the params (the last bakes none).
variants=(
  "all"
  "WIN,RING,KVH,QH,NSPLIT,SPLITS_TOTAL,PSLOTS,MIN_CHUNK,CST,KMU,SCALE"
  "KVH,QH,NSPLIT,SPLITS_TOTAL,PSLOTS,MIN_CHUNK,CST,KMU,SCALE"
  "NSPLIT,SPLITS_TOTAL,PSLOTS,MIN_CHUNK,CST,KMU,SCALE"
  "CST,KMU,SCALE"
  ""
)
names=(baked moved-B-CAP-LAYERS moved-WIN-RING moved-KVH-QH moved-splits moved-all)
common=(--model qwen3-8b --ctx 4096,32768 --codecs none,q4_sym,turbo3_sym,k_iso3 --rounds 1)
run() { # round, variant index, what, sweep args...
  local r=$1 i=$2 what=$3; shift 3
  local left=$((end - SECONDS))
  [ "$left" -gt 30 ] || { echo "skipped $what ${names[$i]} r$r: out of time"; return; }
  local tag="${what}-${names[$i]}-r$r"
  echo "== $tag ($left s left)"
  KVQ_BAKE="${variants[$i]}" timeout $((left - 10)) "$bin/sweep" "${common[@]}" "$@" \
    --csv "$out/$tag.csv" > "$out/$tag.log" 2>&1
  grep -E "^ *[a-z0-9_=,+]+ +[0-9]+ " "$out/$tag.log" | tail -n 24 | awk '{printf "%s %s %s %s | ", $1, $2, $3, $5} END {print ""}'
  # Few files come back from the device: every run goes into one archive at once.
  (cd "$out" && tar rf ab.tar ./"$tag".* && rm -f ./"$tag".*)
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for i in "${!variants[@]}"; do
    run "$r" "$i" steps --queries 1,4 --steps 20 --warmup 5
  done
  for i in "${!variants[@]}"; do
    run "$r" "$i" n512 --queries 512 --steps 3 --warmup 1
  done
done
gzip -f "$out/ab.tar"
ls -la "$out"
