#!/usr/bin/env python3
"""What f16 products with f16 sums (HFMA2, two multiply-adds an instruction) would do to kvq's
attention output: the error against f64 attention over the same dequantized store, measured
as the GPU tests measure it (max |a - b| / max |b|, requirement 5 allows 1e-3).

Fixture: one KV head of qwen3's shape (D 128, GQA 4), 4096 tokens, random 3-bit Lloyd-Max
codes times a per-row norm for K and V. Scores: the f16 query times f16 levels summed in f16
pairs (64 HFMA2 a token and head), the two halves and the row norm in f32. Values: the f16
weight times f16 levels summed in f16 over a lane's 16 tokens of a tile, then in f32. Then the
K products alone with the f16 pair sums flushed into f32 every 16 and 32 coordinates (8 or 16
HFMA2 and two conversions and adds per flush: 25 % fewer instructions than 16 FFMA at 16).
Needs numpy. Session 16 (BENCHMARKS.md).
"""
import numpy as np

rng = np.random.default_rng(1)
D, T, G = 128, 4096, 4
lv = np.array([-2.152, -1.344, -0.756, -0.245, 0.245, 0.756, 1.344, 2.152]) / np.sqrt(D)
codes_k = rng.integers(0, 8, (T, D))
codes_v = rng.integers(0, 8, (T, D))
nk = rng.uniform(0.5, 2.0, T) * np.sqrt(D)
nv = rng.uniform(0.5, 2.0, T) * np.sqrt(D)
K = lv[codes_k] * nk[:, None]
V = lv[codes_v] * nv[:, None]


def attn(s, v):
    p = np.exp(s - s.max(1, keepdims=True))
    return (p @ v) / p.sum(1, keepdims=True)


def run(q, label, flush=D):
    ref = attn(q @ K.T, V)
    qh = q.astype(np.float16)
    lk = lv[codes_k].astype(np.float16)
    s = np.zeros((G, T))
    for g in range(G):
        acc = np.zeros((T, 2), np.float16)
        part = np.zeros((T, 2), np.float32)
        for i in range(0, D, 2):
            if i and i % flush == 0:
                part += acc.astype(np.float32)
                acc[:] = 0
            acc = (acc + qh[g, i : i + 2] * lk[:, i : i + 2]).astype(np.float16)
        s[g] = (part + acc.astype(np.float32)).sum(1) * nk
    p = np.exp(s - s.max(1, keepdims=True))
    l = p.sum(1)
    lvv = lv[codes_v].astype(np.float16)
    out = np.zeros((G, D))
    for g in range(G):
        w = (p[g] * nv).astype(np.float16)
        for t0 in range(0, T, 16):
            acc = np.zeros(D, np.float16)
            for t in range(t0, t0 + 16):
                acc = (acc + w[t] * lvv[t]).astype(np.float16)
            out[g] += acc.astype(np.float32)
    out /= l[:, None]
    err = lambda a: np.abs(a - ref).max() / np.abs(ref).max()
    sc = q @ K.T
    print(f"{label}: scores sd {sc.std():.2f}, top - mean {np.mean(sc.max(1) - sc.mean(1)):.1f}; "
          f"rel err: f16 K products {err(attn(s, V)):.2e}, f16 K and V products {err(out):.2e}")


for sd in (0.5, 1.0, 2.0, 4.0):
    q = rng.standard_normal((G, D))
    q *= sd / (q @ K.T).std()
    for flush in (D, 16, 32):
        run(q, f"random query, scores sd {sd}, f16 sums flushed every {flush}", flush)
for peak in (4.0, 8.0):
    q = rng.standard_normal((G, D))
    q *= 0.5 / (q @ K.T).std()
    idx = rng.integers(0, T, (G, 3))
    for g in range(G):
        kk = K[idx[g]].sum(0)
        q[g] += kk / (kk @ kk) * peak * 3
    for flush in (D, 16, 32):
        run(q, f"peaked on 3 keys (x{peak:g}), f16 sums flushed every {flush}", flush)
