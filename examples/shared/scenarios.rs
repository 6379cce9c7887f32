//! The scenarios the exported replay plans cover: what `examples/export_wgsl.rs` writes for
//! the Dawn harness (`web/replay.mjs`) and what `tests/export.rs` checks and replays. Shared
//! by both through `#[path]` (not an example of its own); the library only builds a plan for
//! a given [`Scenario`] (`kvq::export::replay_plan`).

use kvq::export::{Scenario, StepPath};
use kvq::kernels::gpu_supported;
use kvq::{CacheSpec, Codec, InputType, KvCodecs};

/// The codecs the web harness runs: every family at every bit width it serves, both scale
/// granularities and QJL on each rotated family; a subset of `kvq::export::gpu_codecs` (the
/// ~50 variants all share these kernels' code paths, and each costs a pipeline build on a CPU
/// driver).
pub fn harness_codecs() -> Vec<Codec> {
    [
        "none",
        "q8",
        "q4",
        "turbo1",
        "turbo2b",
        "turbo3",
        "turbo4b",
        "rotor1b",
        "rotor2",
        "rotor3",
        "rotor4b",
        "iso1",
        "iso2b",
        "iso3b",
        "iso4",
        "turbo3+qjl",
        "rotor3b+qjl",
        "iso4+qjl",
    ]
    .iter()
    .filter_map(|n| Codec::parse(n).ok())
    .filter(|&c| gpu_supported(c))
    .collect()
}

/// The scenarios kvq's web harness runs: every codec of [`harness_codecs`] as K (with V the
/// next codec of the list that has no QJL) and as V, on rotating shapes (head_dim 64 and 128,
/// GQA 1 and 4, one and two sequences, one and three storage segments, prefill on the small
/// and the wide append path, lengths that are no multiple of any tile), the pairings taking
/// the separate and the fused step path in turn, with f32 and f16 inputs alternating; then
/// chunks, exact tokens, and sink logits with a softcap over GQA 16 on a layer with a window
/// of its own.
pub fn scenarios() -> Vec<Scenario> {
    // (head_dim, q_heads, kv_heads, batch, segment_tokens, prefill)
    let shapes: [(u32, u32, u32, u32, Option<u32>, u32); 4] = [
        (64, 4, 4, 1, None, 70),
        (128, 8, 2, 2, None, 37),
        (128, 4, 4, 2, Some(64), 150),
        (64, 8, 2, 1, Some(32), 5),
    ];
    let codecs = harness_codecs();
    let mut pairs = Vec::new();
    for (i, &k) in codecs.iter().enumerate() {
        let v = (1..=codecs.len())
            .map(|o| codecs[(i + o) % codecs.len()])
            .find(|c| !c.qjl)
            .unwrap_or(Codec::NONE);
        pairs.push(KvCodecs { k, v });
    }
    let mut out = Vec::new();
    for (i, pair) in pairs.into_iter().enumerate() {
        for (j, path) in [StepPath::Separate, StepPath::Fused]
            .into_iter()
            .enumerate()
            .filter(|&(j, _)| j == i % 2)
        {
            let (d, qh, kvh, batch, seg, prefill) = shapes[(i + i / 4) % shapes.len()];
            let steps = 3;
            // f32 products: the plans hold the exact kernels' tolerance (1e-3).
            let mut spec = CacheSpec::new(2, qh, kvh, d, prefill + steps + 11)
                .with_codecs(pair)
                .with_batch(batch)
                .with_splits(3)
                .with_precision(kvq::Precision::Exact);
            spec.segment_tokens = seg;
            if i % 3 == 2 {
                // A sliding window whose ring wraps during the prefill or the steps.
                spec.capacity = (prefill + steps).div_ceil(2).max(4);
                spec.window = Some(spec.capacity - 2);
            }
            let path_name = path_name(path);
            let window = spec.window.map(|w| format!("-w{w}")).unwrap_or_default();
            let name = format!(
                "{}-d{d}-g{}-b{batch}-n{prefill}{window}-{path_name}",
                pair.name().replace([',', '='], "_").replace('+', "p"),
                qh / kvh
            );
            out.push(Scenario {
                name,
                spec,
                layer: 1,
                prefill,
                // Input types alternate so every append and step module variant is dispatched.
                prefill_input: if i % 2 == 1 {
                    InputType::F16
                } else {
                    InputType::F32
                },
                steps,
                step_input: if (i / 2) % 2 == 1 {
                    InputType::F16
                } else {
                    InputType::F32
                },
                path,
                seed: 1000 + i as u64 * 2 + j as u64,
            });
        }
    }
    // Chunks of new tokens attended causally, on three of those caches: an int V, a ring
    // (whose window leaves the chunk its slack), a QJL K; each by the chunk's split kernel
    // and by the prefill kernel.
    let picks = [
        0,
        out.iter()
            .position(|s| s.spec.window.is_some())
            .unwrap_or(1),
        out.len() - 1,
    ];
    for (n, i) in picks.into_iter().enumerate() {
        let mut sc = out[i].clone();
        if sc.spec.window.is_none() {
            sc.spec.capacity += (StepPath::Chunk.tokens() - 1) * sc.steps;
        }
        sc.name = sc
            .name
            .replace(&format!("-{}", path_name(sc.path)), "-chunk");
        sc.path = StepPath::Chunk;
        sc.seed = 5000 + n as u64;
        // The same chunks of the same data through the prefill kernel (a QJL K's queries
        // rotated first).
        let mut tiled = sc.clone();
        tiled.spec.prefill_from = Some(1);
        tiled.name = tiled.name.replace("-chunk", "-prefill");
        // One chunk of each kernel with fewer splits than the decode's 3 (a value of the
        // slice's params, so the same kernels): its grid is not the plan's.
        if n == 0 {
            sc.spec.chunk_splits = Some(1);
            tiled.spec.chunk_splits = Some(2);
        }
        out.push(sc);
        out.push(tiled);
    }
    // Exact tokens (sink and ring) on three caches without a window, one per path, two with
    // K's mean removed: the sink completed by the prefill (small or wide append), the ring
    // wrapping during the steps.
    let plain: Vec<usize> = (0..out.len())
        .filter(|&i| out[i].spec.window.is_none())
        .collect();
    for (n, (path, k_mean)) in [
        (StepPath::Separate, true),
        (StepPath::Fused, true),
        (StepPath::Chunk, false),
    ]
    .into_iter()
    .enumerate()
    {
        let mut sc = out[plain[(n * 5 + 1) % plain.len()]].clone();
        sc.spec.exact = kvq::ExactTokens {
            sink: 3,
            recent: 4,
            k_mean,
        };
        if path == StepPath::Chunk {
            sc.spec.capacity += (StepPath::Chunk.tokens() - 1) * sc.steps;
        }
        sc.name = format!(
            "{}-x3_4{}-{}",
            sc.name
                .trim_end_matches(&format!("-{}", path_name(sc.path)))
                .trim_end_matches("-chunk"),
            if k_mean { "k" } else { "" },
            path_name(path)
        );
        sc.path = path;
        sc.seed = 7000 + n as u64;
        if path == StepPath::Chunk {
            // The exact chunk through the prefill kernel too, on the same data.
            let mut tiled = sc.clone();
            tiled.spec.prefill_from = Some(1);
            tiled.name = tiled.name.replace("-chunk", "-prefill");
            out.push(tiled);
        }
        out.push(sc);
    }
    // Today's model shapes: sink logits and a softcap over GQA 16 (two row groups of one KV
    // head's query heads), on layer 1 of a cache whose layers have windows of their own (a
    // window of 24 over a ring of 32 slots that wraps during the prefill), by the fused step
    // and by chunks through the prefill kernel.
    for (n, path) in [StepPath::Fused, StepPath::Chunk].into_iter().enumerate() {
        let (qh, kvh, d, prefill, steps) = (16u32, 1u32, 64u32, 45u32, 3u32);
        let sinks: Vec<f32> = (0..2 * qh).map(|i| (i % 5) as f32 - 2.0).collect();
        let mut spec = CacheSpec::new(2, qh, kvh, d, prefill + steps * path.tokens() + 11)
            .with_codecs(KvCodecs::parse("k=turbo3,v=q4").unwrap())
            .with_splits(3)
            .with_precision(kvq::Precision::Exact)
            .with_softcap(3.0)
            .with_sink_logits(sinks)
            .with_layer_windows(vec![None, Some(24)]);
        spec.window_slack = 8;
        if path == StepPath::Chunk {
            spec.prefill_from = Some(1);
        }
        out.push(Scenario {
            name: format!(
                "k_turbo3_v_q4-d64-g16-sinks-cap3-lw24-{}",
                if path == StepPath::Chunk {
                    "prefill"
                } else {
                    path_name(path)
                }
            ),
            spec,
            layer: 1,
            prefill,
            prefill_input: InputType::F16,
            steps,
            step_input: InputType::F32,
            path,
            seed: 9000 + n as u64,
        });
    }
    out
}

/// A path's name in scenario names.
fn path_name(path: StepPath) -> &'static str {
    match path {
        StepPath::Separate => "separate",
        StepPath::Fused => "fused",
        StepPath::Chunk => "chunk",
    }
}
