//! Workgroup memory of an entry point, read off the compiled module (naga's analysis), so
//! that no hand count of the WGSL declarations can drift from them.

use naga::AddressSpace;

use crate::error::{KvqError, Result};

/// The smallest workgroup-memory budget kvq's kernels are written for (Apple's limit).
pub const WORKGROUP_MEMORY_NEEDED: u32 = 32 * 1024;
/// Invocations per workgroup kvq's kernels use at most.
pub const INVOCATIONS_NEEDED: u32 = 256;

/// Workgroup memory each named entry point of `src` uses (directly or through the functions it
/// calls), in bytes: the variables' sizes, each rounded up to 16 bytes as WebGPU counts them
/// against `maxComputeWorkgroupStorageSize`, and their exact sum (what a GPU allocates, for
/// the 12 KiB cliff).
pub(crate) fn workgroup_bytes(src: &str, entry: &str) -> Result<WorkgroupBytes> {
    let err = |what: String| KvqError::Gpu(format!("reading kvq's workgroup memory: {what}"));
    let (module, info) = analyse(src).map_err(err)?;
    let i = module
        .entry_points
        .iter()
        .position(|ep| ep.name == entry)
        .ok_or_else(|| err(format!("no entry point {entry}")))?;
    let uses = info.get_entry_point(i);
    let mut bytes = WorkgroupBytes::default();
    for (h, var) in module.global_variables.iter() {
        if var.space != AddressSpace::WorkGroup || uses[h].is_empty() {
            continue;
        }
        let size = module.types[var.ty].inner.size(module.to_ctx());
        bytes.exact += size;
        bytes.webgpu += size.next_multiple_of(16);
    }
    Ok(bytes)
}

/// `src` parsed and validated by naga: the module and its analysis (which global each entry
/// point uses), or the error as text.
pub(crate) fn analyse(
    src: &str,
) -> std::result::Result<(naga::Module, naga::valid::ModuleInfo), String> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{e:?}"))?;
    Ok((module, info))
}

/// An entry point's workgroup memory in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WorkgroupBytes {
    /// The variables' sizes summed.
    pub exact: u32,
    /// Each rounded up to 16 bytes first (WebGPU's rule for the limit).
    pub webgpu: u32,
}
