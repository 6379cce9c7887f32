//! What the Vulkan driver made of kvq's decode kernels: registers, spills, shared memory and
//! whatever else it reports through `VK_KHR_pipeline_executable_properties`, per codec and
//! entry point. wgpu does not expose these statistics, so this example translates the same
//! WGSL to SPIR-V with naga (with wgpu's Vulkan options) and compiles it with ash on a Vulkan
//! device of its own. Registers per invocation decide how many decode workgroups a
//! multiprocessor holds at once (BENCHMARKS.md, "Split count: one wave of resident workgroups", has the H200's counts).
//!
//! `cargo run --release --example kernel_stats -- --model qwen3-8b --ctx 32768 --codecs all`
//! (`--splits` defaults to 64 and `--wg` to 128, the common GPU case; the split count is a
//! constant of the kernel that does not change its registers).
//!
//! `--dump DIR` also writes each pipeline's SPIR-V and its Vulkan pipeline-cache data
//! (`DIR/<codec>-<entry>.{spv,cache}`). NVIDIA's cache data holds the compiled machine code:
//! `python3 bench/sass.py DIR/*.cache` turns it into SASS listings with NVIDIA's `nvdisasm`
//! (BENCHMARKS.md, "Registers, SASS and instructions per token", read the H200's this way).

use std::ffi::CString;

use ash::vk;
use kvq::{InputType, KernelConfig, KernelModule, KvCodecs};
use naga::back::spv;
use naga::valid::{Capabilities, ValidationFlags, Validator};

#[path = "shared/codec_list.rs"]
mod codec_list;
#[path = "shared/models.rs"]
mod models;

type Error = Box<dyn std::error::Error>;
/// A binding the shader declares: (group, binding, descriptor type).
type Binding = (u32, u32, vk::DescriptorType);

const USAGE: &str = "usage: kernel_stats [--model llama3-8b|qwen3-8b|qwen2.5-7b|llama3-70b|tiny] [--ctx 32768] \
[--codecs none,...|all] [--splits 64] [--wg 128] [--module step|chunk] [--precision auto|exact|fast (default auto)] [--exact SINK,RECENT[,kmean]] [--matrix 16|8 [--matrix-rows R]] [--dump DIR]";

struct Args {
    model: String,
    ctx: u32,
    codecs: Vec<String>,
    splits: u32,
    workgroup: u32,
    /// The module whose kernels are compiled: the fused step (`step`, what a decode step runs)
    /// or the chunk's attention (`chunk`).
    module: KernelModule,
    dump: Option<String>,
    /// The products' arithmetic (`--precision auto|exact|fast`, resolved per codec as a cache
    /// does; fast: the prefill kernel's f16).
    precision: kvq::Precision,
    /// Tokens kept exact (`--exact SINK,RECENT[,kmean]`): their kernels take the exact
    /// workgroup's path too.
    exact: kvq::ExactTokens,
    /// `--matrix F`: the chunk module's prefill kernel on cooperative matrices of F x F
    /// (`KernelConfig::matrix`, `--matrix-rows`: its rows a workgroup, default 2 F), compiled
    /// with `VK_KHR_cooperative_matrix`.
    matrix: Option<kvq::MatrixUnits>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model: "qwen3-8b".into(),
        ctx: 32768,
        codecs: vec!["none".into()],
        splits: 64,
        workgroup: 128,
        module: KernelModule::Step(InputType::F16),
        dump: None,
        precision: kvq::Precision::Auto,
        exact: kvq::ExactTokens::NONE,
        matrix: None,
    };
    let mut rows = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| v.parse::<u32>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--model" => a.model = value()?,
            "--ctx" => a.ctx = num(value()?)?,
            "--codecs" => a.codecs = codec_list::split_codecs(&value()?),
            "--splits" => a.splits = num(value()?)?,
            "--wg" => a.workgroup = num(value()?)?,
            "--dump" => a.dump = Some(value()?),
            "--matrix" => a.matrix = Some(kvq::MatrixUnits::new(num(value()?)?, false)),
            "--matrix-rows" => rows = Some(num(value()?)?),
            "--precision" => {
                a.precision = value()?
                    .parse()
                    .map_err(|e| format!("--precision: {e}\n{USAGE}"))?
            }
            "--exact" => {
                a.exact = value()?
                    .parse()
                    .map_err(|e| format!("--exact: {e}\n{USAGE}"))?
            }
            "--module" => {
                a.module = match value()?.as_str() {
                    "step" => KernelModule::Step(InputType::F16),
                    "chunk" => KernelModule::Chunk,
                    m => return Err(format!("--module {m}: step or chunk\n{USAGE}")),
                }
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    if let Some(m) = &mut a.matrix {
        m.rows = rows.unwrap_or(m.rows);
        if !m.has_kernels() {
            return Err(format!(
                "--matrix {} --matrix-rows {}: kvq's matrix kernels take fragments of 16 or 8, rows F or 2 F",
                m.fragment, m.rows
            ));
        }
        // (The matrix kernel is the chunk module's prefill entry, with f16 products.)
        a.module = KernelModule::Chunk;
        a.precision = kvq::Precision::Fast;
    }
    Ok(a)
}

/// SPIR-V of `entry` in `src` as wgpu's Vulkan backend writes it on a device with robust
/// buffer access 2 (buffer accesses left to the driver) with kvq's runtime checks (indices
/// clamped where `clamp`: `KernelConfig::clamps_indices`), and the bindings it declares:
/// (group, binding, descriptor type).
/// With `matrix`, cooperative matrices and SPIR-V 1.6 (wgpu's choice on Vulkan 1.3).
fn spirv(
    src: &str,
    entry: &str,
    clamp: bool,
    matrix: bool,
) -> Result<(Vec<u32>, Vec<Binding>), Error> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
    let mut caps = Capabilities::SHADER_FLOAT16_IN_FLOAT32 | Capabilities::SHADER_FLOAT16;
    if matrix {
        caps |= Capabilities::COOPERATIVE_MATRIX | Capabilities::SUBGROUP;
    }
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| e.emit_to_string(src))?;
    let stage = naga::ShaderStage::Compute;
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((stage, entry)),
        &Default::default(),
    )?;
    let mut bindings = Vec::new();
    for (_, var) in module.global_variables.iter() {
        if let Some(rb) = &var.binding {
            let ty = match var.space {
                naga::AddressSpace::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
                _ => vk::DescriptorType::STORAGE_BUFFER,
            };
            bindings.push((rb.group, rb.binding, ty));
        }
    }
    let opts = spv::Options {
        lang_version: if matrix { (1, 6) } else { (1, 3) },
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: if clamp {
                naga::proc::BoundsCheckPolicy::Restrict
            } else {
                naga::proc::BoundsCheckPolicy::Unchecked
            },
            buffer: naga::proc::BoundsCheckPolicy::Unchecked,
            image_load: naga::proc::BoundsCheckPolicy::Unchecked,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        // As kvq compiles its kernels: without wgpu's zeroing of workgroup memory and without its
        // loop bounding (GpuContext::with_shader_checks).
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: false,
        ..Default::default()
    };
    let pipe = spv::PipelineOptions {
        shader_stage: stage,
        entry_point: entry.into(),
    };
    Ok((
        spv::write_vec(&module, &info, &opts, Some(&pipe))?,
        bindings,
    ))
}

/// A Vulkan device with pipeline statistics enabled.
struct Vulkan {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    stats: ash::khr::pipeline_executable_properties::Device,
    name: String,
}

impl Vulkan {
    /// `f16`: with shaderFloat16 (the f16 prefill kernel's SPIR-V needs it); `matrix`: with
    /// `VK_KHR_cooperative_matrix` and the Vulkan memory model, as wgpu asks for them.
    fn new(f16: bool, matrix: bool) -> Result<Vulkan, Error> {
        let ext = ash::khr::pipeline_executable_properties::NAME;
        // SAFETY: plain Vulkan calls with valid create infos; every handle outlives its uses.
        unsafe {
            let entry = ash::Entry::load()?;
            // (1.2: the f16 feature is chained as Vulkan 1.2 features; 1.3 for SPIR-V 1.6.)
            let api = match matrix {
                true => vk::API_VERSION_1_3,
                false => vk::API_VERSION_1_2,
            };
            let app = vk::ApplicationInfo::default().api_version(api);
            let instance = entry.create_instance(
                &vk::InstanceCreateInfo::default().application_info(&app),
                None,
            )?;
            // The first discrete GPU with the extension, else any device with it.
            let mut best = None;
            for pd in instance.enumerate_physical_devices()? {
                let has = instance
                    .enumerate_device_extension_properties(pd)?
                    .iter()
                    .any(|e| e.extension_name_as_c_str() == Ok(ext));
                let props = instance.get_physical_device_properties(pd);
                let discrete = props.device_type == vk::PhysicalDeviceType::DISCRETE_GPU;
                if has && (best.is_none() || discrete) {
                    let name = props.device_name_as_c_str()?.to_string_lossy().into_owned();
                    best = Some((pd, name));
                    if discrete {
                        break;
                    }
                }
            }
            let (pd, name) =
                best.ok_or("no Vulkan device offers VK_KHR_pipeline_executable_properties")?;
            let family = instance
                .get_physical_device_queue_family_properties(pd)
                .iter()
                .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
                .ok_or("no compute queue")? as u32;
            let prio = [1.0];
            let queues = [vk::DeviceQueueCreateInfo::default()
                .queue_family_index(family)
                .queue_priorities(&prio)];
            let mut exts = vec![ext.as_ptr()];
            if matrix {
                exts.push(ash::khr::cooperative_matrix::NAME.as_ptr());
            }
            let mut feat = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
                .pipeline_executable_info(true);
            let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
                .shader_float16(f16)
                .vulkan_memory_model(matrix)
                .vulkan_memory_model_device_scope(matrix);
            let mut coop =
                vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
            let mut info = vk::DeviceCreateInfo::default()
                .queue_create_infos(&queues)
                .enabled_extension_names(&exts)
                .push_next(&mut feat)
                .push_next(&mut f12);
            if matrix {
                info = info.push_next(&mut coop);
            }
            let device = instance.create_device(pd, &info, None)?;
            let stats = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
            Ok(Vulkan {
                _entry: entry,
                instance,
                device,
                stats,
                name,
            })
        }
    }

    /// Every statistic the driver reports for the compute pipeline of `entry`, as
    /// "name=value" strings; with `dump`, the pipeline's cache data and SPIR-V are written to
    /// `{dump}.cache` and `{dump}.spv`.
    fn pipeline_stats(
        &self,
        src: &str,
        entry: &str,
        clamp: bool,
        matrix: bool,
        dump: Option<&str>,
    ) -> Result<Vec<String>, Error> {
        let (words, bindings) = spirv(src, entry, clamp, matrix)?;
        let d = &self.device;
        // SAFETY: as in `new`; everything created here is destroyed before returning.
        unsafe {
            let module =
                d.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)?;
            let groups = bindings.iter().map(|b| b.0 + 1).max().unwrap_or(0);
            let mut set_layouts = Vec::new();
            for g in 0..groups {
                let b: Vec<_> = bindings
                    .iter()
                    .filter(|b| b.0 == g)
                    .map(|&(_, binding, ty)| {
                        vk::DescriptorSetLayoutBinding::default()
                            .binding(binding)
                            .descriptor_type(ty)
                            .descriptor_count(1)
                            .stage_flags(vk::ShaderStageFlags::COMPUTE)
                    })
                    .collect();
                set_layouts.push(d.create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&b),
                    None,
                )?);
            }
            let layout = d.create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts),
                None,
            )?;
            let name = CString::new(entry)?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(&name);
            let info = vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(layout)
                .flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR);
            // A pipeline cache of its own, so that its data (which on NVIDIA's driver holds the
            // compiled machine code, zstd-compressed) is this pipeline's alone.
            let cache = d.create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None)?;
            let pipeline = d
                .create_compute_pipelines(cache, &[info], None)
                .map_err(|(_, e)| e)?[0];
            if let Some(path) = dump {
                std::fs::write(format!("{path}.cache"), d.get_pipeline_cache_data(cache)?)?;
                std::fs::write(
                    format!("{path}.spv"),
                    bytemuck::cast_slice::<u32, u8>(&words),
                )?;
            }
            d.destroy_pipeline_cache(cache, None);
            let mut out = Vec::new();
            let execs = self.stats.get_pipeline_executable_properties(
                &vk::PipelineInfoKHR::default().pipeline(pipeline),
            )?;
            for i in 0..execs.len() as u32 {
                let exec = vk::PipelineExecutableInfoKHR::default()
                    .pipeline(pipeline)
                    .executable_index(i);
                for s in self.stats.get_pipeline_executable_statistics(&exec)? {
                    let v = match s.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => s.value.b32.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                        _ => format!("{:.3}", s.value.f64),
                    };
                    out.push(format!("{}={v}", s.name_as_c_str()?.to_string_lossy()));
                }
            }
            d.destroy_pipeline(pipeline, None);
            d.destroy_pipeline_layout(layout, None);
            for s in set_layouts {
                d.destroy_descriptor_set_layout(s, None);
            }
            d.destroy_shader_module(module, None);
            Ok(out)
        }
    }
}

impl Drop for Vulkan {
    fn drop(&mut self) {
        // SAFETY: nothing created from the device or instance is alive any more.
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

fn run() -> Result<(), Error> {
    let args = parse_args()?;
    let m = models::MODELS
        .iter()
        .find(|m| m.name == args.model)
        .ok_or(format!("unknown model {}\n{USAGE}", args.model))?;
    let (layers, q_heads, kv_heads, head_dim) = (m.layers, m.q_heads, m.kv_heads, m.head_dim);
    let names = if args.codecs.iter().any(|c| c == "all") {
        KvCodecs::all_names()
    } else {
        args.codecs.clone()
    };
    if let Some(dir) = &args.dump {
        std::fs::create_dir_all(dir)?;
    }
    // Each codec's precision resolved as a cache resolves it; shaderFloat16 only where some
    // codec's kernels take f16 products.
    let codecs = names
        .iter()
        .map(|n| KvCodecs::parse(n).map(|c| (n, c, args.precision.resolve(&c))))
        .collect::<Result<Vec<_>, _>>()?;
    let half = codecs.iter().any(|&(_, _, p)| p == kvq::Precision::Fast);
    let vk = Vulkan::new(half, args.matrix.is_some())?;
    println!(
        "{} — {} ctx {} (splits {}, workgroup {}, module {}, precision {}, exact {}+{}{}, matrix {:?})",
        vk.name,
        args.model,
        args.ctx,
        args.splits,
        args.workgroup,
        args.module.name(),
        args.precision.name(),
        args.exact.sink,
        args.exact.recent,
        if args.exact.k_mean { " kmean" } else { "" },
        args.matrix
    );
    for (name, c, precision) in codecs {
        let cfg = KernelConfig {
            kv_heads,
            capacity: args.ctx,
            layers,
            splits: args.splits,
            max_splits: args.splits,
            workgroup: args.workgroup,
            exact: args.exact,
            // (The driver statistics this reads are NVIDIA's: its kernels as the measured
            // NVIDIA GPUs compile them.)
            baked_shape: kvq::tuning::BAKED_ON_NVIDIA,
            precision,
            matrix: args.matrix,
            ..KernelConfig::new(head_dim, q_heads / kv_heads, c.k, c.v)
        };
        // The fused step's split is what a decode step runs (with f16 inputs, as in the
        // sweep); the chunk module's serves several new tokens' rows.
        let src = cfg.module_source(args.module).map_err(|e| e.to_string())?;
        let entries: &[&str] = match args.module {
            KernelModule::Chunk => &["split", "reduce", "prefill"],
            _ => &["split", "reduce"],
        };
        for &entry in entries {
            let dump = args
                .dump
                .as_ref()
                .map(|dir| format!("{dir}/{}-{entry}", name.replace(['=', ',', '+'], "_")));
            let matrix = cfg.matrix.is_some();
            let stats =
                vk.pipeline_stats(&src, entry, cfg.clamps_indices(), matrix, dump.as_deref())?;
            let p = cfg.precision.name();
            println!("{name:<24} {entry:<7} {p:<5} {}", stats.join(", "));
        }
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("kernel_stats: {e}");
        std::process::exit(1);
    }
}
