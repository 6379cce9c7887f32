//! kvq::export: every exported kernel variant is valid WGSL whose bindings match the layouts
//! handed to hosts, replay plans are well formed JSON, and a plan replayed natively through
//! plain wgpu (no kvq code) reproduces the expected outputs — so neither the exporter nor the
//! plans can rot without `cargo test` noticing. (web/replay.mjs replays the same plans in Dawn.)

mod common;
#[path = "../examples/shared/scenarios.rs"]
mod scenarios;

use std::collections::HashMap;

use kvq::export::{self, BindingKind, Expected, KernelModule, ReplayPlan, StepPath, Target};
use kvq::{Codec, InputType, KernelConfig, KvCodecs, KvqError};
use naga::valid::{Capabilities, ValidationFlags, Validator};

fn configs() -> Vec<KernelConfig> {
    let codecs = scenarios::harness_codecs();
    let mut v = Vec::new();
    for (i, &k) in codecs.iter().enumerate() {
        // Each codec as K with itself and with the next codec as V (V without QJL).
        let next = codecs[(i + 1) % codecs.len()];
        for (j, vc) in [k.with_qjl(false), next.with_qjl(false)]
            .into_iter()
            .enumerate()
        {
            let (d, g) = [(64u32, 1u32), (128, 4), (96, 2), (256, 8)][(i + 2 * j) % 4];
            v.push(KernelConfig {
                kv_heads: 2,
                batch: 2,
                capacity: 300,
                layers: 2,
                splits: 3,
                max_splits: 3,
                segments: 2,
                ..KernelConfig::new(d, g, k, vc)
            });
        }
    }
    v
}

fn kind_of(space: naga::AddressSpace) -> Option<BindingKind> {
    match space {
        naga::AddressSpace::Uniform => Some(BindingKind::Uniform),
        naga::AddressSpace::Storage { access } => {
            if access.contains(naga::StorageAccess::STORE) {
                Some(BindingKind::Storage)
            } else {
                Some(BindingKind::ReadOnlyStorage)
            }
        }
        _ => None,
    }
}

#[test]
fn every_exported_kernel_parses_and_matches_its_layouts() {
    let mut checked = 0;
    for cfg in configs() {
        for target in [Target::Native, Target::Browser] {
            let kernels = export::export_kernels(&cfg, target).expect("export");
            assert_eq!(kernels.len(), KernelModule::all().len());
            for k in kernels {
                let name = format!(
                    "{} {:?} K {} V {} d={} g={}",
                    k.module.name(),
                    target,
                    cfg.k.name(),
                    cfg.v.name(),
                    cfg.head_dim,
                    cfg.gqa
                );
                assert_eq!(
                    k.wgsl,
                    export::kernel_wgsl(&cfg, k.module, target).unwrap(),
                    "{name}"
                );
                let module = naga::front::wgsl::parse_str(&k.wgsl)
                    .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&k.wgsl)));
                Validator::new(
                    ValidationFlags::all(),
                    Capabilities::SHADER_FLOAT16_IN_FLOAT32,
                )
                .validate(&module)
                .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&k.wgsl)));
                if target == Target::Browser {
                    assert!(!k.wgsl.contains("subgroup"), "{name} uses subgroups");
                }
                // Entry points: exactly those listed.
                let mut eps: Vec<&str> = module
                    .entry_points
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect();
                let mut listed: Vec<&str> = k.entry_points.iter().map(|e| e.entry).collect();
                eps.sort();
                listed.sort();
                assert_eq!(eps, listed, "{name}: entry points");
                // Every binding the module declares is in the handed-out layout, same type.
                for (_, var) in module.global_variables.iter() {
                    let Some(rb) = &var.binding else { continue };
                    let layout = &k.bind_group_layouts[rb.group as usize];
                    let entry = layout
                        .entries
                        .iter()
                        .find(|e| e.binding == rb.binding)
                        .unwrap_or_else(|| {
                            panic!(
                                "{name}: @group({}) @binding({}) not in the layout",
                                rb.group, rb.binding
                            )
                        });
                    assert_eq!(
                        Some(entry.kind),
                        kind_of(var.space),
                        "{name}: @group({}) @binding({}) ({})",
                        rb.group,
                        rb.binding,
                        entry.role
                    );
                }
                checked += 1;
            }
        }
    }
    eprintln!("{checked} exported modules parsed and validated");
    assert!(checked >= 2 * 5 * 2 * scenarios::harness_codecs().len());
}

#[test]
fn export_refuses_what_it_cannot_serve_with_typed_errors() {
    let mut cfg = configs().remove(0);
    cfg.k = Codec::turbo(3);
    if !kvq::kernels::gpu_supported(cfg.k) {
        assert!(matches!(
            export::export_kernels(&cfg, Target::Browser),
            Err(KvqError::InvalidSpec(_))
        ));
    }
    let mut cfg = configs().remove(0);
    cfg.head_dim = 40;
    assert!(export::export_kernels(&cfg, Target::Native).is_err());
    let mut cfg = configs().remove(0);
    cfg.gqa = 0;
    assert!(export::kernel_wgsl(&cfg, KernelModule::Decode, Target::Browser).is_err());
    let mut sc = scenarios::scenarios().remove(0);
    sc.prefill = sc.spec.capacity;
    assert!(export::replay_plan(common::ctx(), &sc, Target::Browser).is_err());
}

#[test]
fn scenarios_cover_every_gpu_codec_both_paths_and_the_shapes() {
    let sc = scenarios::scenarios();
    let harness = scenarios::harness_codecs();
    for c in &harness {
        assert!(sc.iter().any(|s| s.spec.codecs.k == *c), "K {}", c.name());
        if !c.qjl {
            assert!(sc.iter().any(|s| s.spec.codecs.v == *c), "V {}", c.name());
        }
    }
    // The harness covers every family at every bit width, both scale modes, and QJL.
    for c in export::gpu_codecs() {
        assert!(
            harness.iter().any(|h| h.kind == c.kind && h.bits == c.bits),
            "{}",
            c.name()
        );
        assert!(
            harness
                .iter()
                .any(|h| h.kind == c.kind && h.scale == c.scale)
        );
        assert!(harness.iter().any(|h| h.kind == c.kind && h.qjl == c.qjl));
    }
    // Chunks: over an int V, a ring and a QJL K.
    let chunks: Vec<_> = sc.iter().filter(|s| s.path == StepPath::Chunk).collect();
    assert!(chunks.iter().any(|s| s.spec.window.is_some()));
    assert!(chunks.iter().any(|s| s.spec.codecs.k.qjl));
    assert!(chunks.iter().any(|s| s.spec.prefill_from.is_some()));
    assert!(
        chunks
            .iter()
            .any(|s| s.spec.prefill_from.is_some() && s.spec.codecs.k.qjl)
    );
    for path in [StepPath::Separate, StepPath::Fused] {
        for t in [InputType::F32, InputType::F16] {
            assert!(sc.iter().any(|s| s.path == path && s.step_input == t));
            assert!(sc.iter().any(|s| s.prefill_input == t));
        }
    }
    for d in [64, 128] {
        for g in [1, 4] {
            assert!(
                sc.iter().any(|s| s.spec.head_dim == d && s.spec.gqa() == g),
                "d={d} g={g}"
            );
        }
    }
    // Exact tokens on every path, K's mean removed on the append and the fused step's.
    for path in [StepPath::Separate, StepPath::Fused, StepPath::Chunk] {
        assert!(sc.iter().any(|s| s.path == path && s.spec.exact.any()));
    }
    for path in [StepPath::Separate, StepPath::Fused] {
        assert!(sc.iter().any(|s| s.path == path && s.spec.exact.k_mean));
    }
    let names: std::collections::HashSet<_> = sc.iter().map(|s| &s.name).collect();
    assert_eq!(names.len(), sc.len(), "scenario names are unique");
    assert!(
        sc.iter()
            .any(|s| (s.prefill + s.steps) % 32 != 0 && s.prefill > 64)
    );
}

/// Replays a plan through plain wgpu, the way web/replay.mjs does in Dawn.
fn replay_natively(plan: &ReplayPlan) -> Vec<Vec<u8>> {
    let ctx = common::ctx();
    let dev = &ctx.device;
    let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
    let modules: Vec<_> = plan
        .modules
        .iter()
        .map(|m| {
            dev.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&m.name),
                source: wgpu::ShaderSource::Wgsl(m.wgsl.as_str().into()),
            })
        })
        .collect();
    let layouts: Vec<_> = plan
        .layouts
        .iter()
        .map(|l| {
            let entries: Vec<_> = l
                .entries
                .iter()
                .map(|e| wgpu::BindGroupLayoutEntry {
                    binding: e.binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: match e.kind {
                            BindingKind::Uniform => wgpu::BufferBindingType::Uniform,
                            BindingKind::Storage => {
                                wgpu::BufferBindingType::Storage { read_only: false }
                            }
                            BindingKind::ReadOnlyStorage => {
                                wgpu::BufferBindingType::Storage { read_only: true }
                            }
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                })
                .collect();
            dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(l.label),
                entries: &entries,
            })
        })
        .collect();
    let pipelines: Vec<_> = plan
        .pipelines
        .iter()
        .map(|p| {
            let layout = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&layouts[p.layouts[0]]), Some(&layouts[p.layouts[1]])],
                immediate_size: 0,
            });
            dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(p.entry_point),
                layout: Some(&layout),
                module: &modules[p.module],
                entry_point: Some(p.entry_point),
                compilation_options: Default::default(),
                cache: None,
            })
        })
        .collect();
    let buffers: Vec<_> = plan
        .buffers
        .iter()
        .map(|b| {
            let buf = dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&b.name),
                size: b.size,
                usage: b.usage | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            if let Some(init) = &b.init {
                ctx.queue.write_buffer(&buf, 0, init);
            }
            buf
        })
        .collect();
    let groups: Vec<_> = plan
        .bind_groups
        .iter()
        .map(|g| {
            let entries: Vec<_> = g
                .buffers
                .iter()
                .enumerate()
                .map(|(i, &b)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: buffers[b].as_entire_binding(),
                })
                .collect();
            dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &layouts[g.layout],
                entries: &entries,
            })
        })
        .collect();
    let mut enc = dev.create_command_encoder(&Default::default());
    for p in &plan.passes {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&p.label),
            timestamp_writes: None,
        });
        for d in &p.dispatches {
            pass.set_pipeline(&pipelines[d.pipeline]);
            pass.set_bind_group(0, &groups[d.bind_groups[0]], &[]);
            pass.set_bind_group(1, &groups[d.bind_groups[1]], &[]);
            let [x, y, z] = d.workgroups;
            pass.dispatch_workgroups(x, y, z);
        }
    }
    ctx.queue.submit([enc.finish()]);
    assert!(
        pollster::block_on(scope.pop()).is_none(),
        "validation error"
    );
    plan.checks
        .iter()
        .map(|c| {
            let f = common::read_f32(
                ctx,
                &buffers[c.buffer],
                (plan.buffers[c.buffer].size / 4) as usize,
            );
            bytemuck::cast_slice(&f).to_vec()
        })
        .collect()
}

#[test]
fn replay_plans_are_well_formed_and_reproduce_the_reference_natively() {
    let all = scenarios::scenarios();
    // One plan per path, with quantized K and V and several storage segments among them.
    let picks: Vec<_> = [
        all.iter()
            .find(|s| s.path == StepPath::Separate && s.spec.codecs.k != Codec::NONE),
        all.iter().find(|s| {
            s.path == StepPath::Fused
                && s.spec.codecs != KvCodecs::NONE
                && s.spec.segment_tokens.is_some()
        }),
    ]
    .into_iter()
    .map(|s| s.expect("scenario").clone())
    .collect();
    for sc in picks {
        replay_and_check(&sc);
    }
}

#[test]
fn a_replay_plan_of_a_layer_with_a_window_of_its_own_reproduces_the_reference() {
    // Layer 0 keeps a ring of 64 slots (window 40, slack 24) in two segments of 32 beside a
    // global layer of 160 in five: the plan binds layer 0's params, whose ring and split slots
    // are its own, and its fused steps wrap the ring the prefill has wrapped already.
    let mut spec = kvq::CacheSpec::new(2, 8, 2, 64, 160)
        .with_codecs(KvCodecs::parse("q8_sym").unwrap())
        .with_batch(2)
        .with_splits(3)
        .with_precision(kvq::Precision::Exact)
        .with_layer_windows(vec![Some(40), None])
        .with_window_slack(24);
    spec.segment_tokens = Some(32);
    assert_eq!((spec.layer_capacity(0), spec.layer_capacity(1)), (64, 160));
    let sc = export::Scenario {
        name: "q8-layer-window".into(),
        spec,
        layer: 0,
        prefill: 101,
        prefill_input: InputType::F32,
        steps: 5,
        step_input: InputType::F16,
        path: StepPath::Fused,
        seed: 77,
    };
    replay_and_check(&sc);
}

/// Builds `sc`'s replay plan, checks that it is well formed, replays it natively and holds
/// every check to its expected values.
fn replay_and_check(sc: &export::Scenario) {
    let plan = export::replay_plan(common::ctx(), sc, Target::Browser).expect("plan");
    // The JSON parses and its indices point at what exists.
    let json: serde_json::Value = serde_json::from_str(&plan.to_json()).expect("plan JSON parses");
    assert_eq!(json["format"], "kvq-replay-plan/1");
    let n = |k: &str| json[k].as_array().map_or(0, |a| a.len());
    assert_eq!(n("modules"), KernelModule::all().len());
    assert_eq!(n("buffers"), plan.buffers.len());
    for p in &plan.pipelines {
        assert!(p.module < plan.modules.len());
        assert!(p.layouts.iter().all(|&l| l < plan.layouts.len()));
    }
    for g in &plan.bind_groups {
        assert_eq!(g.buffers.len(), plan.layouts[g.layout].entries.len());
        assert!(g.buffers.iter().all(|&b| b < plan.buffers.len()));
    }
    for b in &plan.buffers {
        assert_eq!(b.size % 4, 0);
        assert!(b.init.as_ref().is_none_or(|x| x.len() as u64 == b.size));
    }
    let dispatches: usize = plan.passes.iter().map(|p| p.dispatches.len()).sum();
    assert!(dispatches > 2 * sc.steps as usize, "{}", sc.name);
    assert_eq!(plan.checks.len(), sc.steps as usize + 1);

    let got = replay_natively(&plan);
    for (c, bytes) in plan.checks.iter().zip(got) {
        match &c.expected {
            Expected::F32 {
                values,
                chunk,
                tolerance,
            } => {
                let f: &[f32] = bytemuck::cast_slice(&bytes);
                for (g, w) in f[..values.len()].chunks(*chunk).zip(values.chunks(*chunk)) {
                    let e = common::rel_err(g, w);
                    assert!(e <= *tolerance, "{} {}: rel err {e:e}", sc.name, c.label);
                }
            }
            Expected::U32(want) => {
                let u: &[u32] = bytemuck::cast_slice(&bytes);
                assert_eq!(&u[..want.len()], &want[..], "{} {}", sc.name, c.label);
            }
        }
    }
}

/// The grid a manifest's `grid` terms give for a plan's `grid_shape` and one dispatch's
/// `wide_groups`, `queries`, `query_groups`, `row_tiles` and `splits`: the manifest read as a host would read it, not kvq's own
/// rule code.
fn grid_from_manifest(
    terms: &serde_json::Value,
    shape: &serde_json::Value,
    d: &serde_json::Value,
) -> Vec<u64> {
    let per_dispatch = |k: &str| d[k].as_u64().unwrap_or_else(|| panic!("dispatch.{k}"));
    let v = |k: &str| {
        shape[k]
            .as_u64()
            .unwrap_or_else(|| panic!("grid_shape.{k}"))
    };
    terms
        .as_array()
        .expect("grid terms")
        .iter()
        .map(|t| match t.as_str().expect("a grid term is a string") {
            "1" => 1,
            "batch" => v("batch"),
            "q_heads" => v("q_heads"),
            "kv_heads * batch" => v("kv_heads") * v("batch"),
            "kv_heads * batch * row_groups" => v("kv_heads") * v("batch") * v("row_groups"),
            "splits + 1 + exact" => per_dispatch("splits") + 1 + v("exact"),
            "wide_groups" => per_dispatch("wide_groups"),
            "queries" => per_dispatch("queries"),
            "query_groups" => per_dispatch("query_groups"),
            "row_tiles" => per_dispatch("row_tiles"),
            other => panic!("a grid term no host knows: {other}"),
        })
        .collect()
}

#[test]
fn every_recorded_dispatch_follows_the_manifests_grid_rule() {
    // Entry point -> grid terms, from the manifest the export_wgsl example writes.
    let cfg = &configs()[0];
    let kernels = export::export_kernels(cfg, Target::Browser).expect("export");
    let manifest: serde_json::Value =
        serde_json::from_str(&export::kernels_json(&kernels, |k| k.module.name())).unwrap();
    // (module, entry point) -> grid: `split` has one rule in the decode and step modules and
    // another in the chunk module.
    let mut rules = HashMap::new();
    for m in manifest.as_array().unwrap() {
        let module = m["module"].as_str().unwrap().to_string();
        for e in m["entry_points"].as_array().unwrap() {
            let entry = e["name"].as_str().unwrap().to_string();
            rules.insert((module.clone(), entry), e["grid"].clone());
        }
    }
    let mut checked = 0;
    // Dispatches whose split count is a chunk slice's own, not the plan's.
    let mut own_splits = 0;
    for sc in scenarios::scenarios() {
        let plan = export::replay_plan(common::ctx(), &sc, Target::Browser).expect("plan");
        let json: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
        let shape = &json["grid_shape"];
        for pass in json["passes"].as_array().unwrap() {
            for d in pass["dispatches"].as_array().unwrap() {
                let p = d["pipeline"].as_u64().unwrap() as usize;
                let pipe = &json["pipelines"][p];
                let entry = pipe["entry_point"].as_str().unwrap();
                let module = json["modules"][pipe["module"].as_u64().unwrap() as usize]["name"]
                    .as_str()
                    .unwrap();
                let rule = rules
                    .get(&(module.to_string(), entry.to_string()))
                    .unwrap_or_else(|| panic!("{}: {module}/{entry} not in the manifest", sc.name));
                let want = grid_from_manifest(rule, shape, d);
                let got: Vec<u64> = d["workgroups"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap())
                    .collect();
                assert_eq!(got, want, "{} {}: {entry}", sc.name, pass["label"]);
                checked += 1;
                let splits = d["splits"].as_u64().expect("dispatch.splits");
                own_splits += (splits != shape["splits"].as_u64().unwrap()) as u32;
            }
        }
    }
    eprintln!("{checked} recorded dispatches follow the manifest's rules");
    assert!(checked > 0);
    assert!(
        own_splits > 0,
        "no chunk slice took a split count of its own"
    );
}

#[test]
fn base64_matches_the_standard_alphabet() {
    let cases: HashMap<&[u8], &str> = [
        (&b""[..], ""),
        (b"f", "Zg=="),
        (b"fo", "Zm8="),
        (b"foo", "Zm9v"),
        (b"foobar", "Zm9vYmFy"),
        (&[0xff, 0xfe, 0x00][..], "//4A"),
    ]
    .into_iter()
    .collect();
    for (input, want) in cases {
        assert_eq!(export::base64(input), want);
    }
}
