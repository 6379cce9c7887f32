//! The chat example's typed errors: every bad input (a file that is no GGUF, a GGUF of another
//! architecture, a missing or misshapen tensor, a prompt longer than the cache) is one of
//! these, never a panic.

use std::path::PathBuf;

/// What can go wrong loading a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a GGUF this reader understands (bad magic, version, truncated).
    #[error("{path}: not a readable GGUF file: {detail}")]
    BadGguf {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The GGUF holds a model of another architecture.
    #[error("{path}: architecture '{found}', but this forward runs 'llama' only")]
    Architecture {
        /// The file.
        path: PathBuf,
        /// `general.architecture` as found.
        found: String,
    },
    /// A metadata key the forward needs is missing or of the wrong type.
    #[error("GGUF metadata: {key} {problem}")]
    Metadata {
        /// The key.
        key: String,
        /// Missing, or the type found.
        problem: String,
    },
    /// A tensor the forward needs is not in the file.
    #[error("GGUF tensor {name} is missing")]
    MissingTensor {
        /// The tensor's name.
        name: String,
    },
    /// A tensor has another shape than the metadata implies.
    #[error(
        "GGUF tensor {name} has shape {found:?}, expected {expected:?} (GGUF order: columns first)"
    )]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// The shape the metadata implies.
        expected: Vec<u64>,
        /// The shape in the file.
        found: Vec<u64>,
    },
    /// A tensor's element type is not one the kernels read.
    #[error("GGUF tensor {name} has ggml type {ty}; the kernels read F32, F16, Q4_1 and Q8_0")]
    TensorType {
        /// The tensor's name.
        name: String,
        /// The ggml type id.
        ty: u32,
    },
    /// The model's shape is one the kernels do not serve.
    #[error("model shape: {0}")]
    Shape(String),
    /// A prompt (or a turn) longer than the cache has room for.
    #[error(
        "the prompt has {tokens} tokens and the cache holds {len} already, past its capacity of {capacity} (--ctx)"
    )]
    PromptTooLong {
        /// Tokens of the prompt.
        tokens: u32,
        /// Tokens already in the cache.
        len: u32,
        /// The cache's capacity.
        capacity: u32,
    },
    /// The cache of a sequence is full: no room for the next token.
    #[error("the cache is full ({capacity} tokens, --ctx)")]
    CacheFull {
        /// The cache's capacity.
        capacity: u32,
    },
    /// A bad command-line argument.
    #[error("{0}")]
    Argument(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// kvq refused something (typed in turn).
    #[error(transparent)]
    Kvq(#[from] kvq::KvqError),
    /// The GPU failed (a validation error, a lost device, a failed map).
    #[error("GPU: {0}")]
    Gpu(String),
}

/// The example's result type.
pub type Result<T> = std::result::Result<T, ChatError>;
