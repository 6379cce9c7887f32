//! What the sweep runs: the model, contexts, steps and codecs the arguments and the adapter
//! settle on, and the memory budget a point's cache must fit.

use kvq::memory::fmt_bytes;
use kvq::{GpuContext, KvCodecs};

use crate::args::Args;
use crate::measure::capacity;
use crate::models::{MODELS, Model};

pub struct Plan {
    pub model: &'static Model,
    pub ctxs: Vec<u32>,
    /// Timed steps per point.
    pub steps: usize,
    /// (name as asked, codecs), only those the GPU path serves.
    pub codecs: Vec<(String, KvCodecs)>,
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
        let model_name = args.model.clone().unwrap_or_else(|| {
            if small {
                "tiny".into()
            } else {
                "llama3-8b".into()
            }
        });
        let Some(model) = MODELS.iter().find(|m| m.name == model_name) else {
            let names: Vec<_> = MODELS.iter().map(|m| m.name).collect();
            return Err(format!(
                "unknown model '{model_name}'; valid: {}",
                names.join(", ")
            ));
        };
        let ctxs = args.ctx.clone().unwrap_or_else(|| {
            if small {
                vec![256, 1024]
            } else {
                vec![4096, 32768]
            }
        });
        let steps = args.steps.unwrap_or(if ctx.is_cpu() { 5 } else { 50 });
        if steps == 0 {
            return Err("--steps must be at least 1".into());
        }
        let mut plan = Plan {
            model,
            ctxs,
            steps,
            codecs: parse_codecs(&args.codecs)?,
            budget: None,
        };
        plan.announce(
            ctx,
            args,
            small && (args.model.is_none() || args.ctx.is_none()),
        );
        // Codecs the GPU path does not serve yet: one line each, asked of the library (never
        // a list kept here).
        plan.codecs.retain(|(name, c)| {
            let ok = kvq::kernels::gpu_supported(c.k) && kvq::kernels::gpu_supported(c.v);
            if !ok {
                eprintln!("skipped codec {name}: no GPU kernels yet (CPU reference only)");
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

/// `--codecs` names (`all`: every name the library lists) with their parsed codecs.
fn parse_codecs(asked: &[String]) -> Result<Vec<(String, KvCodecs)>, String> {
    let names: Vec<String> = if asked.iter().any(|c| c == "all") {
        KvCodecs::all_names()
    } else {
        asked.to_vec()
    };
    names
        .into_iter()
        .map(|n| match KvCodecs::parse(&n) {
            Ok(c) => Ok((n, c)),
            Err(e) => Err(e.to_string()),
        })
        .collect()
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
    let rows =
        batch as u64 * m.layers as u64 * m.kv_heads as u64 * capacity.next_multiple_of(32) as u64;
    rows * 4 * (codecs.k.row_words(m.head_dim) + codecs.v.row_words(m.head_dim)) as u64
}
