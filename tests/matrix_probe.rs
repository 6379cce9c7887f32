//! The sweep's matrix-unit probe kernels (examples/sweep/matrix_wgsl.rs).
//!
//! Every variant, as written for 16x16 fragments (NVIDIA's Vulkan driver) and 8x8 ones
//! (Apple's simdgroup matrices) on subgroups of 32, is parsed and validated by naga and
//! written to SPIR-V with the options wgpu's Vulkan backend uses (both with and without its
//! bounds checks), which `spirv-val` checks where installed (CI requires it); the 8x8 ones are
//! written to MSL too. No adapter here offers cooperative matrices, so the GEMMs' data flow
//! (staging, two stages, wide tiles, padding, B transposed, the direct kernel) runs on the
//! emulated operations of the same generator, on lavapipe, against a CPU reference.

#[path = "../examples/sweep/matrix_wgsl.rs"]
#[allow(dead_code)]
mod matrix_wgsl;

mod common;

use matrix_wgsl::{Gemm, Kernel, Ops, Shape, Target, source, variants};
use naga::back::{msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};

/// The probe's GEMM shape.
const PROBE: Shape = Shape {
    m: 4096,
    n: 4096,
    k: 4096,
};

/// spirv-val's answer on `words`. SPIRV-Tools before 2023.3 (Debian bookworm's 2023.1, which
/// CI installs) predates SPV_KHR_cooperative_matrix and rejects its capability as unknown:
/// such a module is then reported as not checked by it (naga has validated it), any other
/// rejection fails.
fn spirv_val(words: &[u32], name: &str) {
    if let Ok(dir) = std::env::var("KVQ_MATRIX_SPV_DIR") {
        let file = name.replace([' ', '(', ')'], "");
        std::fs::write(
            format!("{dir}/{file}.spv"),
            bytemuck::cast_slice::<u32, u8>(words),
        )
        .unwrap();
    }
    let Some((ok, said)) = common::spirv_val(words, "vulkan1.3", name) else {
        return;
    };
    // 6022: CooperativeMatrixKHR.
    if !ok && said.contains("Invalid capability operand: 6022") {
        eprintln!("{name}: this spirv-val predates SPV_KHR_cooperative_matrix; not checked by it");
        return;
    }
    assert!(ok, "spirv-val rejects {name}: {said}");
}

/// Parses and validates `src`, writes SPIR-V as wgpu's Vulkan backend would (index clamping
/// and loop bounding with `checks`, neither without), runs spirv-val on it, and, for
/// `msl`, writes MSL. Panics with naga's message on any failure.
fn translate(src: &str, name: &str, checks: bool, msl: bool) {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{name}: {}\n{src}", e.emit_to_string(src)));
    let caps = Capabilities::COOPERATIVE_MATRIX
        | Capabilities::SHADER_FLOAT16
        | Capabilities::SHADER_FLOAT16_IN_FLOAT32
        | Capabilities::SUBGROUP;
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}\n{src}", e.emit_to_string(src)));
    let stage = naga::ShaderStage::Compute;
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((stage, "main")),
        &Default::default(),
    )
    .unwrap_or_else(|e| panic!("{name}: overrides: {e}"));
    let policy = if checks {
        naga::proc::BoundsCheckPolicy::Restrict
    } else {
        naga::proc::BoundsCheckPolicy::Unchecked
    };
    let opts = spv::Options {
        lang_version: (1, 6),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: policy,
            buffer: naga::proc::BoundsCheckPolicy::Unchecked,
            image_load: naga::proc::BoundsCheckPolicy::Unchecked,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: if checks {
            spv::ZeroInitializeWorkgroupMemoryMode::Native
        } else {
            spv::ZeroInitializeWorkgroupMemoryMode::None
        },
        force_loop_bounding: checks,
        ..Default::default()
    };
    let pipe = spv::PipelineOptions {
        shader_stage: stage,
        entry_point: "main".into(),
    };
    let words = spv::write_vec(&module, &info, &opts, Some(&pipe))
        .unwrap_or_else(|e| panic!("{name}: SPIR-V: {e}"));
    spirv_val(&words, name);
    if msl {
        let opts = msl::Options {
            lang_version: (2, 4),
            fake_missing_bindings: true,
            ..Default::default()
        };
        let pipe = msl::PipelineOptions {
            entry_point: Some((stage, "main".into())),
            ..Default::default()
        };
        msl::write_string(&module, &info, &opts, &pipe)
            .unwrap_or_else(|e| panic!("{name}: MSL: {e}"));
    }
}

#[test]
fn every_probe_variant_translates() {
    let mut checked = 0;
    for frag in [16, 8] {
        let t = Target {
            frag,
            subgroup: 32,
            ops: Ops::Native,
        };
        for v in variants() {
            let name = format!("{} ({frag}x{frag})", v.name());
            let src = source(&v.kernel, &t, &PROBE).unwrap_or_else(|e| panic!("{name}: {e}"));
            // naga writes MSL for 8x8 cooperative matrices only (Apple's simdgroup matrices).
            translate(&src, &name, v.checks, frag == 8);
            checked += 1;
        }
    }
    eprintln!("{checked} probe kernels translated");
}

/// The emulated GEMMs that the tests below run: small blocks of every staging form.
fn emulated_gemms() -> Vec<Gemm> {
    let g = |bm, bn, bk, wm, wn, stages, prefetch, wide, pad, bt| Gemm {
        bm,
        bn,
        bk,
        wm,
        wn,
        stages,
        prefetch,
        wide,
        pad,
        bt,
        direct: false,
    };
    vec![
        g(16, 16, 8, 1, 1, 1, false, false, 0, false),
        g(32, 16, 16, 2, 1, 1, true, false, 8, false),
        g(16, 32, 16, 1, 2, 2, true, false, 8, false),
        g(32, 32, 16, 2, 2, 2, true, true, 8, false),
        g(32, 32, 16, 2, 2, 2, true, true, 0, true),
        g(32, 16, 32, 2, 1, 1, true, true, 8, true),
        Gemm {
            direct: true,
            prefetch: true,
            ..g(32, 32, 0, 2, 2, 1, true, false, 0, false)
        },
        Gemm {
            direct: true,
            prefetch: false,
            bt: true,
            ..g(16, 32, 0, 1, 2, 1, false, false, 0, false)
        },
    ]
}

/// Small values exactly representable in f16 (no zeros).
fn f16_values(rng: &mut common::Rng, n: usize) -> Vec<half::f16> {
    (0..n)
        .map(|_| {
            let v = ((rng.next_u64() % 61) as f32 - 30.0) / 16.0;
            half::f16::from_f32(if v == 0.0 { 0.0625 } else { v })
        })
        .collect()
}

/// Runs one emulated GEMM on the test adapter and returns C (poisoned with NaN first).
fn run_gemm(g: &Gemm, t: &Target, s: &Shape, a: &[half::f16], b: &[half::f16]) -> Vec<f32> {
    use wgpu::util::DeviceExt;
    let ctx = common::ctx();
    let dev = &ctx.device;
    let src = source(&Kernel::Gemm(*g), t, s).expect("emulated kernel");
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("matrix probe (emulated)"),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("matrix probe (emulated)"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let init = |contents: &[u8], usage| {
        dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents,
            usage,
        })
    };
    let storage = wgpu::BufferUsages::STORAGE;
    let ab = init(bytemuck::cast_slice(a), storage);
    let bb = init(bytemuck::cast_slice(b), storage);
    let poison = vec![f32::NAN; (s.m * s.n) as usize];
    let cb = init(
        bytemuck::cast_slice(&poison),
        storage | wgpu::BufferUsages::COPY_SRC,
    );
    let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipe.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: ab.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: bb.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: cb.as_entire_binding(),
            },
        ],
    });
    let mut enc = dev.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipe);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(s.n / g.bn, s.m / g.bm, 1);
    }
    ctx.queue.submit([enc.finish()]);
    common::read_f32(ctx, &cb, (s.m * s.n) as usize)
}

/// The emulated GEMMs against an f64 reference on odd-valued inputs, with B stored as the
/// kernel reads it (k × n, or n × k where transposed). Several blocks along M and N and
/// several K steps, so every tile index and stage switch is exercised. Two tests, each half
/// of the GEMMs, so that the harness's threads compile them at once (on lavapipe, minutes).
#[test]
fn even_emulated_gemms_match_the_reference() {
    emulated_gemms_match_the_reference(0);
}

/// The odd-numbered emulated GEMMs (see the even ones).
#[test]
fn odd_emulated_gemms_match_the_reference() {
    emulated_gemms_match_the_reference(1);
}

/// GEMM `i` of [`emulated_gemms`] for every `i` of parity `half`, each on data of its own seed.
fn emulated_gemms_match_the_reference(half: usize) {
    let t = Target {
        frag: 8,
        subgroup: 1,
        ops: Ops::Emulated,
    };
    for (i, g) in emulated_gemms().into_iter().enumerate() {
        if i % 2 != half {
            continue;
        }
        let mut rng = common::Rng::new(51 + i as u64);
        let s = Shape {
            m: 2 * g.bm,
            n: 3 * g.bn,
            k: 64,
        };
        let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
        let a = f16_values(&mut rng, m * k);
        let b = f16_values(&mut rng, k * n);
        // B as stored: k x n row major, or its transpose.
        let stored: Vec<half::f16> = if g.bt {
            (0..n * k).map(|i| b[(i % k) * n + i / k]).collect()
        } else {
            b.clone()
        };
        let c = run_gemm(&g, &t, &s, &a, &stored);
        let mut worst = 0f64;
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|q| a[i * k + q].to_f64() * b[q * n + j].to_f64())
                    .sum();
                let got = c[i * n + j] as f64;
                assert!(
                    got.is_finite(),
                    "{}: C[{i}][{j}] not written ({got})",
                    g.name()
                );
                worst = worst.max((got - want).abs() / want.abs().max(1.0));
            }
        }
        // f16 products are exact in f32; the sums of 64 of them round at most a few ulps.
        assert!(worst < 1e-5, "{}: worst error {worst:e}", g.name());
        eprintln!("{}: worst error {worst:e}", g.name());
    }
}
