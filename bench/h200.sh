#!/usr/bin/env bash
# Runs on the H200 device machine: the PyTorch anchor and kvq sweeps in one session, so the
# ratios are side by side. Usage: bash bench/h200.sh OUTDIR [extra sweep args...]
# Needs: .gl/ (Vulkan loader .debs) and target/release/examples/sweep carried along.
set -u
out=${1:?outdir}; shift
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan
tag="h200-$(date -u +%Y-%m-%d)"
nvidia-smi -L | tee "$out/device-$tag.txt"
PYTHONUNBUFFERED=1 python3 bench/anchor_torch_sdpa.py > "$out/anchor-$tag.jsonl" 2> "$out/anchor-$tag.err" &
anchor=$!
wait $anchor
./target/release/examples/sweep "$@" --csv "$out/sweep-$tag.csv" 2>&1 | tee "$out/sweep-$tag.log"
