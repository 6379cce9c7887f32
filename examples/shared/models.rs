//! Model presets shared by the examples (`#[path]`-included; not an example of its own).

#![allow(dead_code)] // (Each example uses its own part.)

/// The KV-cache shape of a model, and the attention options it needs.
pub struct Model {
    pub name: &'static str,
    pub layers: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    /// K's head size (and V's, unless `v_head_dim`).
    pub head_dim: u32,
    /// V's head size where it differs from K's (multi-head latent attention).
    pub v_head_dim: Option<u32>,
    /// Logit softcap (`CacheSpec::with_softcap`).
    pub softcap: Option<f32>,
    /// Learned sink logits, one per query head of each layer (`CacheSpec::with_sink_logits`):
    /// the presets give them fixed pseudo-random values (speed does not depend on them).
    pub sinks: bool,
    /// Local layers with a window of their own (`CacheSpec::with_layer_windows`), None: every
    /// layer global.
    pub local: Option<Local>,
}

/// A repeating layer pattern: `local` layers with a sliding window of `window` tokens, then
/// `global` layers over the whole context.
pub struct Local {
    pub window: u32,
    pub local: u32,
    pub global: u32,
}

/// A dense model with plain attention: every option off.
const DENSE: Model = Model {
    name: "",
    layers: 32,
    q_heads: 32,
    kv_heads: 8,
    head_dim: 128,
    v_head_dim: None,
    softcap: None,
    sinks: false,
    local: None,
};

/// `llama3-8b`, `qwen3-8b` (the Bonsai-8B shape), `qwen2.5-7b` (4 KV heads, GQA 7),
/// `llama3-70b` (80 layers, 8 KV heads, GQA 8) and `tiny`; today's other attention:
/// `gpt-oss-20b` (head 64, GQA 8, sink logits, every other layer a 128-token window),
/// `gemma3-12b` (head 256, five local layers of 1,024 tokens to one global), `gemma2-9b`
/// (softcap 50, every other layer a 4,096-token window), `phi-2` (head 80, one KV head per
/// query head), `qwen3-235b` (GQA 16) and `deepseek-v3` (multi-head latent attention: 128
/// heads over one latent KV head, K 576 / V 512 wide).
pub const MODELS: &[Model] = &[
    Model {
        name: "llama3-8b",
        ..DENSE
    },
    Model {
        name: "qwen3-8b",
        layers: 36,
        ..DENSE
    },
    Model {
        name: "qwen2.5-7b",
        layers: 28,
        q_heads: 28,
        kv_heads: 4,
        ..DENSE
    },
    Model {
        name: "llama3-70b",
        layers: 80,
        q_heads: 64,
        ..DENSE
    },
    Model {
        name: "tiny",
        layers: 4,
        q_heads: 8,
        kv_heads: 2,
        head_dim: 64,
        ..DENSE
    },
    Model {
        name: "gpt-oss-20b",
        layers: 24,
        q_heads: 64,
        head_dim: 64,
        sinks: true,
        local: Some(Local {
            window: 128,
            local: 1,
            global: 1,
        }),
        ..DENSE
    },
    Model {
        name: "gemma3-12b",
        layers: 48,
        q_heads: 16,
        head_dim: 256,
        local: Some(Local {
            window: 1024,
            local: 5,
            global: 1,
        }),
        ..DENSE
    },
    Model {
        name: "gemma2-9b",
        layers: 42,
        q_heads: 16,
        head_dim: 256,
        softcap: Some(50.0),
        local: Some(Local {
            window: 4096,
            local: 1,
            global: 1,
        }),
        ..DENSE
    },
    Model {
        name: "phi-2",
        q_heads: 32,
        kv_heads: 32,
        head_dim: 80,
        ..DENSE
    },
    Model {
        name: "qwen3-235b",
        layers: 94,
        q_heads: 64,
        kv_heads: 4,
        ..DENSE
    },
    Model {
        name: "deepseek-v3",
        layers: 61,
        q_heads: 128,
        kv_heads: 1,
        head_dim: 576,
        v_head_dim: Some(512),
        ..DENSE
    },
];

impl Model {
    /// Layer `layer`'s own window, None for a global layer.
    pub fn window(&self, layer: u32) -> Option<u32> {
        let l = self.local.as_ref()?;
        (layer % (l.local + l.global) < l.local).then_some(l.window)
    }

    /// `spec` with this model's attention options: V's width, softcap, sink logits, windows.
    pub fn options(&self, mut spec: kvq::CacheSpec) -> kvq::CacheSpec {
        if let Some(v) = self.v_head_dim {
            spec = spec.with_v_head_dim(v);
        }
        if let Some(c) = self.softcap {
            spec = spec.with_softcap(c);
        }
        if self.sinks {
            // Fixed values in [-2, 2), a different one per head and layer.
            let n = self.layers * self.q_heads;
            let logits = (0..n).map(|i| (i.wrapping_mul(2654435761) >> 28) as f32 / 4.0 - 2.0);
            spec = spec.with_sink_logits(logits.collect::<Vec<f32>>());
        }
        if self.local.is_some() {
            // (A window past a short cache's capacity is the whole cache.)
            let cap = spec.capacity;
            let windows = (0..self.layers).map(|l| self.window(l).map(|w| w.min(cap)));
            spec = spec.with_layer_windows(windows.collect());
        }
        spec
    }

    /// V's head size.
    pub fn v_dim(&self) -> u32 {
        self.v_head_dim.unwrap_or(self.head_dim)
    }

    /// Positions layer `layer` attends at a context of `len` tokens.
    pub fn attended(&self, layer: u32, len: u64) -> u64 {
        self.window(layer).map_or(len, |w| len.min(w as u64))
    }
}
