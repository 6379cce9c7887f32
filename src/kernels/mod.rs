//! WGSL assembly and pipelines.
//!
//! Each kernel module is one root file under `wgsl/kernels/`, expanded by kvq's preprocessor
//! (`src/kernels/preprocess.rs`) against one table of constants: the cache's shape, codec and tuning
//! numbers, emitted as a block of WGSL `const`s in front of the module. Baking the shape into
//! constants lets the compiler unroll the head loops and size workgroup arrays, and makes
//! every exported shader self-contained. `wgsl/README.md` states what each file provides.

mod cache;
mod config;
mod constants;
mod module;
mod pipelines;
mod poison;
mod prefill_tile;
mod preprocess;
mod shape;
mod workgroup;

pub(crate) use cache::KernelCache;
pub(crate) use config::{K_BLOCK, encode_tasks, row_groups};
pub use config::{KernelConfig, gpu_supported};
pub(crate) use module::LayoutTable;
pub use module::{InputType, KernelModule};
pub(crate) use pipelines::Pipelines;
pub(crate) use shape::ShapeParams;
pub use workgroup::{INVOCATIONS_NEEDED, WORKGROUP_MEMORY_NEEDED};
