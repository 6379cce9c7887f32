//! The example's own WGSL kernels (`kernels/*.wgsl`): each module assembled from its file, the
//! files it `#include`s and a header of `const`s for one shape, compiled once per variant.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::{ChatError, Result};

const SOURCES: &[(&str, &str)] = &[
    ("params.wgsl", include_str!("kernels/params.wgsl")),
    ("weights.wgsl", include_str!("kernels/weights.wgsl")),
    ("matvec.wgsl", include_str!("kernels/matvec.wgsl")),
    ("matmul.wgsl", include_str!("kernels/matmul.wgsl")),
    ("embed.wgsl", include_str!("kernels/embed.wgsl")),
    ("rms.wgsl", include_str!("kernels/rms.wgsl")),
    ("rope.wgsl", include_str!("kernels/rope.wgsl")),
    ("sample.wgsl", include_str!("kernels/sample.wgsl")),
    ("fill.wgsl", include_str!("kernels/fill.wgsl")),
];

/// A binding of a kernel's one bind group.
#[derive(Clone, Copy)]
enum Slot {
    Read,
    Write,
    Uniform,
}

/// The kernels, by the file of their module: each one's bind group (group 0), in binding order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// x, gain, codes, scales, y, params.
    Matvec,
    /// x, gain, codes, scales, y, params, inv.
    Matmul,
    /// ids, h, codes, scales, params.
    Embed,
    /// h, inv, params.
    Rms,
    /// qkv, q, k, v, kvq's lengths, consts, params, the layer.
    Rope,
    /// logits, state, params.
    Sample,
    /// codes, scales.
    Fill,
}

impl Kind {
    fn file(self) -> &'static str {
        match self {
            Kind::Matvec => "matvec.wgsl",
            Kind::Matmul => "matmul.wgsl",
            Kind::Embed => "embed.wgsl",
            Kind::Rms => "rms.wgsl",
            Kind::Rope => "rope.wgsl",
            Kind::Sample => "sample.wgsl",
            Kind::Fill => "fill.wgsl",
        }
    }

    fn slots(self) -> &'static [Slot] {
        use Slot::*;
        match self {
            Kind::Matvec => &[Read, Read, Read, Read, Write, Uniform],
            Kind::Matmul => &[Read, Read, Read, Read, Write, Uniform, Read],
            Kind::Embed => &[Read, Write, Read, Read, Uniform],
            Kind::Rms => &[Read, Write, Uniform],
            Kind::Rope => &[Read, Write, Write, Write, Read, Read, Uniform, Uniform],
            Kind::Sample => &[Read, Write, Uniform],
            Kind::Fill => &[Write, Write],
        }
    }
}

/// A `const` of a module's header.
#[derive(Clone, Debug)]
pub enum Const {
    /// `u32`.
    U(u32),
    /// `f32`.
    F(f32),
    /// `bool`.
    B(bool),
}

/// A compiled kernel: its pipeline and its bind group layout.
pub struct Kernel {
    /// The pipeline.
    pub pipeline: wgpu::ComputePipeline,
    /// Its group 0.
    pub layout: wgpu::BindGroupLayout,
}

/// Builds and keeps the example's pipelines, one per (module, constants).
pub struct Kernels {
    device: wgpu::Device,
    layouts: Mutex<HashMap<Kind, wgpu::BindGroupLayout>>,
    built: Mutex<HashMap<String, std::sync::Arc<Kernel>>>,
}

/// `file` with its `#include "x"` lines replaced by `x` (each file once).
fn assemble(file: &str, seen: &mut Vec<String>, out: &mut String) {
    if seen.iter().any(|s| s == file) {
        return;
    }
    seen.push(file.to_string());
    let src = SOURCES
        .iter()
        .find(|(n, _)| *n == file)
        .map(|(_, s)| *s)
        .unwrap_or_default();
    for line in src.lines() {
        match line
            .strip_prefix("#include \"")
            .and_then(|l| l.strip_suffix('"'))
        {
            Some(inc) => assemble(inc, seen, out),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
}

/// The WGSL of `kind` with `consts` as its header.
pub fn source(kind: Kind, consts: &[(&str, Const)]) -> String {
    let mut out = String::new();
    for (name, c) in consts {
        let line = match c {
            Const::U(v) => format!("const {name}: u32 = {v}u;\n"),
            Const::F(v) => format!("const {name}: f32 = {v:e};\n"),
            Const::B(v) => format!("const {name}: bool = {v};\n"),
        };
        out.push_str(&line);
    }
    assemble(kind.file(), &mut Vec::new(), &mut out);
    out
}

impl Kernels {
    /// The kernels of `device`.
    pub fn new(device: &wgpu::Device) -> Kernels {
        Kernels {
            device: device.clone(),
            layouts: Mutex::new(HashMap::new()),
            built: Mutex::new(HashMap::new()),
        }
    }

    fn layout(&self, kind: Kind) -> wgpu::BindGroupLayout {
        let mut l = self.layouts.lock().unwrap_or_else(|e| e.into_inner());
        l.entry(kind)
            .or_insert_with(|| {
                let entries: Vec<_> = kind
                    .slots()
                    .iter()
                    .enumerate()
                    .map(|(i, s)| wgpu::BindGroupLayoutEntry {
                        binding: i as u32,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: match s {
                                Slot::Uniform => wgpu::BufferBindingType::Uniform,
                                Slot::Read => wgpu::BufferBindingType::Storage { read_only: true },
                                Slot::Write => {
                                    wgpu::BufferBindingType::Storage { read_only: false }
                                }
                            },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    })
                    .collect();
                self.device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some(kind.file()),
                        entries: &entries,
                    })
            })
            .clone()
    }

    /// The kernel of `kind` for `consts`, compiled on first use.
    pub fn get(&self, kind: Kind, consts: &[(&str, Const)]) -> Result<std::sync::Arc<Kernel>> {
        let src = source(kind, consts);
        if let Some(k) = self
            .built
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&src)
        {
            return Ok(k.clone());
        }
        let layout = self.layout(kind);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(kind.file()),
            source: wgpu::ShaderSource::Wgsl(src.clone().into()),
        };
        // SAFETY: every loop of these kernels counts by a fixed step to a bound of the shape
        // or of a uniform, so it terminates; wgpu's loop counters are left out (they cost
        // kvq's kernels 7-28 %), its index clamping kept.
        let checks = wgpu::ShaderRuntimeChecks {
            force_loop_bounding: false,
            ..wgpu::ShaderRuntimeChecks::checked()
        };
        let module = unsafe { self.device.create_shader_module_trusted(desc, checks) };
        let pl = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(kind.file()),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kind.file()),
                layout: Some(&pl),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(ChatError::Gpu(format!(
                "building the {} kernel failed: {e}",
                kind.file()
            )));
        }
        let k = std::sync::Arc::new(Kernel { pipeline, layout });
        self.built
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(src, k.clone());
        Ok(k)
    }

    /// A bind group of `kernel` over whole buffers, binding `i` being `bufs[i]`.
    pub fn bind(&self, kernel: &Kernel, bufs: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let res: Vec<_> = bufs.iter().map(|b| b.as_entire_binding()).collect();
        self.bind_resources(kernel, res)
    }

    /// A bind group of `kernel`, binding `i` being `res[i]` (a buffer's range, say).
    pub fn bind_resources(
        &self,
        kernel: &Kernel,
        res: Vec<wgpu::BindingResource<'_>>,
    ) -> wgpu::BindGroup {
        let entries: Vec<_> = res
            .into_iter()
            .enumerate()
            .map(|(i, r)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: r,
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &kernel.layout,
            entries: &entries,
        })
    }

    /// Pipelines built so far.
    pub fn count(&self) -> usize {
        self.built.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
