//! Every WGSL kernel, as kvq generates it for a spread of shapes, is parsed and validated by
//! naga and written to MSL (2.4), HLSL (SM 6.0) and SPIR-V (1.3); `spirv-val` checks the
//! SPIR-V when installed (CI sets KVQ_REQUIRE_SPIRV_VAL=1 so a missing spirv-val fails).

mod common;

use kvq::{Codec, KernelConfig};
use naga::back::{hlsl, msl, spv};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};

fn configs() -> Vec<KernelConfig> {
    let mut v = Vec::new();
    let pairs: Vec<(Codec, Codec)> = [
        "none",
        "q8_sym",
        "k=q4,v=none",
        "turbo3_sym",
        "k=rotor3b,v=iso4",
        "k=iso3+qjl,v=turbo2",
        "k=rotor4+qjl,v=rotor3b",
        "k=turbo4b+qjl,v=q4",
    ]
    .iter()
    .map(|n| {
        let c = kvq::KvCodecs::parse(n).unwrap();
        (c.k, c.v)
    })
    .collect();
    let shapes = [
        (64u32, 1u32),
        (96, 2),
        (128, 4),
        (256, 8),
        (128, 8),
        (64, 8),
    ];
    for (i, &(k, vc)) in pairs.iter().enumerate() {
        for (d, g) in [shapes[i % shapes.len()], shapes[(i + 3) % shapes.len()]] {
            v.push(KernelConfig {
                // Every third configuration is a sliding window (ring indexing).
                window: (i % 3 == 1).then_some(3000),
                // Every third of the others keeps exact tokens (sink and ring).
                exact: if i % 3 == 2 {
                    kvq::ExactTokens {
                        sink: 4,
                        recent: 28,
                        k_mean: i % 2 == 0,
                    }
                } else {
                    Default::default()
                },
                // Half with the shape numbers baked (the measured NVIDIA GPUs' kernels),
                // half reading them from uniforms (every other adapter's).
                baked_shape: if i % 2 == 0 {
                    kvq::tuning::BAKED_ON_NVIDIA
                } else {
                    &[]
                },
                // Every other one with f16 products (the f16 prefill kernel).
                precision: match i % 2 {
                    0 => kvq::Precision::Exact,
                    _ => kvq::Precision::Fast,
                },
                ..config(d, g, k, vc)
            });
        }
    }
    // Today's models' shapes: GQA groups past one split workgroup's 8 heads (row groups, the
    // last one short at 71), head sizes that are no multiple of 32 (zero-padded prefill
    // rows), each with a softcap and sink logits.
    for (codecs, d, g, exact) in [
        ("none", 80, 16, false),
        ("k=iso3,v=iso3", 40, 12, true),
        ("q8_sym", 128, 71, false),
        ("k=rotor3,v=none", 72, 6, false),
    ] {
        let c = kvq::KvCodecs::parse(codecs).unwrap();
        v.push(KernelConfig {
            softcap: Some(30.0),
            sinks: true,
            exact: match exact {
                true => kvq::ExactTokens {
                    sink: 4,
                    recent: 28,
                    k_mean: false,
                },
                false => Default::default(),
            },
            ..config(d, g, c.k, c.v)
        });
    }
    v
}

/// A configuration at head_dim `d`, GQA `g`, for K codec `k` and V codec `v`: 2 sequences of
/// 4096 tokens, 3 layers, 16 splits, 2 storage segments, no window, no exact tokens, exact
/// products, every shape number a uniform, no matrix units (the tests vary these).
fn config(d: u32, g: u32, k: Codec, v: Codec) -> KernelConfig {
    KernelConfig {
        kv_heads: 8 / g.min(8),
        batch: 2,
        layers: 3,
        splits: 16,
        max_splits: 16,
        segments: 2,
        ..KernelConfig::new(d, g, k, v)
    }
}

/// `src` parsed and validated by naga with `caps`, or a panic with naga's message.
fn validate(src: &str, name: &str, caps: Capabilities) -> (naga::Module, ModuleInfo) {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
    (module, info)
}

/// The module as its compute entry point `entry` sees it (overrides processed).
fn for_entry(module: &naga::Module, info: &ModuleInfo, entry: &str) -> (naga::Module, ModuleInfo) {
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        module,
        info,
        Some((naga::ShaderStage::Compute, entry)),
        &Default::default(),
    )
    .unwrap_or_else(|e| panic!("{entry}: overrides: {e}"));
    (module.into_owned(), info.into_owned())
}

/// MSL 2.4 of compute entry point `entry`, or a panic naming `name`.
fn write_msl(module: &naga::Module, info: &ModuleInfo, entry: &str, name: &str) {
    let opts = msl::Options {
        lang_version: (2, 4),
        fake_missing_bindings: true,
        ..Default::default()
    };
    let pipe = msl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, entry.into())),
        ..Default::default()
    };
    msl::write_string(module, info, &opts, &pipe)
        .unwrap_or_else(|e| panic!("{name}/{entry}: MSL: {e}"));
}

/// SPIR-V of version `lang` of compute entry point `entry`, or a panic naming `name`.
fn write_spirv(
    module: &naga::Module,
    info: &ModuleInfo,
    entry: &str,
    name: &str,
    lang: (u8, u8),
) -> Vec<u32> {
    let opts = spv::Options {
        lang_version: lang,
        ..Default::default()
    };
    let pipe = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.into(),
    };
    spv::write_vec(module, info, &opts, Some(&pipe))
        .unwrap_or_else(|e| panic!("{name}/{entry}: SPIR-V: {e}"))
}

fn spirv_val(words: &[u32], name: &str) {
    if let Some((ok, said)) = common::spirv_val(words, "vulkan1.1", name) {
        assert!(ok, "spirv-val rejects {name}: {said}");
    }
}

#[test]
fn every_kernel_translates_to_every_backend() {
    let mut checked = 0;
    for cfg in configs() {
        for (name, src) in cfg.sources().expect("kvq assembles its kernels") {
            let name = format!("{name} (d={}, g={})", cfg.head_dim, cfg.gqa);
            // unpack2x16float needs SHADER_FLOAT16_IN_FLOAT32, which WebGPU core and every wgpu
            // backend grant; f16 products need shader-f16 (SHADER_FLOAT16, HLSL's SM 6.2).
            let fast = cfg.precision == kvq::Precision::Fast;
            let mut caps = Capabilities::SHADER_FLOAT16_IN_FLOAT32;
            caps.set(Capabilities::SHADER_FLOAT16, fast);
            let (module, info) = validate(&src, &name, caps);
            for ep in &module.entry_points {
                let (module, info) = for_entry(&module, &info, &ep.name);
                write_msl(&module, &info, &ep.name, &name);
                let hlsl_opts = hlsl::Options {
                    shader_model: match fast {
                        true => hlsl::ShaderModel::V6_2,
                        false => hlsl::ShaderModel::V6_0,
                    },
                    fake_missing_bindings: true,
                    ..Default::default()
                };
                let hlsl_pipe = hlsl::PipelineOptions {
                    entry_point: Some((ep.stage, ep.name.clone())),
                };
                let mut out = String::new();
                hlsl::Writer::new(&mut out, &hlsl_opts, &hlsl_pipe)
                    .write(&module, &info, None)
                    .unwrap_or_else(|e| panic!("{name}/{}: HLSL: {e}", ep.name));
                let words = write_spirv(&module, &info, &ep.name, &name, (1, 3));
                spirv_val(&words, &format!("{name}/{}", ep.name));
                checked += 1;
            }
        }
    }
    eprintln!("{checked} entry points translated");
    assert!(checked >= 6 * 9);
}

/// No kernel may assume a subgroup size, and none uses subgroup operations yet: the portable
/// path is the only path (browsers cannot request subgroups through wgpu).
#[test]
fn kernels_use_no_subgroup_builtins() {
    for cfg in configs() {
        for (name, src) in cfg.sources().expect("kvq assembles its kernels") {
            assert!(
                !src.contains("subgroup"),
                "{name} uses subgroup operations without a fallback"
            );
        }
    }
}

/// The chunk module with the prefill kernel on matrix units, as kvq assembles it for hardware
/// fragments of 16 (NVIDIA) and 8 (Apple), two row fragments a workgroup and one, and emulated:
/// naga validates it (cooperative matrices, subgroups, f16), writes SPIR-V 1.6 (checked by
/// spirv-val where it knows SPV_KHR_cooperative_matrix), and MSL for the 8×8 fragments, the
/// only ones naga writes to Metal (simdgroup matrices). The emulated kernels go to every backend.
#[test]
fn matrix_kernels_translate() {
    let mut checked = 0;
    for codecs in [
        "none",
        "q4_sym",
        "turbo3_sym",
        "k_turbo3+qjl",
        "k=rotor3b,v=iso4",
    ] {
        let c = kvq::KvCodecs::parse(codecs).unwrap();
        for (fragment, rows, emulated) in [
            (16, 32, false),
            (16, 16, false),
            (8, 16, false),
            (8, 8, false),
            (16, 32, true),
        ] {
            let d = if codecs == "none" { 64 } else { 128 };
            let cfg = KernelConfig {
                // NVIDIA's kernels with its shape numbers baked (constants named as WGSL
                // names nothing else), the others reading them from uniforms.
                baked_shape: match fragment {
                    16 => kvq::tuning::BAKED_ON_NVIDIA,
                    _ => &[],
                },
                precision: kvq::Precision::Fast,
                matrix: Some(kvq::MatrixUnits {
                    fragment,
                    emulated,
                    rows,
                }),
                ..config(d, 4, c.k, c.v)
            };
            let name = format!("chunk {codecs} d={d} F={fragment} rows={rows} emulated={emulated}");
            let src = cfg
                .module_source(kvq::KernelModule::Chunk)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(src.contains("coopMultiplyAdd"), !emulated, "{name}");
            let caps = Capabilities::COOPERATIVE_MATRIX
                | Capabilities::SUBGROUP
                | Capabilities::SHADER_FLOAT16
                | Capabilities::SHADER_FLOAT16_IN_FLOAT32;
            let (module, info) = validate(&src, &name, caps);
            let (module, info) = for_entry(&module, &info, "prefill");
            let words = write_spirv(&module, &info, "prefill", &name, (1, 6));
            if let Some((ok, said)) = common::spirv_val(&words, "vulkan1.3", &name) {
                // 6022: CooperativeMatrixKHR, unknown to a spirv-val older than it.
                let unknown = said.contains("Invalid capability operand: 6022");
                assert!(ok || unknown, "spirv-val rejects {name}: {said}");
            }
            if fragment == 8 || emulated {
                write_msl(&module, &info, "prefill", &name);
            }
            checked += 1;
        }
    }
    eprintln!("{checked} matrix prefill kernels translated");
}
