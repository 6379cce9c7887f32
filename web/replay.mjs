// Replays kvq's exported plans in Dawn (Chrome's WebGPU implementation, through the npm
// package `webgpu`) and checks the results.
//
//   node replay.mjs DIR            (DIR written by `cargo run --example export_wgsl -- DIR`)
//
// The harness knows nothing about kvq: every plan lists its buffers (with initial bytes), WGSL
// modules, bind group layouts, pipelines, bind groups, compute passes and dispatches, and the
// buffers to read back with the values kvq's CPU reference expects. Each dispatch's grid comes
// from its entry point's rule in the manifest, as another host would compute it; a recorded
// grid that differs fails the scenario. New codecs and kernels
// arrive as new plans. A scenario fails on any Tint error or warning (printed with
// module:line:column), any WebGPU validation error, or any check outside its tolerance; the
// exit status is non-zero when any scenario failed.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { availableParallelism } from 'node:os';
import { create, globals } from 'webgpu';

Object.assign(globalThis, globals);

const dir = process.argv[2];
if (!dir) {
  console.error('usage: node replay.mjs DIR');
  process.exit(2);
}
const verbose = process.argv.includes('--verbose');

function bytes(b64) {
  // A fresh copy: Buffer.from may return a view into a shared pool at an unaligned offset.
  return new Uint8Array(Buffer.from(b64, 'base64'));
}

async function getAdapter(gpu) {
  // lavapipe is a CPU ("fallback") adapter: ask plainly first, then allow the fallback.
  for (const opts of [undefined, { forceFallbackAdapter: true }]) {
    const a = await gpu.requestAdapter(opts);
    if (a) return a;
  }
  return null;
}

function usageOf(names) {
  let u = 0;
  for (const n of names) {
    if (!(n in GPUBufferUsage)) throw new Error(`unknown buffer usage ${n}`);
    u |= GPUBufferUsage[n];
  }
  return u;
}

// Compiles every module and returns the Tint messages that fail the run (errors, warnings).
async function compileModules(device, plan, modules, problems) {
  let infos = 0;
  for (const m of plan.modules) {
    const module = device.createShaderModule({ label: m.name, code: m.wgsl });
    const info = await module.getCompilationInfo();
    const lines = m.wgsl.split('\n');
    for (const msg of info.messages) {
      const where = `${m.name}.wgsl:${msg.lineNum}:${msg.linePos}`;
      if (msg.type === 'info') {
        infos++;
        if (verbose) console.log(`  tint info ${where}: ${msg.message}`);
        continue;
      }
      problems.push(`tint ${msg.type} ${where}: ${msg.message}\n      | ${lines[msg.lineNum - 1] ?? ''}`);
    }
    modules.push(module);
  }
  return infos;
}

function compare(check, got) {
  if (check.kind === 'u32_exact') {
    const want = new Uint32Array(bytes(check.expected_u32).buffer);
    const g = new Uint32Array(got);
    for (let i = 0; i < check.count; i++) {
      if (g[i] !== want[i]) return { ok: false, err: Infinity, note: `word ${i}: got ${g[i]}, want ${want[i]}` };
    }
    return { ok: true, err: 0 };
  }
  if (check.kind === 'f32_rel_err') {
    const want = new Float64Array(bytes(check.expected_f64).buffer);
    const g = new Float32Array(got);
    let worst = 0;
    for (let c0 = 0; c0 < check.count; c0 += check.chunk) {
      let scale = 1e-30;
      let diff = 0;
      for (let i = c0; i < c0 + check.chunk; i++) {
        scale = Math.max(scale, Math.abs(want[i]));
        const d = Math.abs(g[i] - want[i]);
        if (!(d <= Infinity)) return { ok: false, err: NaN, note: `value ${i} is ${g[i]}` };
        diff = Math.max(diff, d);
      }
      worst = Math.max(worst, diff / scale);
    }
    return { ok: worst <= check.tolerance, err: worst };
  }
  return { ok: false, err: NaN, note: `unknown check kind ${check.kind}` };
}

// One grid term of the manifest (an entry point's `grid`), over the plan's grid_shape and a
// dispatch's wide_groups, queries, query_groups, row_tiles and splits (a chunk slice's own).
function termValue(term, shape, d) {
  switch (term) {
    case '1': return 1;
    case 'batch': return shape.batch;
    case 'q_heads': return shape.q_heads;
    case 'kv_heads * batch': return shape.kv_heads * shape.batch;
    case 'kv_heads * batch * row_groups': return shape.kv_heads * shape.batch * shape.row_groups;
    case 'splits + 1 + exact': return d.splits + 1 + shape.exact;
    case 'wide_groups': return d.wide_groups;
    case 'queries': return d.queries;
    case 'query_groups': return d.query_groups;
    case 'row_tiles': return d.row_tiles;
    default: throw new Error(`a grid term this harness does not know: ${term}`);
  }
}

// module name -> entry point -> grid terms, from the manifest's entry for this plan.
function gridRules(scenario) {
  const rules = {};
  for (const k of scenario.kernels) {
    rules[k.module] = Object.fromEntries(k.entry_points.map((e) => [e.name, e.grid]));
  }
  return rules;
}

async function runPlan(adapter, plan, rules) {
  const problems = [];
  const requiredLimits = {};
  for (const [name, need] of Object.entries(plan.limits)) {
    const have = adapter.limits[name];
    if (have === undefined) {
      problems.push(`unknown limit ${name}`);
    } else if (have < need) {
      problems.push(`adapter limit ${name} = ${have} < ${need} needed`);
    } else {
      requiredLimits[name] = need;
    }
  }
  for (const f of plan.features) {
    if (!adapter.features.has(f)) problems.push(`adapter lacks feature ${f}`);
  }
  if (problems.length) return { problems, infos: 0, dispatches: 0, results: [] };
  // (Limits below the WebGPU defaults are allowed: the device gets the defaults.)
  const device = await adapter.requestDevice({ requiredFeatures: plan.features, requiredLimits });
  device.addEventListener('uncapturederror', (e) => problems.push(`uncaptured: ${e.error.message}`));
  device.pushErrorScope('validation');
  device.pushErrorScope('out-of-memory');

  const modules = [];
  const infos = await compileModules(device, plan, modules, problems);
  const layouts = plan.layouts.map((l) =>
    device.createBindGroupLayout({
      label: l.label,
      entries: l.entries.map((e) => ({
        binding: e.binding,
        visibility: GPUShaderStage.COMPUTE,
        buffer: { type: e.type },
      })),
    }),
  );
  const pipelines = plan.pipelines.map((p) =>
    device.createComputePipeline({
      label: `${plan.modules[p.module].name}/${p.entry_point}`,
      layout: device.createPipelineLayout({ bindGroupLayouts: p.layouts.map((i) => layouts[i]) }),
      compute: { module: modules[p.module], entryPoint: p.entry_point },
    }),
  );
  const buffers = plan.buffers.map((b) => {
    const buf = device.createBuffer({
      label: b.name,
      size: b.size,
      usage: usageOf(b.usage) | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
      mappedAtCreation: b.init !== null,
    });
    if (b.init !== null) {
      new Uint8Array(buf.getMappedRange()).set(bytes(b.init));
      buf.unmap();
    }
    return buf;
  });
  const groups = plan.bind_groups.map((g) =>
    device.createBindGroup({
      layout: layouts[g.layout],
      entries: g.buffers.map((bi, binding) => ({ binding, resource: { buffer: buffers[bi] } })),
    }),
  );

  const enc = device.createCommandEncoder();
  let dispatches = 0;
  for (const p of plan.passes) {
    const pass = enc.beginComputePass({ label: p.label });
    for (const d of p.dispatches) {
      // Dispatched by the manifest's rule, as another host would; kvq's recorded grid must
      // be the same.
      const pl = plan.pipelines[d.pipeline];
      const terms = rules[plan.modules[pl.module].name]?.[pl.entry_point];
      if (!terms) throw new Error(`no grid rule for ${plan.modules[pl.module].name}/${pl.entry_point}`);
      const grid = terms.map((t) => termValue(t, plan.grid_shape, d));
      if (grid.join() !== d.workgroups.join()) {
        problems.push(`${pl.entry_point}: the manifest's rule gives [${grid}], kvq recorded [${d.workgroups}]`);
      }
      pass.setPipeline(pipelines[d.pipeline]);
      pass.setBindGroup(0, groups[d.bind_groups[0]]);
      pass.setBindGroup(1, groups[d.bind_groups[1]]);
      pass.dispatchWorkgroups(...grid);
      dispatches++;
    }
    pass.end();
  }
  const readbacks = plan.checks.map((c) => {
    const size = plan.buffers[c.buffer].size;
    const rb = device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    enc.copyBufferToBuffer(buffers[c.buffer], 0, rb, 0, size);
    return rb;
  });
  device.queue.submit([enc.finish()]);
  const results = [];
  for (const [i, c] of plan.checks.entries()) {
    await readbacks[i].mapAsync(GPUMapMode.READ);
    const got = readbacks[i].getMappedRange().slice(0);
    readbacks[i].unmap();
    results.push({ label: c.label, ...compare(c, got) });
  }
  for (const scope of ['out-of-memory', 'validation']) {
    const e = await device.popErrorScope();
    if (e) problems.push(`${scope} error: ${e.message}`);
  }
  device.destroy();
  return { problems, infos, dispatches, results };
}

async function main() {
  const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
  const gpu = create([]);
  const adapter = await getAdapter(gpu);
  if (!adapter) {
    console.error('no WebGPU adapter from Dawn (on a machine without a GPU install lavapipe: mesa-vulkan-drivers from bookworm-backports)');
    process.exit(1);
  }
  const ai = adapter.info;
  console.log(`Dawn adapter: ${ai.description || ai.device} (vendor ${ai.vendor}, ${ai.architecture}, fallback: ${ai.isFallbackAdapter})`);
  console.log(`plans: ${manifest.scenarios.length} (target ${manifest.target}, exported on ${manifest.adapter})\n`);

  // Plans run a few at a time, each on a device of its own: a CPU driver (lavapipe) compiles
  // a kernel when it is first dispatched, on its device's one queue, so one device at a time
  // would compile on one core. The table keeps the manifest's order.
  const jobs = Number(process.env.KVQ_REPLAY_JOBS) || availableParallelism();
  const rows = new Array(manifest.scenarios.length);
  const notes = new Array(manifest.scenarios.length);
  let failed = 0;
  let next = 0;
  async function worker() {
    while (next < manifest.scenarios.length) {
      const i = next++;
      const s = manifest.scenarios[i];
      const plan = JSON.parse(readFileSync(join(dir, s.plan), 'utf8'));
      if (plan.format !== 'kvq-replay-plan/1') throw new Error(`${s.plan}: unknown format ${plan.format}`);
      const t0 = performance.now();
      let r;
      try {
        // A WebGPU adapter creates one device; each plan gets a fresh device.
        const a = await getAdapter(gpu);
        if (!a) throw new Error('the adapter went away');
        r = await runPlan(a, plan, gridRules(s));
      } catch (e) {
        r = { problems: [`exception: ${e.stack || e}`], infos: 0, dispatches: 0, results: [] };
      }
      const ms = performance.now() - t0;
      const bad = r.results.filter((x) => !x.ok);
      const ok = r.problems.length === 0 && bad.length === 0 && r.results.length === plan.checks.length;
      if (!ok) failed++;
      const worst = r.results.filter((x) => x.err !== 0).reduce((m, x) => (Number.isNaN(x.err) || x.err > m ? x.err : m), 0);
      rows[i] = [
        s.name,
        `${plan.modules.length}`,
        `${r.dispatches}`,
        `${r.results.length - bad.length}/${plan.checks.length}`,
        Number.isNaN(worst) ? 'NaN' : worst.toExponential(2),
        `${(ms / 1000).toFixed(1)}s`,
        ok ? 'ok' : 'FAIL',
      ];
      notes[i] = [
        ...r.problems.map((p) => `${s.name}: ${p}`),
        ...bad.map((x) => `${s.name}: ${x.label}: rel err ${x.err}${x.note ? ` (${x.note})` : ''}`),
      ];
      console.log(`${s.name}: ${ok ? 'ok' : 'FAIL'} (${(ms / 1000).toFixed(1)} s)`);
    }
  }
  await Promise.all(Array.from({ length: jobs }, worker));
  for (const n of notes) for (const line of n) console.log(line);
  const head = ['scenario', 'modules', 'dispatches', 'checks', 'max rel err', 'time', 'result'];
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (r) => r.map((c, i) => (i === 0 ? c.padEnd(w[i]) : c.padStart(w[i]))).join('  ');
  console.log(line(head));
  console.log(w.map((n) => '-'.repeat(n)).join('  '));
  for (const r of rows) console.log(line(r));
  console.log('\nok: every module compiled by Tint with no error or warning, no WebGPU validation error,');
  console.log("outputs within each check's tolerance (max relative error vs kvq's f64 reference), lengths exact");
  console.log(`${rows.length - failed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
