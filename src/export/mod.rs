//! Kernels and whole decode scenarios for any WebGPU host (a browser, Dawn, another engine).
//!
//! Two levels:
//! * **Kernels.** [`export_kernels`] gives, for a [`KernelConfig`](crate::KernelConfig) and a
//!   [`Target`], the exact WGSL text of every kernel module kvq builds, with its entry points,
//!   the bind group layouts a host must create (group 0: the cache's store, group 1: the
//!   caller's buffers) and how each entry point is dispatched.
//! * **Replay plans.** [`replay_plan`] builds a real [`KvCache`](crate::KvCache) for a
//!   [`Scenario`] (a spec, a prefill and a few decode steps), records it through the same
//!   code that records into a `wgpu::ComputePass`, and returns a [`ReplayPlan`]: every buffer
//!   with its initial bytes, every shader module, bind group layout, pipeline and bind group,
//!   the ordered dispatches, and checks (buffers to read back with the values kvq's CPU
//!   reference expects). A host that replays the plan runs exactly what kvq ships, with no
//!   knowledge of kvq's layout; `web/replay.mjs` does so in Dawn, `cargo run --example
//!   export_wgsl` writes the plans (for the scenarios listed in `examples/shared/scenarios.rs`,
//!   which `tests/export.rs` checks too).
//!
//! Nothing here panics: every failure is a [`KvqError`](crate::KvqError).
//!
//! The code, by what it holds: `wgsl` (the per-target kernel text), `plan` (the replay plan's
//! types), `record` (the recorder the cache records a plan through), `scenario` (a scenario
//! and [`replay_plan`]) and `json` (serialization); every public item is re-exported here.

mod json;
mod plan;
mod record;
mod scenario;
mod wgsl;

pub use crate::kernels::KernelModule;
pub use json::{base64, json_string, kernels_json};
pub use plan::{
    Expected, PlanBindGroup, PlanBuffer, PlanCheck, PlanDispatch, PlanModule, PlanPass,
    PlanPipeline, ReplayPlan,
};
#[cfg(not(target_arch = "wasm32"))]
pub use scenario::replay_plan;
pub use scenario::{CHUNK_TOKENS, Scenario, StepPath, replay_plan_async};
pub use wgsl::{
    BindGroupLayoutDesc, BindingKind, ExportedKernel, LayoutEntry, Target, export_kernels,
    gpu_codecs, kernel_wgsl,
};
