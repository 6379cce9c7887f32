//! The kernel modules kvq builds for a cache: for each, its WGSL root, bind group layouts
//! and entry points with their dispatch rules, read by the pipeline builder, the cache's
//! recorder and [`crate::export`] alike.

use crate::dispatch::Dispatch;
use crate::kernels::InputType;
use crate::kernels::pipelines::{
    APPEND_INPUT, APPEND_STORE, DECODE_IO, DECODE_STORE, LayoutTable, STEP_IO, STEP_STORE,
};

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
}

impl KernelModule {
    /// Every module of a cache, in a fixed order.
    pub fn all() -> [KernelModule; 5] {
        [
            KernelModule::Append(InputType::F32),
            KernelModule::Append(InputType::F16),
            KernelModule::Decode,
            KernelModule::Step(InputType::F32),
            KernelModule::Step(InputType::F16),
        ]
    }

    /// Short name: `append_f32`, `append_f16`, `decode`, `step_f32`, `step_f16`.
    pub fn name(self) -> String {
        match self {
            KernelModule::Append(t) => format!("append_{}", t.name()),
            KernelModule::Decode => "decode".into(),
            KernelModule::Step(t) => format!("step_{}", t.name()),
        }
    }

    /// Its root file under `wgsl/`, which the preprocessor expands.
    pub(crate) fn root(self) -> &'static str {
        match self {
            KernelModule::Append(_) => "kernels/append.wgsl",
            KernelModule::Decode => "kernels/decode.wgsl",
            KernelModule::Step(_) => "kernels/step.wgsl",
        }
    }

    /// Whether it writes rows (the codec files' encoders are in it).
    pub(crate) fn encodes(self) -> bool {
        !matches!(self, KernelModule::Decode)
    }

    /// The element type of the caller's K/V input it reads, if any.
    pub(crate) fn input(self) -> Option<InputType> {
        match self {
            KernelModule::Append(t) | KernelModule::Step(t) => Some(t),
            KernelModule::Decode => None,
        }
    }

    /// Its bind group layouts: group 0 (the cache's store), group 1 (the caller's buffers).
    pub(crate) fn layouts(self) -> [LayoutTable; 2] {
        match self {
            KernelModule::Append(_) => [APPEND_STORE, APPEND_INPUT],
            KernelModule::Decode => [DECODE_STORE, DECODE_IO],
            KernelModule::Step(_) => [STEP_STORE, STEP_IO],
        }
    }

    /// Entry points, each with how it is dispatched ([`Dispatch::entry`] is the WGSL name).
    pub fn entry_points(self) -> &'static [&'static Dispatch] {
        use crate::dispatch as d;
        match self {
            KernelModule::Append(_) => &[&d::APPEND_SMALL, &d::APPEND_WIDE, &d::APPEND_COMMIT],
            KernelModule::Decode | KernelModule::Step(_) => &[&d::SPLIT, &d::REDUCE],
        }
    }
}
