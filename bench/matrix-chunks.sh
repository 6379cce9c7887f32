#!/usr/bin/env bash
# Runs on the device machine: the matrix prefill kernel (cooperative matrices) tested against
# the reference, then chunks of 64 and 512 new tokens over 32k (qwen3-8b, f16 products) with
# the matrix units off and on (ROUNDS rounds, default 1, interleaved), and FlexAttention at the
# same shape; then short chunks (SHORT, default 1,4,8) by the fused step and the split kernel
# (units off) and by the matrix prefill kernel (units on, --prefill-from 1: one new token is a
# chunk of 1, the decode on matrix units). CODECS, QUERIES and SHORT override the
# sweep's codecs and chunk sizes (SHORT= skips the short chunks), LONG_STEPS and SHORT_STEPS
# its timed steps (5, 10).
# Usage: bash bench/matrix-chunks.sh OUTDIR [BIN]: BIN (default bench/bin-mm) holds `sweep`,
# the `chunk` test binary and optionally `kernel_stats` (then registers and pipeline caches for
# bench/sass.py, rows 32 and 16), built here; .gl/ carried along. BUDGET (s, default 560).
# A device call returns 8 files at most: tar OUTDIR there.
set -u
out=${1:?outdir}
bin=${2:-bench/bin-mm}
end=$((SECONDS + ${BUDGET:-560}))
left() { echo $((end - SECONDS)); }
. "$(dirname "$0")/vulkan-env.sh"
tag=$gpu_tag
nvidia-smi -L > "$out/device-$tag.txt"
echo "== the chunk tests on the GPU, matrix units required ($(left) s left)"
KVQ_MATRIX=on KVQ_REQUIRE_MATRIX=1 timeout 120 $bin/chunk matrix --test-threads 6 > "$out/chunk-tests-$tag.log" 2>&1
echo "rc $?"; grep -E "test result|FAILED|panicked|matrix units|kvq tests" "$out/chunk-tests-$tag.log" | head -20
codecs=${CODECS:-none,q8_sym,q4_sym,turbo3_sym,k_iso3,k_turbo3+qjl}
queries=${QUERIES:-64,512}
base=(--model qwen3-8b --ctx 32768 --codecs "$codecs" --precision fast --kernel-times --rounds 1)
common=("${base[@]}" --prefill-from 64 --queries "$queries" --steps ${LONG_STEPS:-5} --warmup 2)
for round in $(seq 1 ${ROUNDS:-1}); do
  for m in off on; do
    echo "== round $round, matrix $m ($(left) s left)"
    KVQ_MATRIX=$m timeout $(( $(left) / 3 )) $bin/sweep "${common[@]}" \
      --csv "$out/sweep-matrix-$m-r$round-$tag.csv" > "$out/sweep-matrix-$m-r$round-$tag.log" 2>&1
    grep -E "matrix units" "$out/sweep-matrix-$m-r$round-$tag.log"; tail -22 "$out/sweep-matrix-$m-r$round-$tag.log" | cut -c1-160
  done
done
short=${SHORT-1,4,8}
echo "== anchor ($(left) s left)"
PYTHONUNBUFFERED=1 timeout $(( $(left) < 150 ? $(left) : 150 )) python3 bench/anchor_torch_chunk.py --layers 36 \
  --q-heads 32 --kv-heads 8 --head-dim 128 --ctx 32768 --n "$queries${short:+,$short}" \
  > "$out/anchor-chunk-$tag.jsonl" 2> "$out/anchor-chunk-$tag.err"
cat "$out/anchor-chunk-$tag.jsonl"
if [ -n "$short" ]; then
  for m in off on; do
    echo "== short chunks, matrix $m ($(left) s left)"
    extra=(); [ $m = on ] && extra=(--prefill-from 1)
    KVQ_MATRIX=$m timeout $(( $(left) / 3 )) $bin/sweep "${base[@]}" \
      --queries "$short" --steps ${SHORT_STEPS:-10} --warmup 3 "${extra[@]}" \
      --csv "$out/sweep-short-matrix-$m-$tag.csv" > "$out/sweep-short-matrix-$m-$tag.log" 2>&1
    tail -22 "$out/sweep-short-matrix-$m-$tag.log" | cut -c1-160
  done
fi
if [ -x $bin/kernel_stats ]; then
  echo "== registers and SASS of the matrix prefill kernel ($(left) s left)"
  for rows in 32 16; do
    timeout 60 $bin/kernel_stats --model qwen3-8b --codecs "$codecs" --matrix 16 --matrix-rows $rows \
      --dump "$out/sass-rows$rows" 2>&1 | tee "$out/kernel-stats-rows$rows-$tag.txt" | cut -c1-200
  done
fi
