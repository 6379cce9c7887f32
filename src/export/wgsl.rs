//! Per-target kernel text: the WGSL of every kernel module for a [`Target`], with its entry
//! points, bind group layouts and the WebGPU features it needs.

use crate::codec::Codec;
use crate::dispatch::Dispatch;
use crate::error::{KvqError, Result};
use crate::kernels::{KernelConfig, KernelModule, LayoutTable, gpu_supported};

/// Which kind of WebGPU implementation the WGSL is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// wgpu/naga on Vulkan, Metal, DX12 or GL: the text [`KvCache`](crate::KvCache) compiles.
    Native,
    /// A browser's WebGPU (Tint in Chrome, also Dawn outside a browser; naga in Firefox):
    /// `enable f16;` where the `f16` type is used, and no subgroup operations (browsers
    /// cannot grant subgroups through wgpu). Today's kernels use no subgroups, and f16 only
    /// in the chunk module with f16 products ([`crate::Precision::Fast`], or `Auto` resolved
    /// to it), whose text enables it already, so the text equals
    /// [`Target::Native`]'s; a kernel that needs subgroups is refused for this target.
    Browser,
}

impl Target {
    /// `"native"` or `"browser"`.
    pub fn name(self) -> &'static str {
        match self {
            Target::Native => "native",
            Target::Browser => "browser",
        }
    }
}

/// How a buffer is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindingKind {
    /// `var<uniform>`.
    Uniform,
    /// `var<storage, read_write>`.
    Storage,
    /// `var<storage, read>`.
    ReadOnlyStorage,
}

impl BindingKind {
    /// The WebGPU `GPUBufferBindingType`: `uniform`, `storage` or `read-only-storage`.
    pub fn webgpu_name(self) -> &'static str {
        match self {
            BindingKind::Uniform => "uniform",
            BindingKind::Storage => "storage",
            BindingKind::ReadOnlyStorage => "read-only-storage",
        }
    }

    fn of(t: wgpu::BufferBindingType) -> BindingKind {
        match t {
            wgpu::BufferBindingType::Uniform => BindingKind::Uniform,
            wgpu::BufferBindingType::Storage { read_only: true } => BindingKind::ReadOnlyStorage,
            wgpu::BufferBindingType::Storage { read_only: false } => BindingKind::Storage,
        }
    }
}

/// One binding of a bind group layout (compute stage only, no dynamic offsets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutEntry {
    /// `@binding(n)`.
    pub binding: u32,
    /// Buffer binding type.
    pub kind: BindingKind,
    /// What the buffer holds (`K store`, `lengths`, `query`, …).
    pub role: &'static str,
}

/// A bind group layout a host creates for kvq's pipelines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindGroupLayoutDesc {
    /// Label (`kvq append store`, …), unique per layout.
    pub label: &'static str,
    /// Bindings in order.
    pub entries: Vec<LayoutEntry>,
}

impl BindGroupLayoutDesc {
    pub(super) fn of(t: LayoutTable) -> BindGroupLayoutDesc {
        BindGroupLayoutDesc {
            label: t.0,
            entries: t
                .1
                .iter()
                .map(|&(binding, ty, role)| LayoutEntry {
                    binding,
                    kind: BindingKind::of(ty),
                    role,
                })
                .collect(),
        }
    }
}

/// One kernel module as handed to a host.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportedKernel {
    /// Which module.
    pub module: KernelModule,
    /// The exact WGSL text for the target.
    pub wgsl: String,
    /// Its entry points.
    pub entry_points: Vec<&'static Dispatch>,
    /// Layouts of bind groups 0 and 1 (every entry point uses both).
    pub bind_group_layouts: [BindGroupLayoutDesc; 2],
    /// WebGPU features the module needs (`shader-f16` when it enables f16).
    pub features: Vec<&'static str>,
}

/// The code of a WGSL text with `//` comments removed (kvq's WGSL has no block comments).
fn code_only(src: &str) -> String {
    src.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `code` names the identifier `word` (not as part of a longer identifier).
fn has_word(code: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(word).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// The WGSL of `module` for `target`, with the WebGPU features it needs.
pub(super) fn module_for_target(
    cfg: &KernelConfig,
    module: KernelModule,
    target: Target,
) -> Result<(String, Vec<&'static str>)> {
    cfg.check()?;
    let src = cfg.module_source(module)?;
    let code = code_only(&src);
    let mut features = Vec::new();
    // Any target's host must request shader-f16 for a module that uses f16.
    let f16 = has_word(&code, "f16");
    if f16 {
        features.push("shader-f16");
    }
    if target == Target::Browser {
        if code.contains("subgroup") {
            return Err(KvqError::InvalidSpec(format!(
                "kernel module '{}' uses subgroup operations, which browsers cannot grant through wgpu",
                module.name()
            )));
        }
        if f16 && !code.contains("enable f16;") {
            return Ok((format!("enable f16;\n{src}"), features));
        }
    }
    Ok((src, features))
}

/// The exact WGSL text of `module` for a cache of `cfg`'s shape on `target`.
pub fn kernel_wgsl(cfg: &KernelConfig, module: KernelModule, target: Target) -> Result<String> {
    module_for_target(cfg, module, target).map(|(s, _)| s)
}

/// Every kernel module of a cache of `cfg`'s shape for `target`: text, entry points, bind
/// group layouts and dispatch rules.
pub fn export_kernels(cfg: &KernelConfig, target: Target) -> Result<Vec<ExportedKernel>> {
    KernelModule::all()
        .into_iter()
        .map(|module| {
            let (wgsl, features) = module_for_target(cfg, module, target)?;
            Ok(ExportedKernel {
                module,
                wgsl,
                entry_points: module.entry_points().to_vec(),
                bind_group_layouts: module.layouts().map(BindGroupLayoutDesc::of),
                features,
            })
        })
        .collect()
}

/// Every codec kvq's GPU kernels serve, from the codec list itself (new GPU codecs appear
/// here as soon as [`crate::kernels::gpu_supported`] accepts them).
pub fn gpu_codecs() -> Vec<Codec> {
    let mut v: Vec<Codec> = Vec::new();
    for name in Codec::valid_names() {
        if let Ok(c) = Codec::parse(&name)
            && gpu_supported(c)
            && !v.contains(&c)
        {
            v.push(c);
        }
    }
    v
}
