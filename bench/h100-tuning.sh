#!/usr/bin/env bash
# Runs on an H100 device machine: decode steps and chunks of 4 with the H100 SXM tuning's
# splits against 8 splits (about what the unmeasured default gives it), in one call.
# Usage: bash bench/h100-tuning.sh OUTDIR. Needs .gl/ and target/release/examples/sweep.
set -u
out=${1:?outdir}
. "$(dirname "$0")/vulkan-env.sh"
nvidia-smi -L > "$out/device.txt"
for x in "" "--splits 8"; do
  timeout 150 ./target/release/examples/sweep --model qwen3-8b --ctx 4096,32768 \
    --codecs none,q4_sym,turbo3_sym,k_turbo3+qjl --queries 1,4 --steps 20 --warmup 5 --rounds 2 \
    $x --csv "$out/h100-tuning${x// /}.csv" 2>&1 | grep -E "^(none|q4_sym|turbo3_sym|k_turbo3)|sweep on"
done
