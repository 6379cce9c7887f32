#!/usr/bin/env python3
"""Instructions a split kernel issues per token and KV head, from its SASS listing.

Reads the `<codec>-split.sass` listings that `bench/sass.py` writes (from `kernel_stats --dump`)
and, per kernel, finds the tile loop (the backward branch whose body holds the most FFMA) and
the V loops nested in it (loops as `bench/sass.py` finds them). A full 128-token tile runs the
tile loop's own body once per token (one invocation scores one token: K phase and softmax) and
the batched V loop's body once per batch of rows and V column: D / VW columns (VW = 8 values for a rotated V codec, else 4) share a
token. So per token and KV head:

    K + softmax = tile loop - nested loops;   V = (D / VW) * (V loop / rows in its body)

with the rows of a V-loop body counted from its FFMA (4 query heads x VW values a row). The
counts are static: both sides of a branch count, and so does code only some invocations run
(a few per cent too many for today's kernels).

With `--gpu CSV` (one or more sweep CSVs holding the codecs at two contexts, by default 4096
and 32768; the best GPU time of the files is taken per point) each codec's GPU time is fitted
as intercept + slope x context. The intercept is what does not grow with the context: the
reduce, each split's set-up, split 0's encoding, and a short context's partly filled tiles. The
slope x the long context is the token loops' time. The loop share is the fraction of the H200's
issue slots (132 multiprocessors x 4 schedulers x 1.98 GHz, the boost clock) that the counted
instructions fill in that time.

Usage: python3 bench/sass_per_token.py DIR/*-split.sass [--gpu sweep.csv ...] [--ctx 4096,32768]
Assumes qwen3-8b's shape (D 128, GQA 4, 8 KV heads, 36 layers) and the same split count at both
contexts (the sweep's `splits` column).
"""
import csv
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass import loops  # noqa: E402  (the loop finder of bench/sass.py)

D, G, KVH, LAYERS = 128, 4, 8, 36
ISSUE_PER_S = 132 * 4 * 1.98e9


def per_token(path, codec):
    # (start, end, instructions, FFMA) of every loop with FFMA in it.
    all_loops = [(lo, hi, n, ops["FFMA"]) for lo, hi, n, ops in loops(open(path).read()) if ops["FFMA"]]
    if not all_loops:
        sys.exit(f"{path}: no loop with FFMA in it (not a split kernel's SASS listing?)")
    tile = max(all_loops, key=lambda l: l[3])
    inner = [l for l in all_loops if l != tile and tile[0] <= l[0] and l[1] <= tile[1]]
    top = [l for l in inner if not any(o != l and o[0] <= l[0] and l[1] <= o[1] for o in inner)]
    rotated_v = codec.endswith("_sym") and any(f in codec for f in ("turbo", "rotor", "iso"))
    vw = 8 if rotated_v else 4
    k = tile[2] - sum(l[2] for l in top)
    v_loops = [l for l in top if l[3] >= G * vw]
    if not v_loops:
        return k, 0.0, 0.0
    v = max(v_loops, key=lambda l: l[3])
    per_row = v[2] / (v[3] / (G * vw))
    return k, per_row, D / vw * per_row


def main(argv):
    gpu, lo, hi, files = None, 4096, 32768, []
    it = iter(argv)
    for a in it:
        if a == "--gpu":
            gpu = gpu or {}
            for r in csv.DictReader(open(next(it))):
                key = (r["codec"], int(r["ctx"]))
                gpu[key] = min(gpu.get(key, float("inf")), float(r["gpu_ms"]))
        elif a == "--ctx":
            lo, hi = (int(x) for x in next(it).split(","))
        elif a.startswith("--"):
            sys.exit(__doc__)
        else:
            files.append(a)
    if not files:
        sys.exit(__doc__)
    rows = []
    for f in files:
        codec = re.sub(r"-split\.sass$", "", f.split("/")[-1]).replace("_qjl", "+qjl")
        k, per_row, v = per_token(f, codec)
        rows.append((codec, k, per_row, v, k + v))
    rows.sort(key=lambda r: r[4])
    none = next((r[4] for r in rows if r[0] == "none"), None)
    head = f"{'codec':14s} {'K+softmax':>9s} {'V/row':>6s} {'V':>6s} {'total':>6s} {'÷none':>6s}"
    if gpu:
        head += f" {'gpu lo':>7s} {'gpu hi':>7s} {'intercept':>9s} {'loops hi':>8s} {'loop share':>10s}"
    print(head)
    for codec, k, per_row, v, total in rows:
        line = f"{codec:14s} {k:9.0f} {per_row:6.1f} {v:6.0f} {total:6.0f}"
        line += f" {total / none:6.2f}" if none else f" {'':6s}"
        if gpu and (codec, lo) in gpu and (codec, hi) in gpu:
            slope = (gpu[(codec, hi)] - gpu[(codec, lo)]) / (hi - lo)
            loops_ms = slope * hi
            full_issue_ms = total * LAYERS * KVH * hi / 32 / ISSUE_PER_S * 1e3
            line += f" {gpu[(codec, lo)]:7.3f} {gpu[(codec, hi)]:7.3f} {gpu[(codec, lo)] - slope * lo:9.3f}"
            line += f" {loops_ms:8.3f} {full_issue_ms / loops_ms:10.2f}"
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
