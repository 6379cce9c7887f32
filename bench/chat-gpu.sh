#!/usr/bin/env bash
# One GPU-machine call for the `chat` example's benchmark (BENCHMARKS.md, "Whole model"):
# chat --bench on the qwen3-8b shape with random 4-bit weights (f16 cache, 8-bit and the
# 3/4-bit codecs with exact tokens), then the PyTorch anchor of the same shape, then f16
# weights (what in-kernel dequantization saves). Expects the stripped `chat` binary and
# anchor_torch_model.py in bench/bin-chat/ and the Vulkan loader in .gl/.
# At most about 7.5 minutes (the timeouts below), of which kvq's table takes 2-4.
#   bash bench/chat-gpu.sh OUTDIR
set -o pipefail
out=${1:?usage: chat-gpu.sh OUTDIR}
. bench/vulkan-env.sh
b=bench/bin-chat
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv > "$out/device.txt" 2>&1
timeout 240 "$b/chat" --bench --shape qwen3-8b \
  --codecs none,q8_sym,q4_sym,turbo4_sym,turbo3_sym,k_iso3 --exact 16,32 \
  --contexts 1024,4096,32768 --batch 1,4 --steps 20 --prompt-codecs none,turbo3_sym \
  --csv "$out/chat-qwen3-8b.csv" --plot "$out/chat-qwen3-8b.svg" 2>&1 | tee "$out/chat.log"
PYTHONUNBUFFERED=1 timeout 150 python3 "$b/anchor_torch_model.py" --ctx 1024,4096,32768 \
  --batch 1,4 --prompt 4096 2>&1 | tee "$out/anchor.jsonl"
timeout 40 "$b/chat" --bench --shape qwen3-8b --weights f16 --codecs none \
  --contexts 1024,4096 --batch 1 --steps 20 --prompt-tokens 0 2>&1 | tee -a "$out/chat.log"
