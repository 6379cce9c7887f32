# Anchor for `chat --bench --shape qwen3-8b`: the same model shape (36 layers, 4096 wide,
# 32 / 8 heads of 128, SwiGLU 12288, vocabulary 151936, q/k RMSNorm, untied output) in PyTorch,
# f16 weights (random) and a static f16 KV cache, one decode step of the whole model at each
# context: eager, eager in one CUDA graph, and torch.compile'd layers in one CUDA graph; and a
# prompt of N tokens (causal SDPA). Prints one JSON line per point with the bytes a step reads.
#   python3 bench/anchor_torch_model.py --ctx 1024,4096,32768 --batch 1,4 --prompt 4096
import argparse, json, sys, time
import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--ctx", default="1024,4096,32768")
p.add_argument("--batch", default="1,4")
p.add_argument("--prompt", type=int, default=4096)
p.add_argument("--layers", type=int, default=36)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--modes", default="eager,graph,compile")
a = p.parse_args()
torch.manual_seed(0)
dev, dt = "cuda", torch.float16
L, D, HQ, HK, HD, FF, V = a.layers, 4096, 32, 8, 128, 12288, 151936
EPS, BASE = 1e-6, 1e6

def w(*s):
    return (torch.randn(*s, device=dev, dtype=dt) * s[-1] ** -0.5)

layers = [dict(qkv=w((HQ + 2 * HK) * HD, D), o=w(D, HQ * HD), gu=w(2 * FF, D), down=w(D, FF),
               n1=torch.ones(D, device=dev, dtype=dt), n2=torch.ones(D, device=dev, dtype=dt),
               qn=torch.ones(HD, device=dev, dtype=dt), kn=torch.ones(HD, device=dev, dtype=dt))
          for _ in range(L)]
embed, out, out_norm = w(V, D), w(V, D), torch.ones(D, device=dev, dtype=dt)
weight_bytes = sum(t.numel() * 2 for l in layers for t in l.values()) + out.numel() * 2
inv = 1.0 / (BASE ** (torch.arange(0, HD, 2, device=dev, dtype=torch.float32) / HD))

def rms(x, g):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)).to(dt) * g

def rope(x, pos):  # x [B, H, T, HD], NeoX halves
    f = pos[:, None].float() * inv[None, :]
    c, s = f.cos().to(dt), f.sin().to(dt)
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)

def block(h, l, kc, vc, pos, slot):
    # h [B, T, D]; kc, vc [B, HK, S, HD]; pos [T] positions; slot: where the new rows go
    B, T, _ = h.shape
    x = rms(h, l["n1"]) @ l["qkv"].t()
    q, k, v = x.split([HQ * HD, HK * HD, HK * HD], -1)
    q = rms(q.view(B, T, HQ, HD), l["qn"]).transpose(1, 2)
    k = rms(k.view(B, T, HK, HD), l["kn"]).transpose(1, 2)
    v = v.view(B, T, HK, HD).transpose(1, 2)
    q, k = rope(q, pos), rope(k, pos)
    kc.index_copy_(2, slot, k)
    vc.index_copy_(2, slot, v)
    o = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True, is_causal=T > 1)
    h = h + o.transpose(1, 2).reshape(B, T, HQ * HD) @ l["o"].t()
    g, u = (rms(h, l["n2"]) @ l["gu"].t()).view(B, T, FF, 2).unbind(-1)
    return h + (F.silu(g) * u) @ l["down"].t()

def step(tok, caches, pos, slot, blk):
    h = embed[tok]
    for l, (kc, vc) in zip(layers, caches):
        h = blk(h, l, kc, vc, pos, slot)
    return (rms(h[:, -1], out_norm) @ out.t()).argmax(-1)

def timed(fn, n):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        e0.record(); fn(); e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    return ts[len(ts) // 2]

compiled = None

def decode(mode, B, ctx):
    global compiled
    # The cache holds exactly ctx positions: each timed step rewrites the last one, so a
    # step attends ctx keys with static shapes (no mask, CUDA-graph friendly).
    caches = [(torch.randn(B, HK, ctx, HD, device=dev, dtype=dt),
               torch.randn(B, HK, ctx, HD, device=dev, dtype=dt)) for _ in range(L)]
    kv_bytes = 2 * L * B * HK * ctx * HD * 2
    tok = torch.randint(0, V, (B, 1), device=dev)
    pos = torch.tensor([ctx - 1], device=dev)
    slot = torch.tensor([ctx - 1], device=dev)
    try:
        t0 = time.time()
        blk = block
        if mode == "compile":
            if compiled is None:
                compiled = torch.compile(block)
            blk = compiled
        fn = lambda: step(tok, caches, pos, slot, blk)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        if mode in ("graph", "compile"):
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                fn()
            run = g.replay
        else:
            run = fn
        ms = timed(run, a.steps)
        print(json.dumps(dict(kind="decode", mode=mode, batch=B, ctx=ctx, step_ms=ms,
                              tok_s=B * 1000 / ms, weight_bytes=weight_bytes, kv_bytes=kv_bytes,
                              gbps=(weight_bytes + kv_bytes) / ms / 1e6,
                              setup_s=time.time() - t0)))
    except Exception as ex:
        print(json.dumps(dict(kind="decode", mode=mode, batch=B, ctx=ctx, error=str(ex)[:300])))
    sys.stdout.flush()
    del caches
    torch.cuda.empty_cache()

def prompt(N):
    # A prompt of N tokens into an empty cache (batch 1), eager: the matmuls on tensor cores.
    caches = [(torch.zeros(1, HK, N, HD, device=dev, dtype=dt),
               torch.zeros(1, HK, N, HD, device=dev, dtype=dt)) for _ in range(L)]
    tok = torch.randint(0, V, (1, N), device=dev)
    pos = torch.arange(N, device=dev)
    fn = lambda: step(tok, caches, pos, pos, block)
    fn(); torch.cuda.synchronize()
    ms = timed(fn, 3)
    print(json.dumps(dict(kind="prompt", mode="eager", batch=1, tokens=N, ms=ms, tok_s=N * 1000 / ms)))
    sys.stdout.flush()
    del caches
    torch.cuda.empty_cache()

print(json.dumps(dict(kind="device", name=torch.cuda.get_device_name(), torch=torch.__version__,
                      weight_bytes=weight_bytes)))
modes = a.modes.split(",")
# Eager and graph first, then the prompt, then torch.compile (its first call compiles).
for mode in [m for m in modes if m != "compile"]:
    for B in [int(b) for b in a.batch.split(",")]:
        for ctx in [int(c) for c in a.ctx.split(",")]:
            decode(mode, B, ctx)
if a.prompt > 0:
    prompt(a.prompt)
if "compile" in modes:
    for B in [int(b) for b in a.batch.split(",")]:
        for ctx in [int(c) for c in a.ctx.split(",")]:
            decode("compile", B, ctx)
