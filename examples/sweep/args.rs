//! The command line: its flags, their defaults and the usage text printed on `--help` or on
//! a bad flag.

use kvq::GpuContext;

use crate::codec_list::split_codecs;
use crate::matrix::Selection;
use crate::plan::{CPU_DEFAULT, GPU_DEFAULT};

/// The usage text, printed on `--help` or on a bad flag.
pub fn usage() -> String {
    format!(
        "usage: sweep [--model llama3-8b|qwen3-8b|qwen2.5-7b|llama3-70b|tiny|gpt-oss-20b|gemma3-12b|gemma2-9b|phi-2|qwen3-235b|deepseek-v3] [--ctx 4096,32768] [--codecs none,q8_sym,turbo3_sym+exact,...|all]
             [--batch B] [--queries 1,4,8] [--rounds N] [--steps N] [--warmup N] [--busy MS] [--splits N] [--wg 64|128|256] [--unfused] [--shader-checks] [--kernel-times]
             [--wait spin|block] [--exact SINK,RECENT[,kmean]] [--prefill-from N] [--chunk-splits N] [--precision auto|exact|fast] [--csv FILE] [--plot FILE.svg] [--mem-budget GIB]
             [--matrix default|all|off|list|NAME,...] [--matrix-dump DIR] [--probes-only]
       sweep --replot FILE.csv --plot FILE.svg   (plot a sweep CSV again, no GPU needed)
A codec name ending in +exact keeps each sequence's first 16 and newest 32 tokens exact (CacheSpec::with_exact(16, 32));
+exact+kmean also removes K's mean (ExactTokens::k_mean). Defaults: --codecs {}, --csv {DEFAULT_CSV}, --plot {DEFAULT_PLOT};
on a GPU --model {} --ctx {}, on a CPU adapter --model {} --ctx {}.",
        DEFAULT_CODECS.join(","),
        GPU_DEFAULT.0,
        ctx_list(GPU_DEFAULT.1),
        CPU_DEFAULT.0,
        ctx_list(CPU_DEFAULT.1),
    )
}

/// Contexts as `--ctx` takes them.
fn ctx_list(ctx: &[u32]) -> String {
    let c: Vec<String> = ctx.iter().map(u32::to_string).collect();
    c.join(",")
}

/// The codecs a sweep without `--codecs` compares: `none` and one cache of each kind a user
/// would pick (README.md, "Which codec"): 8-bit, 4-bit int, 3-bit turbo with the exact tokens a
/// real model needs at 3 bits, and a K-only iso cache as its quality needs it.
pub const DEFAULT_CODECS: [&str; 5] = [
    "none",
    "q8_sym",
    "q4_sym",
    "turbo3_sym+exact",
    "k_iso3+exact+kmean",
];

/// Where the CSV and the plot go unless `--csv` / `--plot` name other files.
pub const DEFAULT_CSV: &str = "out/sweep.csv";
/// See [`DEFAULT_CSV`].
pub const DEFAULT_PLOT: &str = "out/sweep.svg";

/// How the host waits for a step's commands to finish.
#[derive(Clone, Copy, PartialEq)]
pub enum Wait {
    /// Poll the device without blocking until the submission is done (CUDA's default
    /// synchronize spins like this while a core is free; the anchor is timed that way).
    Spin,
    /// Block in the driver (`PollType::Wait`): frees the core, costs a wake-up.
    Block,
}

impl Wait {
    /// The name `--wait` takes, also written to the CSV's `wait` column.
    pub fn name(self) -> &'static str {
        match self {
            Wait::Spin => "spin",
            Wait::Block => "block",
        }
    }
}

pub struct Args {
    pub model: Option<String>,
    pub ctx: Option<Vec<u32>>,
    /// Codec names as asked (`--codecs`), each with an optional `+exact` / `+exact+kmean`
    /// suffix; [`DEFAULT_CODECS`] without the flag.
    pub codecs: Vec<String>,
    /// Sequences decoded together, each at the point's context.
    pub batch: u32,
    /// New tokens per sequence a step appends and attends, one run of every point per value
    /// (`--queries`; 1: a decode step, more: a chunk, `KvCache::chunk`).
    pub queries: Vec<u32>,
    /// Interleaved rounds: every point of a context (all codecs and queries) is measured once
    /// a round, and a point reports the median of its round medians with their spread.
    pub rounds: usize,
    pub steps: Option<usize>,
    pub warmup: usize,
    /// Milliseconds of back-to-back attends before each point's warm-up (None: 300 on a GPU).
    pub busy_ms: Option<u32>,
    pub splits: Option<u32>,
    pub wg: Option<u32>,
    /// `--shader-checks`: compile with all of wgpu's shader runtime checks (loop bounding too).
    pub shader_checks: bool,
    pub unfused: bool,
    /// `--kernel-times`: one more step per point with each dispatch timed, its GPU ms per
    /// kernel printed and in the CSV (`kernel_ms`).
    pub kernel_times: bool,
    /// `--wait`; None: see [`Args::wait_on`].
    pub wait: Option<Wait>,
    /// `--csv FILE`; [`DEFAULT_CSV`] without it.
    pub csv: String,
    /// `--plot FILE.svg`; [`DEFAULT_PLOT`] without it (required with `--replot`).
    pub plot: Option<String>,
    /// A sweep CSV to plot again (with `--plot`) instead of measuring.
    pub replot: Option<String>,
    pub mem_budget: Option<f64>,
    /// `--exact SINK,RECENT[,kmean]`: every cache whose name has no `+exact` suffix keeps
    /// those tokens exact (`CacheSpec::with_exact`), and with `kmean` removes K's mean
    /// (`ExactTokens::k_mean`).
    pub exact: kvq::ExactTokens,
    /// `--prefill-from N`: chunk slices of at least N new tokens per sequence take the
    /// prefill kernel (`CacheSpec::with_prefill_from`); None: the adapter's tuning. With 1 on
    /// matrix units, steps are chunks of 1 too (`KvCache::steps_as_chunks`).
    pub prefill_from: Option<u32>,
    /// `--chunk-splits N`: a chunk slice's splits per storage segment
    /// (`CacheSpec::with_chunk_splits`); None: the adapter's tuning, by the slice's size.
    pub chunk_splits: Option<u32>,
    /// `--precision auto|exact|fast`: the caches' products (`CacheSpec::with_precision`;
    /// default `auto`, the library's).
    pub precision: kvq::Precision,
    /// `--matrix`: the matrix-unit probe's variants (`default`: the loop kernels and the
    /// fastest GEMM; `list` prints every name).
    pub matrix: Selection,
    /// `--matrix-dump DIR`: each matrix variant's WGSL and pipeline-cache data (machine code).
    pub matrix_dump: Option<String>,
    /// `--probes-only`: run the probes, print them and stop (no points).
    pub probes_only: bool,
}

impl Args {
    /// How to wait for a step on `ctx`: as asked, else spin on a GPU and block on a CPU
    /// adapter (whose worker threads need the cores).
    pub fn wait_on(&self, ctx: &GpuContext) -> Wait {
        self.wait.unwrap_or(if ctx.is_cpu() {
            Wait::Block
        } else {
            Wait::Spin
        })
    }
}

/// Rounds by default: three round medians give a median that one slow round cannot move,
/// and a spread that shows it.
pub const ROUNDS: usize = 3;

impl Default for Args {
    fn default() -> Args {
        Args {
            model: None,
            ctx: None,
            codecs: DEFAULT_CODECS.iter().map(|c| c.to_string()).collect(),
            batch: 1,
            queries: vec![1],
            rounds: ROUNDS,
            steps: None,
            warmup: 5,
            busy_ms: None,
            splits: None,
            wg: None,
            shader_checks: false,
            unfused: false,
            kernel_times: false,
            wait: None,
            csv: DEFAULT_CSV.into(),
            plot: None,
            replot: None,
            mem_budget: None,
            exact: kvq::ExactTokens::NONE,
            prefill_from: None,
            chunk_splits: None,
            precision: kvq::Precision::Auto,
            matrix: Selection::Default,
            matrix_dump: None,
            probes_only: false,
        }
    }
}

impl Args {
    /// Where the plot goes: `--plot`, else [`DEFAULT_PLOT`].
    pub fn plot_path(&self) -> &str {
        self.plot.as_deref().unwrap_or(DEFAULT_PLOT)
    }
}

/// Parses the process's arguments; `--help` prints [`usage`] and exits.
pub fn parse_args() -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    // Flags that measure (all but --plot and --replot): --replot takes none of them.
    let mut measuring = Vec::new();
    while let Some(flag) = it.next() {
        if flag != "--plot" && flag != "--replot" {
            measuring.push(flag.clone());
        }
        match flag.as_str() {
            "--unfused" => a.unfused = true,
            "--kernel-times" => a.kernel_times = true,
            "--shader-checks" => a.shader_checks = true,
            "--probes-only" => a.probes_only = true,
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            f if !VALUED.contains(&f) => return Err(format!("unknown flag {f}")),
            _ => {
                let val = it.next().ok_or(format!("{flag} needs a value"))?;
                set_valued(&mut a, &flag, val)?;
            }
        }
    }
    if a.unfused && a.queries.iter().any(|&n| n > 1) {
        return Err("--unfused times single-token steps: not with --queries".into());
    }
    if a.replot.is_some() {
        if let Some(f) = measuring.first() {
            return Err(format!("--replot takes only --plot, not {f}"));
        }
        if a.plot.is_none() {
            return Err("--replot needs --plot FILE.svg".into());
        }
    }
    Ok(a)
}

/// The flags that take a value, which [`set_valued`] sets.
const VALUED: [&str; 22] = [
    "--model",
    "--ctx",
    "--codecs",
    "--steps",
    "--warmup",
    "--rounds",
    "--busy",
    "--splits",
    "--prefill-from",
    "--chunk-splits",
    "--precision",
    "--batch",
    "--queries",
    "--wg",
    "--exact",
    "--wait",
    "--csv",
    "--plot",
    "--replot",
    "--mem-budget",
    "--matrix",
    "--matrix-dump",
];

/// Sets the flag that takes a value (`--ctx 4096`) on `a`.
fn set_valued(a: &mut Args, flag: &str, val: String) -> Result<(), String> {
    let num = |v: &str| {
        v.trim()
            .parse::<u32>()
            .map_err(|_| format!("{flag}: '{v}' is not a whole number"))
    };
    match flag {
        "--model" => a.model = Some(val),
        "--ctx" => {
            let ctx: Vec<u32> = val.split(',').map(num).collect::<Result<_, _>>()?;
            if ctx.contains(&0) {
                return Err("--ctx: a context must hold at least 1 token".into());
            }
            a.ctx = Some(ctx);
        }
        "--codecs" => a.codecs = split_codecs(&val),
        "--steps" => a.steps = Some(num(&val)? as usize),
        "--warmup" => a.warmup = num(&val)? as usize,
        "--rounds" => {
            a.rounds = num(&val)? as usize;
            if a.rounds == 0 {
                return Err("--rounds must be at least 1".into());
            }
        }
        "--busy" => a.busy_ms = Some(num(&val)?),
        "--splits" => a.splits = Some(num(&val)?),
        "--prefill-from" => a.prefill_from = Some(num(&val)?.max(1)),
        "--chunk-splits" => {
            a.chunk_splits = Some(num(&val)?);
            if a.chunk_splits == Some(0) {
                return Err("--chunk-splits must be at least 1".into());
            }
        }
        "--precision" => a.precision = val.parse().map_err(|e| format!("--precision: {e}"))?,
        "--batch" => {
            a.batch = num(&val)?;
            if a.batch == 0 {
                return Err("--batch must be at least 1".into());
            }
        }
        "--queries" => {
            a.queries = val.split(',').map(num).collect::<Result<_, _>>()?;
            if a.queries.contains(&0) {
                return Err("--queries must be at least 1".into());
            }
        }
        "--wg" => a.wg = Some(num(&val)?),
        "--exact" => a.exact = val.parse().map_err(|e| format!("--exact: {e}"))?,
        "--wait" => {
            a.wait = match val.as_str() {
                "spin" => Some(Wait::Spin),
                "block" => Some(Wait::Block),
                _ => return Err(format!("--wait: '{val}' is not spin or block")),
            }
        }
        "--csv" => a.csv = val,
        "--plot" => a.plot = Some(val),
        "--replot" => a.replot = Some(val),
        "--mem-budget" => {
            let gib: f64 = val
                .trim()
                .parse()
                .map_err(|_| format!("--mem-budget: '{val}' is not a number of GiB"))?;
            a.mem_budget = Some(gib);
        }
        "--matrix" => {
            if val == "list" {
                for v in crate::matrix_wgsl::variants() {
                    println!("{}", v.name());
                }
                std::process::exit(0);
            }
            a.matrix = Selection::parse(&val)?;
        }
        "--matrix-dump" => a.matrix_dump = Some(val),
        _ => return Err(format!("{flag} is in VALUED but has no arm here")),
    }
    Ok(())
}
