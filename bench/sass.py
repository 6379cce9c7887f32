#!/usr/bin/env python3
"""SASS listings of kvq kernels from NVIDIA Vulkan pipeline-cache data.

`kernel_stats --dump DIR` (run on the NVIDIA machine) writes each pipeline's cache data as
DIR/<codec>-<entry>.cache. NVIDIA's driver stores the compiled code in it zstd-compressed;
this script decompresses it (the `zstd` command), finds the code (it ends with the usual
`EXIT; BRA self` pair) and disassembles it with `nvdisasm -b SM90` into <file>.sass, then
prints per loop (backward branch) its instruction count and the commonest opcodes.

nvdisasm needs no GPU: `pip download nvidia-cuda-nvdisasm` has it (nvidia/cu13/bin/nvdisasm);
point NVDISASM at it. Usage: NVDISASM=path python3 bench/sass.py DIR/*.cache
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

NVDISASM = os.environ.get("NVDISASM", "nvdisasm")
ARCH = os.environ.get("SASS_ARCH", "SM90")
ZSTD_MAGIC = bytes.fromhex("28b52ffd")
BRA_SELF = bytes.fromhex("4779fc00fcffffff")  # BRA to itself: the padding after EXIT


def disassemble(code):
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(code)
        f.flush()
        r = subprocess.run([NVDISASM, "-b", ARCH, f.name], capture_output=True, text=True)
    return r.returncode, r.stdout


def sass_of(raw):
    end = raw.rfind(BRA_SELF)
    if end < 0:
        return None
    end += 16
    # The first 16-byte-aligned start (relative to the end) that disassembles cleanly.
    for start in range(end % 16, end, 16):
        rc, out = disassemble(raw[start:end])
        if rc == 0:
            return out
    return None


def loops(sass):
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    at = {a: i for i, (a, _) in enumerate(ins)}
    for i, (a, t) in enumerate(ins):
        m = re.search(r"BRA (?:0x)?([0-9a-f]+)", t)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in at:
            body = ins[at[int(m.group(1), 16)]:i + 1]
            ops = collections.Counter(
                re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for _, x in body)
            yield int(m.group(1), 16), a, len(body), ops


def main(paths):
    for path in paths:
        data = open(path, "rb").read()
        z = data.find(ZSTD_MAGIC)
        if z < 0:
            print(f"{path}: no zstd frame")
            continue
        raw = subprocess.run(["zstd", "-d", "-q", "-c"], input=data[z:],
                             capture_output=True).stdout
        sass = sass_of(raw)
        if sass is None:
            print(f"{path}: no code found")
            continue
        out = re.sub(r"\.cache$", "", path) + ".sass"
        open(out, "w").write(sass)
        n = sum(1 for l in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]+\*/", l))
        print(f"{out}: {n} instructions")
        for lo, hi, size, ops in loops(sass):
            top = ", ".join(f"{k} {v}" for k, v in ops.most_common(10))
            print(f"  loop {lo:#x}-{hi:#x}: {size} instructions ({top})")


if __name__ == "__main__":
    main(sys.argv[1:])
