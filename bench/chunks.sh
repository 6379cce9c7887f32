#!/usr/bin/env bash
# Runs on the device machine (an H200, or an H100): chunks of n new tokens over 32k (qwen3-8b) for the codecs
# BENCHMARKS.md reports, each kernel's GPU ms beside every point, and the PyTorch anchor at
# the same shapes, in one call. Usage: bash bench/chunks.sh OUTDIR. Needs .gl/ and
# target/release/examples/sweep carried along; BUDGET (s, default 540) bounds the whole run.
set -u
out=${1:?outdir}
end=$((SECONDS + ${BUDGET:-540}))
left() { echo $((end - SECONDS)); }
. "$(dirname "$0")/vulkan-env.sh"
tag=$gpu_tag
nvidia-smi -L > "$out/device-$tag.txt"
sweep=./target/release/examples/sweep
codecs=none,q8_sym,q4_sym,turbo3_sym,k_iso3,iso3_sym,k_turbo3+qjl
common=(--model qwen3-8b --ctx 32768 --codecs "$codecs" --kernel-times --rounds 2)
echo "== short chunks ($(left) s left)"
timeout $(( $(left) - 330 )) $sweep "${common[@]}" --queries 1,4,8 --steps 20 --warmup 5 \
  --csv "$out/sweep-qwen3-8b-chunks-$tag.csv" > "$out/sweep-qwen3-8b-chunks-$tag.log" 2>&1
tail -30 "$out/sweep-qwen3-8b-chunks-$tag.log"
echo "== anchor ($(left) s left)"
PYTHONUNBUFFERED=1 timeout $(( $(left) - 230 )) python3 bench/anchor_torch_chunk.py --layers 36 \
  --q-heads 32 --kv-heads 8 --head-dim 128 --ctx 32768 --n 1,4,8,64,512 \
  > "$out/anchor-chunk-$tag.jsonl" 2> "$out/anchor-chunk-$tag.err"
tail -12 "$out/anchor-chunk-$tag.jsonl"
echo "== long chunks ($(left) s left)"
timeout $(( $(left) - 40 )) $sweep "${common[@]}" --queries 64,512 --steps 5 --warmup 2 \
  --csv "$out/sweep-qwen3-8b-chunks-n512-$tag.csv" > "$out/sweep-qwen3-8b-chunks-n512-$tag.log" 2>&1
tail -30 "$out/sweep-qwen3-8b-chunks-n512-$tag.log"
echo "== exact tokens' kernels at 4k ($(left) s left)"
for x in "" "--exact 16,32"; do
  timeout $(( $(left) / 2 )) $sweep --model qwen3-8b --ctx 4096 --codecs none,turbo3_sym --kernel-times \
    --rounds 2 --steps 20 --warmup 5 $x 2>&1 | grep -E "GPU ms per kernel|\] round|^(none|turbo3_sym) "
done > "$out/exact-kernels-4k-$tag.log"
cat "$out/exact-kernels-4k-$tag.log"
ls -la "$out"
