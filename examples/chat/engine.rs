//! The forward on the GPU: every kernel of a decode step (or of a prompt) recorded into one
//! compute pass of one command encoder, kvq's attention among them, and only the sampled token
//! ids read back.
//!
//! A decode step, per layer: the fused Q/K/V product (RMSNorm inside), RoPE (and the K/V to
//! f16), kvq's fused append + attention (2 dispatches), the output product with the residual
//! add, the fused gate/up product (RMSNorm inside, SwiGLU on the way out), the down product
//! with the residual add: 7 dispatches; then the logits (final RMSNorm inside) and the
//! sampler. A prompt is one chunk: the same with matrix-matrix products, a separate RMSNorm
//! kernel before the two normed products, and kvq's chunk attention; the logits of each
//! sequence's last token only. Positions are kvq's lengths, read on the GPU
//! (`KvCache::lengths_binding`).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use kvq::{CacheSpec, ChunkIo, ExactTokens, GpuContext, InputType, KvCache, KvCodecs, StepIo};

use crate::error::{ChatError, Result};
use crate::kernels::{Const, Kernel, Kernels, Kind};
use crate::llama::{Layer, Matrix, Rope, Weights};

/// How a sequence's next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0: greedy; else the softmax temperature.
    pub temperature: f32,
    /// Nucleus sampling's kept mass (1: all tokens).
    pub top_p: f32,
    /// The random stream's seed.
    pub seed: u32,
}

impl Sampling {
    /// Greedy decoding.
    pub const GREEDY: Sampling = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    };
}

/// What the engine is built for.
#[derive(Clone, Debug)]
pub struct Options {
    /// Sequences decoded together.
    pub batch: u32,
    /// Tokens per sequence the cache holds.
    pub capacity: u32,
    /// Most new tokens per sequence one prompt chunk takes (a longer prompt is several).
    pub prompt_max: u32,
    /// The cache's codecs.
    pub codecs: KvCodecs,
    /// Exact tokens (`CacheSpec::with_exact`).
    pub exact: ExactTokens,
    /// Per [`Product`] (by [`Product::index`]): the matrix-vector kernel's lanes per row and
    /// rows per lane group; None: [`default_tune`].
    pub tune: [Option<(u32, u32)>; 5],
    /// Also build [`Engine::score`]: every position's logits of a prompt.
    pub score: bool,
    /// Chunk slices of at least this many tokens take kvq's prefill kernel
    /// (`CacheSpec::prefill_from`; None: the adapter's tuning).
    pub prefill_from: Option<u32>,
    /// The cache's products (`CacheSpec::precision`).
    pub precision: kvq::Precision,
}

impl Options {
    /// One sequence of `capacity` tokens with `codecs`, prompts of up to `capacity` tokens.
    pub fn new(capacity: u32, codecs: KvCodecs) -> Options {
        Options {
            batch: 1,
            capacity,
            prompt_max: capacity,
            codecs,
            exact: ExactTokens::NONE,
            tune: [None; 5],
            score: false,
            prefill_from: None,
            precision: kvq::Precision::Auto,
        }
    }
}

/// The parameters every kernel of a recording reads (`kernels/params.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    tokens: u32,
    per_seq: u32,
    ids_base: u32,
    _pad0: u32,
    temperature: f32,
    top_p: f32,
    seed: u32,
    _pad1: u32,
}

/// A kernel's grid, for a recording of `tokens` rows.
#[derive(Clone, Copy)]
enum Grid {
    Fixed([u32; 3]),
    /// `(x, ceil(tokens / tile), 1)`.
    Tokens {
        x: u32,
        tile: u32,
    },
    /// `(ceil(tokens / tile), 1, 1)`.
    Rows {
        tile: u32,
    },
}

impl Grid {
    fn resolve(self, tokens: u32) -> [u32; 3] {
        match self {
            Grid::Fixed(g) => g,
            Grid::Tokens { x, tile } => [x, tokens.div_ceil(tile), 1],
            Grid::Rows { tile } => [tokens.div_ceil(tile), 1, 1],
        }
    }
}

enum Op {
    Kernel {
        kernel: Arc<Kernel>,
        bind: wgpu::BindGroup,
        grid: Grid,
    },
    /// kvq's attention of a layer: the fused step, or the prompt's chunk.
    Attention(u32),
}

/// The activations, in buffers sized for a prompt chunk of the whole batch.
struct Buffers {
    h: wgpu::Buffer,
    qkv: wgpu::Buffer,
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    attn: wgpu::Buffer,
    act: wgpu::Buffer,
    inv: wgpu::Buffer,
    logits: wgpu::Buffer,
    /// `[batch]` current tokens, `[batch]` draw counters (positions are kvq's lengths).
    state: wgpu::Buffer,
    /// Per layer: its index, for the RoPE kernel's read of that layer's lengths.
    layer_index: Vec<wgpu::Buffer>,
    /// A prompt's token ids.
    ids: wgpu::Buffer,
    decode_params: wgpu::Buffer,
    prompt_params: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Bound where a kernel's variant reads nothing.
    dummy: wgpu::Buffer,
    /// [`Engine::score`]'s logits of every row of a chunk, and their readback.
    all_logits: Option<(wgpu::Buffer, wgpu::Buffer)>,
}

impl Buffers {
    fn bytes(&self) -> u64 {
        [
            &self.h,
            &self.qkv,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.act,
            &self.inv,
            &self.logits,
            &self.state,
            &self.ids,
        ]
        .iter()
        .map(|b| b.size())
        .sum()
    }
}

/// The matrix products of the forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Product {
    /// The fused Q/K/V product (RMSNorm inside).
    Qkv,
    /// The attention output product (residual add).
    O,
    /// The fused gate/up product (RMSNorm inside, SwiGLU out).
    GateUp,
    /// The down product (residual add).
    Down,
    /// The logits (final RMSNorm inside).
    Output,
}

impl Product {
    /// Every product, in [`Product::index`] order.
    pub const ALL: [Product; 5] = [
        Product::Qkv,
        Product::O,
        Product::GateUp,
        Product::Down,
        Product::Output,
    ];

    /// Its index in [`Options::tune`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        ["qkv", "o", "gate_up", "down", "logits"][self.index()]
    }
}

/// Dispatches of one recording.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dispatches {
    /// The example's own kernels.
    pub own: u64,
    /// kvq's.
    pub kvq: u64,
}

/// A Llama-architecture model on the GPU with kvq as its KV cache.
pub struct Engine {
    /// The device.
    pub ctx: GpuContext,
    /// The weights (shared by engines built over them).
    pub weights: Arc<Weights>,
    /// The KV cache.
    pub cache: KvCache,
    /// What it was built for.
    pub opts: Options,
    kernels: Arc<Kernels>,
    bufs: Buffers,
    decode: Vec<Op>,
    prompt: Vec<Op>,
    score: Vec<Op>,
    step_io: StepIo,
    /// The last prompt chunk's bindings, kept while the next chunk has as many tokens (a
    /// `ChunkIo` is bound to one length).
    chunk: Option<ChunkIo>,
    sampling: Sampling,
    /// The last recording's dispatches.
    pub last_dispatches: Dispatches,
}

fn buffer(ctx: &GpuContext, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes.max(16).div_ceil(4) * 4,
        usage,
        mapped_at_creation: false,
    })
}

/// The matrix-vector kernel's lanes per row and rows per lane group for rows of `k` values:
/// about 4 blocks per lane (4 to 64 lanes), 4 rows per lane group (each block of x read once
/// for 4 rows).
pub fn default_tune(k: u32) -> (u32, u32) {
    let per = (k / 32 / 4).max(1);
    ((1u32 << (31 - per.leading_zeros())).clamp(4, 64), 4)
}

impl Engine {
    /// Builds the engine: the cache, the activations and every kernel and bind group of the
    /// decode step and of a prompt (nothing is compiled or allocated after this).
    pub fn new(ctx: &GpuContext, weights: Arc<Weights>, opts: Options) -> Result<Engine> {
        Self::with_kernels(ctx, weights, opts, Arc::new(Kernels::new(&ctx.device)))
    }

    /// [`Engine::new`] with the pipelines of `kernels` (built once for several engines).
    pub fn with_kernels(
        ctx: &GpuContext,
        weights: Arc<Weights>,
        opts: Options,
        kernels: Arc<Kernels>,
    ) -> Result<Engine> {
        let cfg = weights.cfg.clone();
        cfg.check()?;
        if opts.batch == 0 || opts.capacity == 0 || opts.prompt_max == 0 {
            return Err(ChatError::Argument(
                "batch, capacity and prompt length must be positive".into(),
            ));
        }
        let mut spec = CacheSpec::new(
            cfg.layers,
            cfg.q_heads,
            cfg.kv_heads,
            cfg.head_dim,
            opts.capacity,
        )
        .with_codecs(opts.codecs)
        .with_batch(opts.batch);
        spec.exact = opts.exact;
        spec.prefill_from = opts.prefill_from;
        spec.precision = opts.precision;
        let cache = KvCache::new(ctx, spec)?;
        let prompt_max = opts.prompt_max.min(opts.capacity);
        let rows = opts.batch as u64 * prompt_max as u64;
        let limits = ctx.device.limits();
        if rows > limits.max_compute_workgroups_per_dimension as u64 {
            return Err(ChatError::Argument(format!(
                "a prompt chunk of {rows} rows (batch x prompt length) passes the adapter's \
                 {} workgroups per dimension",
                limits.max_compute_workgroups_per_dimension
            )));
        }
        use wgpu::BufferUsages as U;
        let st = U::STORAGE | U::COPY_SRC | U::COPY_DST;
        let (hd, hq, hk) = (cfg.head_dim as u64, cfg.q_heads as u64, cfg.kv_heads as u64);
        let b = opts.batch as u64;
        let bufs = Buffers {
            h: buffer(ctx, "h", rows * cfg.dim as u64 * 4, st),
            qkv: buffer(ctx, "qkv", rows * cfg.qkv_rows() as u64 * 4, st),
            q: buffer(ctx, "q", rows * hq * hd * 4, st),
            k: buffer(ctx, "k", rows * hk * hd * 2, st),
            v: buffer(ctx, "v", rows * hk * hd * 2, st),
            attn: buffer(ctx, "attn", rows * hq * hd * 4, st),
            act: buffer(ctx, "act", rows * cfg.ffn as u64 * 4, st),
            inv: buffer(ctx, "inv rms", rows * 4, st),
            logits: buffer(ctx, "logits", b * cfg.vocab as u64 * 4, st),
            state: buffer(ctx, "state", b * 2 * 4, st),
            layer_index: (0..cfg.layers)
                .map(|l| {
                    let u = buffer(ctx, "layer", 16, U::UNIFORM | U::COPY_DST);
                    ctx.queue
                        .write_buffer(&u, 0, bytemuck::cast_slice(&[l, 0, 0, 0]));
                    u
                })
                .collect(),
            ids: buffer(ctx, "ids", rows * 4, st),
            decode_params: buffer(ctx, "decode params", 32, U::UNIFORM | U::COPY_DST),
            prompt_params: buffer(ctx, "prompt params", 32, U::UNIFORM | U::COPY_DST),
            readback: buffer(ctx, "readback", b * 4, U::MAP_READ | U::COPY_DST),
            dummy: buffer(ctx, "dummy", 16, U::STORAGE),
            all_logits: opts.score.then(|| {
                let bytes = rows * cfg.vocab as u64 * 4;
                (
                    buffer(ctx, "all logits", bytes, st),
                    buffer(ctx, "all logits readback", bytes, U::MAP_READ | U::COPY_DST),
                )
            }),
        };
        let step_io = cache.step_io(&bufs.k, &bufs.v, 1, InputType::F16, &bufs.q, &bufs.attn)?;
        let mut e = Engine {
            ctx: ctx.clone(),
            kernels,
            weights,
            cache,
            opts: Options { prompt_max, ..opts },
            bufs,
            decode: Vec::new(),
            prompt: Vec::new(),
            score: Vec::new(),
            step_io,
            chunk: None,
            sampling: Sampling::GREEDY,
            last_dispatches: Dispatches::default(),
        };
        e.decode = e.build(false)?;
        e.prompt = e.build(true)?;
        if e.opts.score {
            e.score = e.build(true)?;
            let (all, _) = e.bufs.all_logits.as_ref().expect("allocated with score");
            let layer = &e.weights.layers[0];
            let p = &e.bufs.prompt_params;
            e.score.push(e.rms_op(p)?);
            e.score
                .push(e.product_into(true, Product::Output, layer, p, Some(all))?);
        }
        e.set_sampling(Sampling::GREEDY);
        Ok(e)
    }

    fn write_params(&self, buf: &wgpu::Buffer, per_seq: u32, ids_base: u32) {
        let s = self.sampling;
        let p = Params {
            tokens: self.opts.batch * per_seq,
            per_seq,
            ids_base,
            _pad0: 0,
            temperature: s.temperature,
            top_p: s.top_p,
            seed: s.seed,
            _pad1: 0,
        };
        self.ctx.queue.write_buffer(buf, 0, bytemuck::bytes_of(&p));
    }

    /// Sets how the next tokens are chosen.
    pub fn set_sampling(&mut self, s: Sampling) {
        self.sampling = s;
        self.write_params(&self.bufs.decode_params, 1, 0);
    }

    /// The operands of `which` in `layer` (the output product: the model's): the matrix, its
    /// input, the RMSNorm gain applied to the input (if any), the epilogue (0 store, 1 add,
    /// 2 SwiGLU) and the output.
    fn operands<'a>(
        &'a self,
        which: Product,
        layer: &'a Layer,
    ) -> (
        &'a Matrix,
        &'a wgpu::Buffer,
        Option<&'a wgpu::Buffer>,
        u32,
        &'a wgpu::Buffer,
    ) {
        let (b, w) = (&self.bufs, &self.weights);
        match which {
            Product::Qkv => (&layer.qkv, &b.h, Some(&layer.attn_norm), 0, &b.qkv),
            Product::O => (&layer.o, &b.attn, None, 1, &b.h),
            Product::GateUp => (&layer.gate_up, &b.h, Some(&layer.ffn_norm), 2, &b.act),
            Product::Down => (&layer.down, &b.act, None, 1, &b.h),
            Product::Output => (w.output(), &b.h, Some(&w.out_norm), 0, &b.logits),
        }
    }

    /// The product `which` of `layer`, as a matrix-vector kernel for the batch (decode) or a
    /// matrix-matrix kernel for a prompt's rows, reading `params`.
    fn product(
        &self,
        prompt: bool,
        which: Product,
        layer: &Layer,
        params: &wgpu::Buffer,
    ) -> Result<Op> {
        self.product_into(prompt, which, layer, params, None)
    }

    /// [`Engine::product`] writing to `out` instead of its own output where given.
    fn product_into(
        &self,
        prompt: bool,
        which: Product,
        layer: &Layer,
        params: &wgpu::Buffer,
        out: Option<&wgpu::Buffer>,
    ) -> Result<Op> {
        let (m, x, norm, epi, y) = self.operands(which, layer);
        let y = out.unwrap_or(y);
        let eps = self.weights.cfg.eps as f32;
        let mut consts = vec![
            ("K", Const::U(m.cols)),
            ("N", Const::U(m.rows)),
            ("FORMAT", Const::U(m.format.id())),
            ("NORM", Const::B(norm.is_some())),
            ("EPI", Const::U(epi)),
            ("EPS", Const::F(eps)),
        ];
        let gain = norm.unwrap_or(&self.bufs.dummy);
        if prompt {
            let k = self.kernels.get(Kind::Matmul, &consts)?;
            let inv = if norm.is_some() {
                &self.bufs.inv
            } else {
                &self.bufs.dummy
            };
            let bind = self
                .kernels
                .bind(&k, &[x, gain, &m.codes, &m.scales, y, params, inv]);
            return Ok(Op::Kernel {
                kernel: k,
                bind,
                grid: Grid::Tokens {
                    x: m.rows.div_ceil(64),
                    tile: 64,
                },
            });
        }
        let (tpr, r) = self.opts.tune[which.index()].unwrap_or_else(|| default_tune(m.cols));
        let rows = 256 / tpr * r;
        consts.extend([
            ("M", Const::U(self.opts.batch)),
            ("TPR", Const::U(tpr)),
            ("R", Const::U(r)),
            ("WG", Const::U(256)),
        ]);
        let k = self.kernels.get(Kind::Matvec, &consts)?;
        let bind = self
            .kernels
            .bind(&k, &[x, gain, &m.codes, &m.scales, y, params]);
        Ok(Op::Kernel {
            kernel: k,
            bind,
            grid: Grid::Fixed([m.rows.div_ceil(rows), 1, 1]),
        })
    }

    /// The prompt's RMSNorm kernel: 1/rms of every row of the residual stream.
    fn rms_op(&self, params: &wgpu::Buffer) -> Result<Op> {
        let c = &self.weights.cfg;
        let rms = self.kernels.get(
            Kind::Rms,
            &[("K", Const::U(c.dim)), ("EPS", Const::F(c.eps as f32))],
        )?;
        Ok(Op::Kernel {
            bind: self
                .kernels
                .bind(&rms, &[&self.bufs.h, &self.bufs.inv, params]),
            kernel: rms,
            grid: Grid::Rows { tile: 1 },
        })
    }

    /// The ops of a decode step (`prompt` false) or of a prompt chunk.
    fn build(&self, prompt: bool) -> Result<Vec<Op>> {
        let c = &self.weights.cfg;
        let b = &self.bufs;
        let params = if prompt {
            &b.prompt_params
        } else {
            &b.decode_params
        };
        let eps = Const::F(c.eps as f32);
        let mut ops = Vec::new();
        let embed = &self.weights.embed;
        let k = self.kernels.get(
            Kind::Embed,
            &[
                ("K", Const::U(c.dim)),
                ("N", Const::U(c.vocab)),
                ("FORMAT", Const::U(embed.format.id())),
            ],
        )?;
        let ids = if prompt { &b.ids } else { &b.state };
        ops.push(Op::Kernel {
            bind: self
                .kernels
                .bind(&k, &[ids, &b.h, &embed.codes, &embed.scales, params]),
            kernel: k,
            grid: Grid::Rows { tile: 1 },
        });
        let rope = self.kernels.get(
            Kind::Rope,
            &[
                ("D", Const::U(c.head_dim)),
                ("HQ", Const::U(c.q_heads)),
                ("HK", Const::U(c.kv_heads)),
                ("ROPE", Const::U((c.rope == Rope::Neox) as u32)),
                ("QK_NORM", Const::B(c.qk_norm)),
                ("B", Const::U(self.opts.batch)),
                ("EPS", eps),
            ],
        )?;
        for (l, layer) in self.weights.layers.iter().enumerate() {
            if prompt {
                ops.push(self.rms_op(params)?);
            }
            ops.push(self.product(prompt, Product::Qkv, layer, params)?);
            let res = vec![
                b.qkv.as_entire_binding(),
                b.q.as_entire_binding(),
                b.k.as_entire_binding(),
                b.v.as_entire_binding(),
                wgpu::BindingResource::Buffer(self.cache.lengths_binding()),
                layer.rope_consts.as_entire_binding(),
                params.as_entire_binding(),
                b.layer_index[l].as_entire_binding(),
            ];
            ops.push(Op::Kernel {
                kernel: rope.clone(),
                bind: self.kernels.bind_resources(&rope, res),
                grid: Grid::Tokens {
                    x: c.q_heads + 2 * c.kv_heads,
                    tile: 1,
                },
            });
            ops.push(Op::Attention(l as u32));
            ops.push(self.product(prompt, Product::O, layer, params)?);
            if prompt {
                ops.push(self.rms_op(params)?);
            }
            ops.push(self.product(prompt, Product::GateUp, layer, params)?);
            ops.push(self.product(prompt, Product::Down, layer, params)?);
        }
        // The logits of each sequence's last row, then the sampler.
        let last = &self.weights.layers[0];
        ops.push(self.product(false, Product::Output, last, params)?);
        let k = self.kernels.get(
            Kind::Sample,
            &[("V", Const::U(c.vocab)), ("B", Const::U(self.opts.batch))],
        )?;
        ops.push(Op::Kernel {
            bind: self.kernels.bind(&k, &[&b.logits, &b.state, params]),
            kernel: k,
            grid: Grid::Fixed([self.opts.batch, 1, 1]),
        });
        Ok(ops)
    }

    /// Records `ops` into `pass`, kvq's attention by `io` (a chunk) or the fused step.
    fn record(
        cache: &mut KvCache,
        pass: &mut wgpu::ComputePass<'_>,
        ops: &[Op],
        tokens: u32,
        step: &StepIo,
        chunk: Option<&ChunkIo>,
    ) -> Result<u64> {
        let mut own = 0;
        for op in ops {
            match op {
                Op::Kernel { kernel, bind, grid } => {
                    let [x, y, z] = grid.resolve(tokens);
                    pass.set_pipeline(&kernel.pipeline);
                    pass.set_bind_group(0, bind, &[]);
                    pass.dispatch_workgroups(x, y, z);
                    own += 1;
                }
                Op::Attention(l) => match chunk {
                    Some(io) => cache.chunk_in_pass(pass, *l, io)?,
                    None => cache.step_in_pass(pass, *l, step)?,
                },
            }
        }
        Ok(own)
    }

    /// Tokens held by sequence 0 (every sequence holds as many).
    pub fn len(&self) -> u32 {
        self.cache.len(0, 0).unwrap_or(0)
    }

    /// Records the ops (a decode step; `chunk_n`: a prompt chunk of that many tokens, with
    /// every row's logits where `score`), submits them with the sampled tokens' copy, reads
    /// those back.
    fn run(&mut self, chunk_n: Option<u32>, score: bool) -> Result<Vec<u32>> {
        let batch = self.opts.batch;
        let before = self.ctx.stats().dispatches;
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        let recorded = {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("chat forward"),
                timestamp_writes: None,
            });
            let (ops, tokens, chunk) = match chunk_n {
                Some(n) if score => (&self.score, batch * n, self.chunk.as_ref()),
                Some(n) => (&self.prompt, batch * n, self.chunk.as_ref()),
                None => (&self.decode, batch, None),
            };
            Self::record(
                &mut self.cache,
                &mut pass,
                ops,
                tokens,
                &self.step_io,
                chunk,
            )
        };
        let own = match recorded {
            Ok(n) => n,
            Err(e) => {
                // The recording is dropped: the cache's host lengths must follow the GPU's.
                drop(enc);
                self.cache.sync_lengths()?;
                return Err(e);
            }
        };
        self.last_dispatches = Dispatches {
            own,
            kvq: self.ctx.stats().dispatches - before,
        };
        let bytes = batch as u64 * 4;
        enc.copy_buffer_to_buffer(&self.bufs.state, 0, &self.bufs.readback, 0, bytes);
        self.ctx.queue.submit([enc.finish()]);
        read_u32(&self.ctx, &self.bufs.readback, bytes)
    }

    /// Runs a prompt: `ids[b]` are sequence b's new tokens (every sequence the same count),
    /// appended after what the cache holds, in chunks of at most `prompt_max` tokens (one
    /// recording each; one in all for a prompt that fits). Returns each sequence's next token.
    pub fn prompt(&mut self, ids: &[Vec<u32>]) -> Result<Vec<u32>> {
        let batch = self.opts.batch as usize;
        let n = ids.first().map_or(0, |s| s.len());
        if ids.len() != batch || ids.iter().any(|s| s.len() != n) || n == 0 {
            return Err(ChatError::Argument(format!(
                "a prompt needs {batch} sequences of the same positive length"
            )));
        }
        let len = self.len();
        let cap = self.opts.capacity;
        if len as u64 + n as u64 > cap as u64 {
            return Err(ChatError::PromptTooLong {
                tokens: n as u32,
                len,
                capacity: cap,
            });
        }
        let mut next = Vec::new();
        let step = self.opts.prompt_max as usize;
        for start in (0..n).step_by(step) {
            let m = (n - start).min(step);
            let flat: Vec<u32> = ids
                .iter()
                .flat_map(|s| &s[start..start + m])
                .copied()
                .collect();
            self.ctx
                .queue
                .write_buffer(&self.bufs.ids, 0, bytemuck::cast_slice(&flat));
            self.write_params(&self.bufs.prompt_params, m as u32, 0);
            let m = m as u32;
            self.keep_chunk_io(m)?;
            next = self.run(Some(m), false)?;
        }
        Ok(next)
    }

    /// Keeps one chunk io, for `m` tokens: the last length's, reused while chunks keep it, built
    /// again (the old one dropped first) when the length changes.
    fn keep_chunk_io(&mut self, m: u32) -> Result<()> {
        if self.chunk.as_ref().is_none_or(|c| c.tokens() != m) {
            let b = &self.bufs;
            self.chunk = None;
            let io = self
                .cache
                .chunk_io(&b.k, &b.v, m, InputType::F16, &b.q, &b.attn)?;
            self.chunk = Some(io);
        }
        Ok(())
    }

    /// Every position's logits of `ids` (batch 1, appended after what the cache holds, in
    /// chunks of at most `prompt_max` tokens): `[ids.len(), vocab]`. Needs `Options::score`.
    pub fn score(&mut self, ids: &[u32], progress: &mut dyn FnMut(usize)) -> Result<Vec<f32>> {
        let Some((_, staging)) = self.bufs.all_logits.clone() else {
            return Err(ChatError::Argument(
                "the engine was built without score".into(),
            ));
        };
        if self.opts.batch != 1 || ids.is_empty() {
            return Err(ChatError::Argument(
                "score takes one non-empty sequence".into(),
            ));
        }
        let (len, cap) = (self.len(), self.opts.capacity);
        if len as u64 + ids.len() as u64 > cap as u64 {
            return Err(ChatError::PromptTooLong {
                tokens: ids.len() as u32,
                len,
                capacity: cap,
            });
        }
        let vocab = self.weights.cfg.vocab as u64;
        let mut out = Vec::with_capacity(ids.len() * vocab as usize);
        for chunk in ids.chunks(self.opts.prompt_max as usize) {
            let m = chunk.len() as u32;
            self.ctx
                .queue
                .write_buffer(&self.bufs.ids, 0, bytemuck::cast_slice(chunk));
            self.write_params(&self.bufs.prompt_params, m, 0);
            self.keep_chunk_io(m)?;
            self.run(Some(m), true)?;
            let bytes = m as u64 * vocab * 4;
            let (all, _) = self.bufs.all_logits.as_ref().expect("checked above");
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(all, 0, &staging, 0, bytes);
            self.ctx.queue.submit([enc.finish()]);
            out.extend_from_slice(bytemuck::cast_slice(&read_bytes(
                &self.ctx, &staging, bytes,
            )?));
            progress(out.len() / vocab as usize);
        }
        Ok(out)
    }

    /// One decode step of every sequence: the tokens sampled last go in, the next come out.
    pub fn step(&mut self) -> Result<Vec<u32>> {
        if self.len() >= self.opts.capacity {
            return Err(ChatError::CacheFull {
                capacity: self.opts.capacity,
            });
        }
        self.run(None, false)
    }

    /// Records one decode step into `enc` without reading anything back (for timing many
    /// steps in one submit); returns its dispatches.
    pub fn record_step(&mut self, enc: &mut wgpu::CommandEncoder) -> Result<Dispatches> {
        if self.len() >= self.opts.capacity {
            return Err(ChatError::CacheFull {
                capacity: self.opts.capacity,
            });
        }
        let before = self.ctx.stats().dispatches;
        let own = {
            let mut pass = enc.begin_compute_pass(&Default::default());
            Self::record(
                &mut self.cache,
                &mut pass,
                &self.decode,
                self.opts.batch,
                &self.step_io,
                None,
            )?
        };
        Ok(Dispatches {
            own,
            kvq: self.ctx.stats().dispatches - before,
        })
    }

    /// Empties every sequence: the cache and the positions.
    pub fn reset(&mut self) -> Result<()> {
        for s in 0..self.opts.batch {
            self.cache.reset(s)?;
        }
        let zeros = vec![0u32; 2 * self.opts.batch as usize];
        self.ctx
            .queue
            .write_buffer(&self.bufs.state, 0, bytemuck::cast_slice(&zeros));
        Ok(())
    }

    /// Empties every sequence and appends `len` tokens of random K/V to each without running
    /// the model (positions follow, being the cache's lengths): for timing a decode step at a
    /// context without computing the prompt.
    pub fn fill_random(&mut self, len: u32) -> Result<()> {
        self.reset()?;
        let c = &self.weights.cfg;
        let chunk = len.clamp(1, 4096);
        let b = self.opts.batch as u64;
        let words = b * chunk as u64 * c.kv_heads as u64 * c.head_dim as u64 / 2;
        let data: Vec<u32> = (0..words as u32)
            .map(|i| {
                let h = i.wrapping_mul(2654435761) ^ 0x5bd1e995;
                let a = half::f16::from_f32(((h >> 8) & 0xffff) as f32 / 65536.0 - 0.5).to_bits();
                let z = half::f16::from_f32(((h >> 16) & 0xff) as f32 / 256.0 - 0.5).to_bits();
                a as u32 | (z as u32) << 16
            })
            .collect();
        use wgpu::BufferUsages as U;
        let kb = buffer(&self.ctx, "fill k", words * 4, U::STORAGE | U::COPY_DST);
        let vb = buffer(&self.ctx, "fill v", words * 4, U::STORAGE | U::COPY_DST);
        self.ctx
            .queue
            .write_buffer(&kb, 0, bytemuck::cast_slice(&data));
        self.ctx
            .queue
            .write_buffer(&vb, 0, bytemuck::cast_slice(&data));
        let mut filled = 0;
        while filled < len {
            let n = chunk.min(len - filled);
            let input = self.cache.append_input(&kb, &vb, n, InputType::F16)?;
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for l in 0..c.layers {
                    self.cache.append_in_pass(&mut pass, l, &input)?;
                }
            }
            self.ctx.queue.submit([enc.finish()]);
            filled += n;
        }
        let mut state = vec![1u32; self.opts.batch as usize];
        state.extend(vec![0u32; self.opts.batch as usize]);
        self.ctx
            .queue
            .write_buffer(&self.bufs.state, 0, bytemuck::cast_slice(&state));
        self.wait()
    }

    /// Waits for the GPU to finish what was submitted.
    pub fn wait(&self) -> Result<()> {
        self.ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| ChatError::Gpu(e.to_string()))
    }

    /// The logits the last recording computed, `[batch, vocab]` (blocking; for tests).
    pub fn read_logits(&self) -> Result<Vec<f32>> {
        let bytes = self.bufs.logits.size();
        let staging = buffer(
            &self.ctx,
            "logits readback",
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&self.bufs.logits, 0, &staging, 0, bytes);
        self.ctx.queue.submit([enc.finish()]);
        Ok(bytemuck::cast_slice(&read_bytes(&self.ctx, &staging, bytes)?).to_vec())
    }

    /// Times one kind of product alone, as the decode step records it but with `tune` (lanes
    /// per row, rows per lane group; None: [`default_tune`]), over every layer (the output
    /// matrix: once), `reps` passes in one submit; returns the bytes of weights one pass reads
    /// and the seconds a pass took.
    pub fn time_products(
        &mut self,
        which: Product,
        tune: Option<(u32, u32)>,
        reps: u32,
    ) -> Result<(u64, f64)> {
        let keep = self.opts.tune[which.index()];
        self.opts.tune[which.index()] = tune;
        let r = self.time_products_now(which, reps);
        self.opts.tune[which.index()] = keep;
        r
    }

    fn time_products_now(&self, which: Product, reps: u32) -> Result<(u64, f64)> {
        let p = &self.bufs.decode_params;
        let layers: &[Layer] = match which {
            Product::Output => &self.weights.layers[..1],
            _ => &self.weights.layers,
        };
        let mut ops = Vec::new();
        let mut bytes = 0;
        for layer in layers {
            bytes += self.operands(which, layer).0.bytes();
            ops.push(self.product(false, which, layer, p)?);
        }
        let run = |reps: u32| -> Result<f64> {
            let t = std::time::Instant::now();
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            for _ in 0..reps {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for op in &ops {
                    if let Op::Kernel { kernel, bind, grid } = op {
                        let [x, y, z] = grid.resolve(self.opts.batch);
                        pass.set_pipeline(&kernel.pipeline);
                        pass.set_bind_group(0, bind, &[]);
                        pass.dispatch_workgroups(x, y, z);
                    }
                }
            }
            self.ctx.queue.submit([enc.finish()]);
            self.wait()?;
            Ok(t.elapsed().as_secs_f64())
        };
        run(2)?;
        Ok((bytes, run(reps)? / reps as f64))
    }

    /// Columns of the matrix of product `which`.
    pub fn operands_cols(&self, which: Product) -> u32 {
        self.operands(which, &self.weights.layers[0]).0.cols
    }

    /// Bytes of the activations and the engine's state on the device.
    pub fn activation_bytes(&self) -> u64 {
        self.bufs.bytes()
    }

    /// Pipelines the engine built.
    pub fn pipelines(&self) -> usize {
        self.kernels.count()
    }

    /// The engine's pipelines (to share with another engine: [`Engine::with_kernels`]).
    pub fn kernels(&self) -> Arc<Kernels> {
        self.kernels.clone()
    }
}

fn read_bytes(ctx: &GpuContext, buf: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
    let slice = buf.slice(..bytes);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| ChatError::Gpu(e.to_string()))?;
    rx.recv()
        .map_err(|e| ChatError::Gpu(e.to_string()))?
        .map_err(|e| ChatError::Gpu(e.to_string()))?;
    let out = slice
        .get_mapped_range()
        .map_err(|e| ChatError::Gpu(e.to_string()))?
        .to_vec();
    buf.unmap();
    Ok(out)
}

fn read_u32(ctx: &GpuContext, buf: &wgpu::Buffer, bytes: u64) -> Result<Vec<u32>> {
    Ok(bytemuck::cast_slice(&read_bytes(ctx, buf, bytes)?).to_vec())
}
