//! Model presets shared by the examples (`#[path]`-included; not an example of its own).

/// The KV-cache shape of a model.
pub struct Model {
    pub name: &'static str,
    pub layers: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
}

/// `llama3-8b`, `qwen3-8b` (the Bonsai-8B shape), `qwen2.5-7b` (4 KV heads, GQA 7),
/// `llama3-70b` (80 layers, 8 KV heads, GQA 8) and `tiny`.
pub const MODELS: &[Model] = &[
    Model {
        name: "llama3-8b",
        layers: 32,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
    },
    Model {
        name: "qwen3-8b",
        layers: 36,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
    },
    Model {
        name: "qwen2.5-7b",
        layers: 28,
        q_heads: 28,
        kv_heads: 4,
        head_dim: 128,
    },
    Model {
        name: "llama3-70b",
        layers: 80,
        q_heads: 64,
        kv_heads: 8,
        head_dim: 128,
    },
    Model {
        name: "tiny",
        layers: 4,
        q_heads: 8,
        kv_heads: 2,
        head_dim: 64,
    },
];
