//! What the sweep runs: the model, contexts, steps and codecs the arguments and the adapter
//! settle on, and the memory budget a point's cache must fit.

use kvq::memory::fmt_bytes;
use kvq::{ExactTokens, GpuContext, KvCodecs};

use crate::args::Args;
use crate::measure::capacity;
use crate::models::{MODELS, Model};

/// The model and contexts a sweep on a GPU takes unless `--model` / `--ctx` name others.
pub const GPU_DEFAULT: (&str, &[u32]) = ("llama3-8b", &[4096, 32768]);
/// The same on a CPU adapter (lavapipe): a small model and short contexts, so that the sweep
/// without flags finishes in about a minute on 2 cores.
pub const CPU_DEFAULT: (&str, &[u32]) = ("tiny", &[1024, 8192]);

pub struct Plan {
    pub model: &'static Model,
    pub ctxs: Vec<u32>,
    /// Timed steps per point.
    pub steps: usize,
    /// The caches to time, only those the GPU path serves.
    pub codecs: Vec<Entry>,
    /// The most K/V store bytes a point may plan, and where that limit comes from.
    budget: Option<(u64, &'static str)>,
}

impl Plan {
    /// Settles the sweep and announces it on stderr. On a CPU adapter it picks small sizes
    /// where none are given (the `tiny` model without --model, short contexts without
    /// --ctx), so the default command finishes in seconds. An unknown
    /// model or codec or zero steps is an error (before anything is printed).
    pub fn new(args: &Args, ctx: &GpuContext) -> Result<Plan, String> {
        let small = ctx.is_cpu();
        let (default_model, default_ctx) = if small { CPU_DEFAULT } else { GPU_DEFAULT };
        let model_name = args.model.as_deref().unwrap_or(default_model);
        let Some(model) = MODELS.iter().find(|m| m.name == model_name) else {
            let names: Vec<_> = MODELS.iter().map(|m| m.name).collect();
            return Err(format!(
                "unknown model '{model_name}'; valid: {}",
                names.join(", ")
            ));
        };
        let ctxs = args.ctx.clone().unwrap_or_else(|| default_ctx.to_vec());
        let steps = args.steps.unwrap_or(if ctx.is_cpu() { 5 } else { 50 });
        if steps == 0 {
            return Err("--steps must be at least 1".into());
        }
        let mut plan = Plan {
            model,
            ctxs,
            steps,
            codecs: parse_codecs(&args.codecs, args.exact)?,
            budget: None,
        };
        plan.announce(
            ctx,
            args,
            small && (args.model.is_none() || args.ctx.is_none()),
        );
        // Codecs the GPU path does not serve yet: one line each, asked of the library (never
        // a list kept here).
        plan.codecs.retain(|e| {
            let c = e.codecs;
            let ok = kvq::kernels::gpu_supported(c.k) && kvq::kernels::gpu_supported(c.v);
            if !ok {
                eprintln!(
                    "skipped codec {}: no GPU kernels yet (CPU reference only)",
                    e.name
                );
            }
            ok
        });
        plan.budget = memory_budget(args, ctx);
        Ok(plan)
    }

    fn announce(&self, ctx: &GpuContext, args: &Args, small: bool) {
        let m = self.model;
        eprintln!(
            "kvq sweep on '{}' ({:?}, {:?}){}: model {} ({} layers, {}/{} heads, D {}), batch {}{}, ctx {:?}, {} steps",
            ctx.info.name,
            ctx.info.backend,
            ctx.info.device_type,
            if small {
                " [CPU adapter: small default sizes]"
            } else {
                ""
            },
            m.name,
            m.layers,
            m.q_heads,
            m.kv_heads,
            m.head_dim,
            args.batch,
            if args.queries != [1] {
                format!(
                    ", {:?} new tokens per sequence a step (chunks)",
                    args.queries
                )
            } else {
                String::new()
            },
            self.ctxs,
            self.steps
        );
    }

    /// Why the point cannot fit the memory budget, checked before its cache is built (so a
    /// big context is skipped without trying); None where it fits or there is no budget.
    pub fn over_budget(
        &self,
        codecs: KvCodecs,
        context: u32,
        queries: u32,
        args: &Args,
    ) -> Option<String> {
        let (budget, why) = self.budget?;
        let cap = capacity(context, args.warmup, self.steps, queries);
        let planned = planned_store_bytes(self.model, codecs, cap, args.batch);
        (planned > budget).then(|| {
            format!(
                "its K/V store needs {}, over the memory budget of {} ({why})",
                fmt_bytes(planned),
                fmt_bytes(budget)
            )
        })
    }
}

/// One cache the sweep times: its name as asked (the table's, the CSV's and the plot's), its
/// codecs and its exact tokens.
pub struct Entry {
    pub name: String,
    pub codecs: KvCodecs,
    pub exact: ExactTokens,
}

/// The exact tokens a `+exact` suffix asks for: the window the quality measurements recommend
/// (QUALITY.md, "Exact tokens on the GPU").
const EXACT_SUFFIX: ExactTokens = ExactTokens {
    sink: 16,
    recent: 32,
    k_mean: false,
};

/// A `--codecs` name: a cache name (`KvCodecs::parse`) with an optional `+exact` (16 sink and
/// 32 recent tokens exact) or `+exact+kmean` (K's mean removed too) suffix; a name without
/// one takes `global` (`--exact`).
pub fn parse_entry(name: &str, global: ExactTokens) -> Result<Entry, String> {
    let (cache, exact) = if let Some(c) = name.strip_suffix("+exact+kmean") {
        (
            c,
            ExactTokens {
                k_mean: true,
                ..EXACT_SUFFIX
            },
        )
    } else if let Some(c) = name.strip_suffix("+exact") {
        (c, EXACT_SUFFIX)
    } else {
        (name, global)
    };
    let codecs = KvCodecs::parse(cache)
        .map_err(|e| format!("{e}; a sweep's name may end in +exact or +exact+kmean"))?;
    Ok(Entry {
        name: name.to_string(),
        codecs,
        exact,
    })
}

/// `--codecs` names (`all`: every name the library lists) as entries.
fn parse_codecs(asked: &[String], global: ExactTokens) -> Result<Vec<Entry>, String> {
    let names: Vec<String> = if asked.iter().any(|c| c == "all") {
        KvCodecs::all_names()
    } else {
        asked.to_vec()
    };
    names.iter().map(|n| parse_entry(n, global)).collect()
}

/// A CPU adapter's memory is the host's: stay within half of what is free, so a big context
/// is skipped rather than pushing the machine into swap or the OOM killer. A GPU's own budget
/// is enforced by wgpu (allocations past it are typed OutOfMemory errors).
fn memory_budget(args: &Args, ctx: &GpuContext) -> Option<(u64, &'static str)> {
    match args.mem_budget {
        Some(gib) => Some(((gib * (1u64 << 30) as f64) as u64, "--mem-budget")),
        None if ctx.is_cpu() => host_available_bytes().map(|b| {
            (
                b / 2,
                "half the free host memory (CPU adapter); --mem-budget GIB to change",
            )
        }),
        None => None,
    }
}

/// Free host memory in bytes (Linux `MemAvailable`), for a CPU adapter's memory budget.
fn host_available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes of K/V store a cache of this shape allocates (whole 32-token blocks), before it is
/// built.
fn planned_store_bytes(m: &Model, codecs: KvCodecs, capacity: u32, batch: u32) -> u64 {
    // (A local layer's ring: its window and slack, as the cache sizes it.)
    let spec = m.options(kvq::CacheSpec::new(
        m.layers, m.q_heads, m.kv_heads, m.head_dim, capacity,
    ));
    let slots: u64 = (0..m.layers)
        .map(|l| spec.layer_capacity(l).next_multiple_of(32) as u64)
        .sum();
    let rows = batch as u64 * m.kv_heads as u64 * slots;
    rows * 4 * (codecs.k.row_words(m.head_dim) + codecs.v.row_words(m.v_dim())) as u64
}
