//! Embedding kvq the way an inference engine does: the engine owns the wgpu device, its own
//! buffers and its own command encoder; kvq records into them.
//!
//! `cargo run --release --example embed` — runs a short greedy-looking decode loop on a tiny
//! model shape and prints, per step, the sequence length and how many bytes kvq moved between
//! host and GPU (always 0 inside the loop); then a second turn's prompt over the cache and a
//! speculative verify of 4 drafted tokens, of which 2 are kept (`truncate`).

use kvq::{CacheSpec, GpuContext, InputType, KvCache, KvCodecs};
use wgpu::util::DeviceExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. The engine's own device, asked with what kvq needs on top of the engine's needs.
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))?;
    let (features, limits) = GpuContext::device_requirements(&adapter)?;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("engine"),
        required_features: features,
        required_limits: limits,
        ..Default::default()
    }))?;
    let ctx = GpuContext::from_device(device.clone(), queue.clone(), adapter.get_info());
    println!("device: {} ({:?})", ctx.info.name, ctx.info.backend);

    // 2. A cache for a small model: 4 layers, 8 query heads over 2 KV heads, head_dim 64,
    //    K in q8 and V in f16, room for 256 tokens.
    let (layers, q_heads, kv_heads, d) = (4u32, 8u32, 2u32, 64u32);
    let spec =
        CacheSpec::new(layers, q_heads, kv_heads, d, 256).with_codecs(KvCodecs::parse("k_q8")?);
    let mut cache = KvCache::new(&ctx, spec)?;

    // 3. The engine's activations: per layer, the new token's K and V (f16) as its projection
    //    kernels would leave them, and the query; one output buffer the next kernel would read.
    let mut seed = 1u32;
    let mut rand = || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    let half = |n: u32, r: &mut dyn FnMut() -> f32| -> Vec<u16> {
        (0..n).map(|_| half::f16::from_f32(r()).to_bits()).collect()
    };
    let storage = |bytes: &[u8]| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        })
    };
    let q: Vec<f32> = (0..q_heads * d).map(|_| rand()).collect();
    let q_buf = storage(bytemuck::cast_slice(&q));
    let out_buf = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("attention out"),
        size: (q_heads * d * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    // Prompt: 32 tokens at once (prefill), then bind each layer's per-token buffers once.
    let prompt = 32u32;
    for layer in 0..layers {
        let k = storage(bytemuck::cast_slice(&half(
            prompt * kv_heads * d,
            &mut rand,
        )));
        let v = storage(bytemuck::cast_slice(&half(
            prompt * kv_heads * d,
            &mut rand,
        )));
        let input = cache.append_input(&k, &v, prompt, InputType::F16)?;
        let mut enc = device.create_command_encoder(&Default::default());
        cache.append(&mut enc, layer, &input)?;
        queue.submit([enc.finish()]);
    }
    let steps: Vec<_> = (0..layers)
        .map(|_| {
            let k = storage(bytemuck::cast_slice(&half(kv_heads * d, &mut rand)));
            let v = storage(bytemuck::cast_slice(&half(kv_heads * d, &mut rand)));
            cache.step_io(&k, &v, 1, InputType::F16, &q_buf, &out_buf)
        })
        .collect::<Result<_, _>>()?;

    // 4. The decode loop: the engine's encoder, one pass, kvq's step for every layer.
    for step in 0..8 {
        let before = ctx.stats();
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            // (the engine's own kernels for this layer would be recorded here too)
            for layer in 0..layers {
                cache.step_in_pass(&mut pass, layer, &steps[layer as usize])?;
            }
        }
        queue.submit([enc.finish()]);
        let moved = ctx.stats() - before;
        println!(
            "step {step}: length {} tokens, kvq host bytes {} up / {} down, {} dispatches",
            cache.len(0, 0)?,
            moved.bytes_uploaded,
            moved.bytes_downloaded,
            moved.dispatches
        );
    }

    // 5. A second turn: its prompt of 12 tokens attends the cached history and, causally,
    //    itself (one chunk per layer), then 4 drafted tokens are verified in one chunk and
    //    the 2 accepted kept. Queries and outputs are [batch, n, q_heads, head_dim].
    for (what, n, keep) in [("second prompt", 12u32, 12u32), ("verify 4 drafts", 4, 2)] {
        let qn = (n * q_heads * d) as usize;
        let q: Vec<f32> = (0..qn).map(|_| rand()).collect();
        let q_buf = storage(bytemuck::cast_slice(&q));
        let out_buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("chunk out"),
            size: qn as u64 * 4,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let before_len = cache.len(0, 0)?;
        let mut enc = device.create_command_encoder(&Default::default());
        let mut ios = Vec::new();
        for _ in 0..layers {
            let k = storage(bytemuck::cast_slice(&half(n * kv_heads * d, &mut rand)));
            let v = storage(bytemuck::cast_slice(&half(n * kv_heads * d, &mut rand)));
            ios.push(cache.chunk_io(&k, &v, n, InputType::F16, &q_buf, &out_buf)?);
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for (layer, io) in ios.iter().enumerate() {
                cache.chunk_in_pass(&mut pass, layer as u32, io)?;
            }
        }
        queue.submit([enc.finish()]);
        // The engine samples from the outputs here; the drafts it rejects are cut back.
        cache.truncate(0, before_len + keep)?;
        println!("{what}: length {} tokens", cache.len(0, 0)?);
    }
    device.poll(wgpu::PollType::wait_indefinitely())?;
    Ok(())
}
