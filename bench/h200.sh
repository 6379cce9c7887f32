#!/usr/bin/env bash
# Runs on the H200 device machine: the PyTorch SDPA anchor and a kvq sweep in one session, so
# the ratios are side by side. Usage: bash bench/h200.sh OUTDIR [sweep args...]
# Needs .gl/ (libvulkan1 and the glvnd libraries as .debs, see BENCHMARKS.md, "On the H200") and
# target/release/examples/sweep carried along.
set -u
out=${1:?outdir}; shift
. "$(dirname "$0")/vulkan-env.sh"
tag="h200-$(date -u +%Y-%m-%d)"
nvidia-smi -L | tee "$out/device-$tag.txt"
PYTHONUNBUFFERED=1 python3 bench/anchor_torch_sdpa.py > "$out/anchor-$tag.jsonl" 2> "$out/anchor-$tag.err"
grep cudnn "$out/anchor-$tag.jsonl"
./target/release/examples/sweep "$@" --csv "$out/sweep-$tag.csv" --plot "$out/sweep-$tag.svg" 2>&1 | tee "$out/sweep-$tag.log"
