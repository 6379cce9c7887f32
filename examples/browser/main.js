// The page's logic: checks WebGPU, loads kvq (pkg/, built by build.sh), runs the correctness
// checks and the decode benchmark, and draws the table and the chart. With `?test` in the URL
// (the headless test, test.mjs) it runs the checked codecs with the URL's sizes and posts every
// result to the serving test at /result; `/progress` gets one line per finished piece.

import init, * as kvq from './pkg/kvq_browser.js';

const params = new URLSearchParams(location.search);

// The codecs the test checks against the CPU reference, and those the benchmark offers.
const CHECKED = ['none', 'q8_sym', 'turbo3_sym', 'k_iso3'];
const RECOMMENDED = ['none', 'q8_sym', 'k_q8', 'turbo4_sym', 'turbo3_sym', 'k_iso3'];

const TEST = params.has('test');
const $ = (id) => document.getElementById(id);

function status(text, cls = '') {
  const s = $('status');
  s.textContent = text;
  s.className = cls;
}

async function post(path, body) {
  if (!TEST) return;
  await fetch(path, { method: 'POST', body: JSON.stringify(body) });
}

function progress(line) {
  status(line);
  return post('/progress', { line });
}

// Ends the run with a message on the page (and, under test, a failed result).
async function fail(message, report = {}) {
  status(message, 'error');
  const panic = safePanic();
  await post('/result', { browser: navigator.userAgent, ...report, ok: false, error: message + (panic ? ` (wasm panic: ${panic})` : '') });
}

function safePanic() {
  try { return kvq.last_panic(); } catch { return ''; }
}

const mib = (b) => (b / 1048576).toFixed(b < 10 * 1048576 ? 2 : 1) + ' MiB';

function cell(tr, text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function checkRow(r) {
  const tr = document.createElement('tr');
  cell(tr, r.codec);
  if (r.error) {
    cell(tr, 'error', 'fail');
    cell(tr, r.error).colSpan = 4;
  } else {
    cell(tr, r.ok ? 'pass' : 'FAIL', r.ok ? 'pass' : 'fail');
    cell(tr, r.kernel_err.toExponential(2));
    cell(tr, `${r.rows_equal} equal, ${r.rows_tied} ties of ${r.rows}`, r.rows_equal + r.rows_tied === r.rows ? '' : 'fail');
    cell(tr, r.lengths_ok ? 'ok' : 'wrong', r.lengths_ok ? '' : 'fail');
    cell(tr, (r.ms / 1000).toFixed(1) + ' s');
    if (r.problem) cell(tr, r.problem, 'fail');
  }
  $('checks').tBodies[0].appendChild(tr);
}

function benchTable(rows) {
  const body = $('bench').tBodies[0];
  body.replaceChildren();
  const none = rows.find((r) => r.codec === 'none' && !r.error);
  for (const r of rows) {
    const tr = document.createElement('tr');
    cell(tr, r.codec);
    if (r.error) {
      cell(tr, r.error, 'fail').colSpan = 8;
    } else {
      cell(tr, r.bits_k.toFixed(2));
      cell(tr, r.bits_v.toFixed(2));
      cell(tr, mib(r.kv_bytes));
      cell(tr, mib(r.device_bytes));
      cell(tr, r.ms_per_step.toFixed(2));
      cell(tr, r.tokens_per_s.toFixed(1));
      cell(tr, none ? (r.tokens_per_s / none.tokens_per_s).toFixed(2) + '×' : '');
      cell(tr, String(r.splits));
    }
    body.appendChild(tr);
  }
  chart(rows.filter((r) => !r.error));
}

// Two bar panels side by side: tokens/s and device memory per codec.
function chart(rows) {
  const box = $('chart');
  if (!rows.length) { box.replaceChildren(); return; }
  const NS = 'http://www.w3.org/2000/svg';
  const bar = 22, gap = 8, label = 110, panel = 300, pad = 20;
  const h = pad * 2 + 24 + rows.length * (bar + gap);
  const w = 2 * (label + panel + pad);
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('width', w);
  svg.setAttribute('role', 'img');
  const el = (name, attrs, text) => {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  };
  const panels = [
    { title: 'decode tokens/s (higher is better)', value: (r) => r.tokens_per_s, fmt: (v) => v.toFixed(1), color: '#3b6fb6' },
    { title: 'device memory (MiB)', value: (r) => r.device_bytes / 1048576, fmt: (v) => v.toFixed(1), color: '#c77c2a' },
  ];
  panels.forEach((p, i) => {
    const x0 = i * (label + panel + pad);
    const max = Math.max(...rows.map(p.value)) || 1;
    el('text', { x: x0 + label, y: pad, 'font-size': 13, 'font-weight': 600 }, p.title);
    rows.forEach((r, j) => {
      const y = pad + 14 + j * (bar + gap);
      const v = p.value(r);
      const len = Math.max(1, (v / max) * (panel - 60));
      el('text', { x: x0 + label - 6, y: y + bar * 0.7, 'font-size': 12, 'text-anchor': 'end' }, r.codec);
      el('rect', { x: x0 + label, y, width: len, height: bar, fill: p.color });
      el('text', { x: x0 + label + len + 4, y: y + bar * 0.7, 'font-size': 11 }, p.fmt(v));
    });
  });
  box.replaceChildren(svg);
}

// Per codec: kvq's check against the CPU reference, then (when it passes) the benchmark, on
// one cache (its kernels compile once for both). Fills both tables as results arrive.
async function runCodecs(codecs, layers, context, steps) {
  const results = [];
  $('checks').tBodies[0].replaceChildren();
  for (const codec of codecs) {
    await progress(`${codec}: checking against the CPU reference, then ${steps} decode steps over ${layers} layers at context ${context}…`);
    let r;
    try {
      r = JSON.parse(await kvq.measure(codec, layers, context, steps));
    } catch (e) {
      const error = String(e.message || e) + (safePanic() ? ` (wasm panic: ${safePanic()})` : '');
      r = { codec, check: { ok: false, error }, bench: { error } };
    }
    if (!r.bench) r.bench = { error: 'not run: the check failed' };
    results.push(r);
    checkRow({ codec, ...r.check });
    benchTable(results.map((x) => ({ codec: x.codec, ...x.bench })));
  }
  return results;
}

async function main() {
  const report = { ok: false };
  if (!navigator.gpu) {
    return fail('This browser has no WebGPU (navigator.gpu is missing): kvq needs a browser with ' +
      'WebGPU enabled (recent Chrome, Edge or Safari, Firefox with WebGPU on), served over http://localhost or https.');
  }
  let adapter;
  try {
    adapter = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
  } catch (e) {
    adapter = null;
  }
  if (!adapter) {
    return fail('WebGPU is present but the browser offers no adapter (GPU blocklisted or hardware ' +
      'acceleration off); in Chrome see chrome://gpu.');
  }
  const ai = adapter.info || {};
  report.browser = navigator.userAgent;
  report.adapter = {
    vendor: ai.vendor, architecture: ai.architecture, device: ai.device, description: ai.description,
    fallback: ai.isFallbackAdapter ?? null, features: [...adapter.features].sort(),
  };
  await init();
  let info;
  try {
    info = JSON.parse(await kvq.open());
  } catch (e) {
    const msg = String(e.message || e);
    const weak = msg.includes('below what kvq needs');
    return fail((weak ? 'This adapter is too weak for kvq: ' : 'kvq could not open the adapter: ') + msg, report);
  }
  report.kvq = info;
  $('adapter').textContent = `adapter: ${[ai.vendor, ai.architecture, ai.description].filter(Boolean).join(' / ') || info.name}` +
    ` · ${info.backend} · shader-f16 ${info.f16 ? 'yes' : 'no'} · subgroups ${info.subgroups ? 'yes' : 'no'}` +
    ` · workgroup memory ${info.max_compute_workgroup_storage_size} B · storage binding ${mib(info.max_storage_buffer_binding_size)}`;

  const num = (v, dflt) => Math.max(1, parseInt(v, 10) || dflt);
  const form = $('settings');
  for (const c of RECOMMENDED) {
    const l = document.createElement('label');
    l.innerHTML = `<input type="checkbox" name="codec" value="${c}" checked> ${c}`;
    $('codecs').appendChild(l);
  }
  for (const n of ['context', 'layers', 'steps']) {
    if (params.has(n)) form.elements[n].setAttribute('value', num(params.get(n), form.elements[n].value));
  }
  const settings = () => ({
    codecs: [...form.querySelectorAll('input[name=codec]:checked')].map((i) => i.value),
    layers: num(form.elements.layers.value, 4),
    context: num(form.elements.context.value, 2048),
    steps: num(form.elements.steps.value, 20),
  });
  const s = settings();
  // Under test, exactly the checked codecs; in a browser, every recommended one.
  if (TEST) s.codecs = CHECKED;
  const results = await runCodecs(s.codecs, s.layers, s.context, s.steps);
  report.results = results;
  report.settings = { layers: s.layers, context: s.context, steps: s.steps };
  const failed = results.filter((r) => !r.check.ok || r.bench.error).map((r) => r.codec);
  report.ok = failed.length === 0 && CHECKED.every((c) => results.some((r) => r.codec === c));
  if (failed.length) {
    status(`Failed for ${failed.join(', ')}: see the tables below.`, 'error');
  } else {
    status(`Done: every codec's outputs match the CPU reference on this adapter; benchmark below.`, 'done');
  }
  if (TEST) report.dom = document.documentElement.outerHTML.replace(/<script[^]*?<\/script>/g, '');
  await post('/result', report);

  $('run').disabled = false;
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    $('run').disabled = true;
    const t = settings();
    const r = await runCodecs(t.codecs, t.layers, t.context, t.steps);
    const bad = r.filter((x) => !x.check.ok || x.bench.error).map((x) => x.codec);
    if (bad.length) status(`Failed for ${bad.join(', ')}: see the tables below.`, 'error');
    else status('Done.', 'done');
    $('run').disabled = false;
  });
}

window.addEventListener('error', (e) => fail(`uncaught error: ${e.message}`));
window.addEventListener('unhandledrejection', (e) => fail(`unhandled rejection: ${e.reason && (e.reason.message || e.reason)}`));
main().catch((e) => fail(`the page failed: ${e.message || e}`));
