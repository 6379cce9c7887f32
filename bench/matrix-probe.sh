#!/usr/bin/env bash
# The sweep's matrix-unit probe beside PyTorch's torch.matmul (f16, 4096^3) in one call on an
# NVIDIA GPU: the anchor, every probe variant in one process, then each variant that process
# did not report in a process of its own (a driver that fails to compile a kernel can lose the
# device, and with it the variants after it), the anchor again (drift), SASS of every variant's
# pipeline (bench/sass.py: needs nvdisasm and zstd), and a summary ÷ torch.matmul (the median
# of the anchor's `a@b` runs).
#
# Usage (repository root, Vulkan loader set up: `. bench/vulkan-env.sh`):
#   SWEEP=path/to/sweep bash bench/matrix-probe.sh OUT [variant ...]   (default: every variant)
set -uo pipefail
out=${1:?usage: bench/matrix-probe.sh OUT [variant ...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
sweep=${SWEEP:-target/release/examples/sweep}
mkdir -p "$out/dump"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv; } > "$out/device.txt" 2>&1
python3 "$here/anchor_torch_matmul.py" > "$out/anchor.jsonl" 2>> "$out/probe.log"
python3 "$here/anchor_torch_matmul.py" >> "$out/anchor.jsonl" 2>> "$out/probe.log"
variants=("$@")
[ ${#variants[@]} -eq 0 ] && mapfile -t variants < <("$sweep" --matrix list)
list=$(IFS=,; echo "${variants[*]}")
timeout 300 "$sweep" --probes-only --matrix "$list" --matrix-dump "$out/dump" >> "$out/probe.log" 2>&1 \
  || echo "matrix: the process of every variant failed (exit $?)" >> "$out/probe.log"
for v in "${variants[@]}"; do
  grep -q "^matrix $v: [0-9.]* TFLOP/s" "$out/probe.log" && continue
  timeout 120 "$sweep" --probes-only --matrix "$v" --matrix-dump "$out/dump" >> "$out/probe.log" 2>&1 \
    || echo "matrix $v: process failed (exit $?)" >> "$out/probe.log"
done
python3 "$here/anchor_torch_matmul.py" >> "$out/anchor.jsonl" 2>> "$out/probe.log"
nvdisasm=${NVDISASM:-$(command -v nvdisasm || ls /usr/local/cuda*/bin/nvdisasm 2>/dev/null | head -1)}
if [ -n "$nvdisasm" ] && ls "$out"/dump/*.cache > /dev/null 2>&1; then
  NVDISASM=$nvdisasm python3 "$here/sass.py" "$out"/dump/*.cache > "$out/dump/loops.txt" 2>&1
fi
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, re, sys
out = sys.argv[1]
anchors = [json.loads(l) for l in open(f"{out}/anchor.jsonl") if l.startswith("{")]
ab = sorted(a["tflops"] for a in anchors if a["form"] == "a@b")
ref = ab[len(ab) // 2] if ab else None
print("torch.matmul f16 4096^3:", ", ".join(f'{a["form"]} {a["tflops"]}' for a in anchors), "TFLOP/s")
print(f"÷ torch: over the median a@b run, {ref} TFLOP/s")
print(f"{'variant':40s} {'TFLOP/s':>8s} {'÷ torch':>8s}  rel err")
for line in open(f"{out}/probe.log"):
    m = re.match(r"matrix (\S+): ([\d.]+) TFLOP/s \(([\d.]+) ms\)(?:, rel err (\S+))?", line)
    if m:
        t = float(m.group(2))
        print(f"{m.group(1):40s} {t:8.1f} {t / ref if ref else float('nan'):8.3f}  {m.group(4) or '-'}")
    elif line.startswith("matrix ") and ("not measured" in line or "failed" in line):
        print(line.rstrip())
PY
tar czf "$out/dump.tar.gz" -C "$out" dump && rm -rf "$out/dump"
