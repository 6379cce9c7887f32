//! Experiment (not part of kvq): how much read bandwidth a grid shaped like the split kernel's
//! reaches with L 16-byte loads in flight per thread. 36 dispatches (layers) per pass, each
//! `grid` workgroups of `wg` threads reading `per_wg` bytes contiguous per workgroup.
use std::time::Duration;

fn kernel(l: u32, wg: u32, per: u32, barrier: bool) -> String {
    let mut loads = String::new();
    for i in 0..l {
        loads += &format!("        let a{i} = src[base + i + {i}u * WG];\n");
    }
    for i in 0..l {
        loads += &format!("        acc += a{i};\n");
    }
    if barrier {
        loads += "        workgroupBarrier();\n";
    }
    format!(
        "const WG: u32 = {wg}u;\nconst L: u32 = {l}u;\nconst PER: u32 = {per}u;\n\
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;\n\
@group(0) @binding(1) var<storage, read_write> sink: array<vec4<u32>>;\n\
@compute @workgroup_size(WG)\n\
fn stream(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
    let base = wid.x * PER;\n\
    var acc = vec4<u32>(0u);\n\
    for (var i = lid; i < PER; i += WG * L) {{\n{loads}    }}\n\
    if all(acc == vec4<u32>(1u, 2u, 3u, 4u)) {{ sink[lid] = acc; }}\n}}\n"
    )
}

fn main() {
    let inst = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(inst.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))
    .expect("adapter");
    let al = adapter.limits();
    let (dev, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: wgpu::Features::TIMESTAMP_QUERY,
        required_limits: wgpu::Limits {
            max_storage_buffer_binding_size: al.max_storage_buffer_binding_size,
            max_buffer_size: al.max_buffer_size,
            ..Default::default()
        },
        ..Default::default()
    }))
    .expect("device");
    println!("{:?}", adapter.get_info().name);
    let layers = 36u64;
    let regions = 7u64;
    let per_bytes: u64 = std::env::var("PER_KB").map(|v| v.parse::<u64>().unwrap()).unwrap_or(256) * 1024;
    let max_grid = 1040u64;
    let region = max_grid * per_bytes;
    let src = dev.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: region * regions,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let sink = dev.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 1 << 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let qset = dev.create_query_set(&wgpu::QuerySetDescriptor {
        label: None,
        ty: wgpu::QueryType::Timestamp,
        count: 2,
    });
    let qbuf = dev.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let rb = dev.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let period = queue.get_timestamp_period() as f64;
    println!("l wg grid barrier per_kb gbps");
    for &barrier in &[false, true] {
        for &grid in &[264u32, 520, 1040] {
            for &l in &[1u32, 2, 4, 8, 16] {
                let wg = 128u32;
                let per = (per_bytes / 16) as u32;
                let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: None,
                    source: wgpu::ShaderSource::Wgsl(kernel(l, wg, per, barrier).into()),
                });
                let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: None,
                    layout: None,
                    module: &module,
                    entry_point: Some("stream"),
                    compilation_options: Default::default(),
                    cache: None,
                });
                let bgl = pipe.get_bind_group_layout(0);
                let bytes = grid as u64 * per_bytes;
                let binds: Vec<_> = (0..regions)
                    .map(|r| {
                        dev.create_bind_group(&wgpu::BindGroupDescriptor {
                            label: None,
                            layout: &bgl,
                            entries: &[
                                wgpu::BindGroupEntry {
                                    binding: 0,
                                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                        buffer: &src,
                                        offset: r * region,
                                        size: std::num::NonZeroU64::new(bytes),
                                    }),
                                },
                                wgpu::BindGroupEntry {
                                    binding: 1,
                                    resource: sink.as_entire_binding(),
                                },
                            ],
                        })
                    })
                    .collect();
                let mut times = Vec::new();
                for rep in 0..25 {
                    let mut enc = dev.create_command_encoder(&Default::default());
                    {
                        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: None,
                            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                                query_set: &qset,
                                beginning_of_pass_write_index: Some(0),
                                end_of_pass_write_index: Some(1),
                            }),
                        });
                        pass.set_pipeline(&pipe);
                        for layer in 0..layers {
                            pass.set_bind_group(0, &binds[(layer % regions) as usize], &[]);
                            pass.dispatch_workgroups(grid, 1, 1);
                        }
                    }
                    enc.resolve_query_set(&qset, 0..2, &qbuf, 0);
                    enc.copy_buffer_to_buffer(&qbuf, 0, &rb, 0, 16);
                    queue.submit([enc.finish()]);
                    rb.slice(..).map_async(wgpu::MapMode::Read, |_| {});
                    dev.poll(wgpu::PollType::wait_indefinitely()).unwrap();
                    let t: Vec<u64> = bytemuck::cast_slice(&rb.get_mapped_range(..).unwrap()).to_vec();
                    rb.unmap();
                    if rep >= 5 {
                        times.push((t[1] - t[0]) as f64 * period * 1e-9);
                    }
                }
                times.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let t = times[times.len() / 2];
                println!(
                    "{l} {wg} {grid} {barrier} {} {:.0}",
                    per_bytes / 1024,
                    (layers * bytes) as f64 / t / 1e9
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}
