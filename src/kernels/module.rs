//! The kernel modules kvq builds for a cache: for each, its WGSL root, bind group layouts
//! and entry points with their dispatch rules, read by the pipeline builder, the cache's
//! recorder and [`crate::export`] alike.

use crate::dispatch::Dispatch;

/// One WGSL module kvq builds for a cache (a module holds several entry points).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelModule {
    /// Append of new tokens (`append_small`, `append_wide`, `append_commit`) reading the
    /// caller's K/V input of this element type.
    Append(InputType),
    /// Decode attention over the store (`split`, `reduce`).
    Decode,
    /// The fused decode step (`split` also appends the new rows, `reduce` commits the
    /// length), reading the caller's K/V input of this element type.
    Step(InputType),
    /// Attention of a chunk of new tokens, already appended (`split`, `reduce`): the decode
    /// kernels with several new tokens' queries per split workgroup, each with its causal
    /// end, and the query the reduce grid's third dimension; and for long slices the prefill
    /// kernel (`prefill_q`, `prefill`), tiled over queries and keys, into the same partials.
    Chunk,
}

impl KernelModule {
    /// Every module of a cache, in a fixed order.
    pub fn all() -> [KernelModule; 6] {
        [
            KernelModule::Append(InputType::F32),
            KernelModule::Append(InputType::F16),
            KernelModule::Decode,
            KernelModule::Step(InputType::F32),
            KernelModule::Step(InputType::F16),
            KernelModule::Chunk,
        ]
    }

    /// Short name: `append_f32`, `append_f16`, `decode`, `step_f32`, `step_f16`, `chunk`.
    pub fn name(self) -> String {
        match self {
            KernelModule::Append(t) => format!("append_{}", t.name()),
            KernelModule::Decode => "decode".into(),
            KernelModule::Step(t) => format!("step_{}", t.name()),
            KernelModule::Chunk => "chunk".into(),
        }
    }

    /// Its root file under `wgsl/`, which the preprocessor expands.
    pub(crate) fn root(self) -> &'static str {
        match self {
            KernelModule::Append(_) => "kernels/append.wgsl",
            KernelModule::Decode | KernelModule::Chunk => "kernels/decode.wgsl",
            KernelModule::Step(_) => "kernels/step.wgsl",
        }
    }

    /// Whether it writes rows (the codec files' encoders are in it).
    pub(crate) fn encodes(self) -> bool {
        !matches!(self, KernelModule::Decode | KernelModule::Chunk)
    }

    /// The element type of the caller's K/V input it reads, if any.
    pub(crate) fn input(self) -> Option<InputType> {
        match self {
            KernelModule::Append(t) | KernelModule::Step(t) => Some(t),
            KernelModule::Decode | KernelModule::Chunk => None,
        }
    }

    /// Its bind group layouts: group 0 (the cache's store), group 1 (the caller's buffers).
    pub(crate) fn layouts(self) -> [LayoutTable; 2] {
        match self {
            KernelModule::Append(_) => [APPEND_STORE, APPEND_INPUT],
            KernelModule::Decode => [DECODE_STORE, DECODE_IO],
            KernelModule::Chunk => [DECODE_STORE, CHUNK_IO],
            KernelModule::Step(_) => [STEP_STORE, STEP_IO],
        }
    }

    /// Entry points, each with how it is dispatched ([`Dispatch::entry`] is the WGSL name).
    pub fn entry_points(self) -> &'static [&'static Dispatch] {
        use crate::dispatch as d;
        match self {
            KernelModule::Append(_) => &[&d::APPEND_SMALL, &d::APPEND_WIDE, &d::APPEND_COMMIT],
            KernelModule::Decode | KernelModule::Step(_) => &[&d::SPLIT, &d::REDUCE],
            KernelModule::Chunk => &[&d::CHUNK_SPLIT, &d::REDUCE, &d::PREFILL_Q, &d::PREFILL],
        }
    }
}

/// Element type of the caller's K/V input buffers for append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputType {
    /// `f32` values.
    F32,
    /// `f16` values, two per 32-bit word (element 2i in the low half).
    F16,
}

impl InputType {
    /// `"f32"` or `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            InputType::F32 => "f32",
            InputType::F16 => "f16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            InputType::F32 => 4,
            InputType::F16 => 2,
        }
    }
}

/// A bind group layout: its label and, per binding, the buffer type and the buffer's role
/// (what [`crate::export`] tells other WebGPU hosts).
pub(crate) type LayoutTable = (
    &'static str,
    &'static [(u32, wgpu::BufferBindingType, &'static str)],
);

const UNIFORM: wgpu::BufferBindingType = wgpu::BufferBindingType::Uniform;
const RW: wgpu::BufferBindingType = wgpu::BufferBindingType::Storage { read_only: false };
const RO: wgpu::BufferBindingType = wgpu::BufferBindingType::Storage { read_only: true };

pub(crate) const APPEND_STORE: LayoutTable = (
    "kvq append store",
    &[
        (0, UNIFORM, "segment params"),
        (1, RW, "K store"),
        (2, RW, "V store"),
        (3, RW, "lengths"),
    ],
);
pub(crate) const APPEND_INPUT: LayoutTable = (
    "kvq append input",
    &[
        (0, RO, "K input"),
        (1, RO, "V input"),
        (2, UNIFORM, "append params"),
    ],
);
pub(crate) const DECODE_STORE: LayoutTable = (
    "kvq decode store",
    &[
        (0, UNIFORM, "segment params"),
        (1, RO, "K store"),
        (2, RO, "V store"),
        (3, RO, "lengths"),
        (4, RW, "partials"),
    ],
);
pub(crate) const DECODE_IO: LayoutTable = ("kvq decode io", &[(0, RO, "query"), (1, RW, "output")]);
pub(crate) const CHUNK_IO: LayoutTable = (
    "kvq chunk io",
    &[
        (0, RO, "query"),
        (1, RW, "output"),
        (2, UNIFORM, "chunk slice params"),
        (3, RW, "log-sum-exp"),
    ],
);
pub(crate) const STEP_STORE: LayoutTable = (
    "kvq step store",
    &[
        (0, UNIFORM, "segment params"),
        (1, RW, "K store"),
        (2, RW, "V store"),
        (3, RW, "lengths"),
        (4, RW, "partials"),
    ],
);
pub(crate) const STEP_IO: LayoutTable = (
    "kvq step io",
    &[
        (0, RO, "query"),
        (1, RW, "output"),
        (2, RO, "K input"),
        (3, RO, "V input"),
        (4, UNIFORM, "step params"),
    ],
);
