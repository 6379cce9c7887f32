// The browser test: serves this folder on 127.0.0.1, opens the page in headless Chromium with
// WebGPU on (`?test`), and waits for the page to post its result: kvq's outputs for `none`,
// `q8_sym`, `turbo3_sym` and `k_iso3` checked against the CPU reference compiled into the same
// wasm, and the decode benchmark. Exits non-zero on any failed check, on a page without
// WebGPU or without an adapter, on a page error, and when no result comes within the timeout:
// it never skips. Needs `bash build.sh` first (pkg/), and Node.js only (no npm package).
//
//   node test.mjs [--timeout SECONDS] [--context N] [--layers N] [--steps N] [--json FILE]
//                 [--html FILE]
//
// --json writes the page's whole report; --html the page as it ended (tables and chart, no
// script), to look at.
// CHROMIUM names the browser (default /usr/bin/chromium).

import { createServer } from 'node:http';
import { readFile, writeFile, mkdtemp, rm, readdir } from 'node:fs/promises';
import { join, extname, normalize, dirname } from 'node:path';
import { tmpdir } from 'node:os';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
// The codecs whose check must pass: the test, not the page, decides what is required.
const REQUIRED = ['none', 'q8_sym', 'turbo3_sym', 'k_iso3'];

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : dflt;
};
const timeoutS = Number(opt('timeout', 300));
const sizes = { context: opt('context', '512'), layers: opt('layers', '2'), steps: opt('steps', '5') };
const jsonOut = opt('json', null);
const htmlOut = opt('html', null);
const chromium = process.env.CHROMIUM || '/usr/bin/chromium';

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.wasm': 'application/wasm',
  '.css': 'text/css',
  '.json': 'application/json',
};

// CPU time (user + system, with reaped children) of the processes in Chromium's process
// group, from /proc (Linux; null elsewhere): what the test costs a CI machine.
async function chromiumCpuSeconds(pgid) {
  try {
    let ticks = 0;
    for (const pid of await readdir('/proc')) {
      if (!/^\d+$/.test(pid)) continue;
      let stat;
      try { stat = await readFile(`/proc/${pid}/stat`, 'utf8'); } catch { continue; }
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      // After the command: state ppid pgrp session ... utime(14) stime(15) cutime(16) cstime(17).
      if (Number(f[2]) !== pgid) continue;
      ticks += Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
    }
    return ticks / 100; // USER_HZ
  } catch {
    return null;
  }
}

let finish;
const outcome = new Promise((resolve) => { finish = resolve; });
const t0 = Date.now();
const elapsed = () => ((Date.now() - t0) / 1000).toFixed(1).padStart(6) + ' s';

const server = createServer(async (req, res) => {
  try {
    if (req.method === 'POST') {
      let body = '';
      for await (const chunk of req) body += chunk;
      res.writeHead(204).end();
      const msg = JSON.parse(body || '{}');
      if (req.url === '/progress') console.log(`${elapsed()}  ${msg.line}`);
      else if (req.url === '/result') finish({ result: msg });
      return;
    }
    const path = normalize(decodeURIComponent(new URL(req.url, 'http://x').pathname)).replace(/^(\.\.[/\\])+/, '');
    const file = join(HERE, path === '/' ? 'index.html' : path);
    if (!file.startsWith(HERE + '/')) { res.writeHead(403).end(); return; }
    const data = await readFile(file);
    res.writeHead(200, { 'content-type': TYPES[extname(file)] || 'application/octet-stream', 'cache-control': 'no-store' });
    res.end(data);
  } catch (e) {
    res.writeHead(e.code === 'ENOENT' ? 404 : 500).end(String(e));
    if (req.url.startsWith('/pkg/')) finish({ error: `the page's wasm is missing (${req.url}): run build.sh first` });
  }
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const { port } = server.address();
const url = `http://127.0.0.1:${port}/index.html?test&context=${sizes.context}&layers=${sizes.layers}&steps=${sizes.steps}`;

const profile = await mkdtemp(join(tmpdir(), 'kvq-chromium-'));
const flags = [
  '--headless=new',
  '--no-sandbox', // CI runs as root, where Chromium's sandbox cannot start
  '--enable-unsafe-webgpu', // WebGPU on Linux (SwiftShader's without a GPU)
  // This machine's closed network refuses Chromium's own connections: ask for none.
  '--disable-quic', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--disable-default-apps',
  `--user-data-dir=${profile}`,
  url,
];
console.log(`${elapsed()}  serving ${HERE} on 127.0.0.1:${port}; ${chromium} ${flags.slice(0, 3).join(' ')} …`);
let log = '';
const browser = spawn(chromium, flags, { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
for (const s of [browser.stdout, browser.stderr]) s.on('data', (d) => { log = (log + d).slice(-20000); });
browser.on('error', (e) => finish({ error: `cannot start ${chromium}: ${e.message}` }));
browser.on('exit', (code, sig) => finish({ error: `Chromium exited (${code ?? sig}) before the page reported` }));
const timer = setTimeout(() => finish({ error: `no result from the page within ${timeoutS} s` }), timeoutS * 1000);

const { result, error } = await outcome;
clearTimeout(timer);
browser.removeAllListeners('exit');
const cpu = await chromiumCpuSeconds(browser.pid);
// Chromium and its helper processes (its own process group), politely first so that it
// reaps its helpers, then for good.
const exited = new Promise((r) => browser.once('exit', r));
try { process.kill(-browser.pid, 'SIGTERM'); } catch { /* already gone */ }
await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
try { process.kill(-browser.pid, 'SIGKILL'); } catch { /* already gone */ }
server.close();
await rm(profile, { recursive: true, force: true });

if (cpu !== null) console.log(`Chromium's processes used ${cpu.toFixed(1)} s of CPU`);
const problems = [];
if (error) problems.push(error);
if (result) {
  if (result.error) problems.push(result.error);
  const a = result.adapter || {};
  console.log(`browser: ${result.browser || '?'}`);
  console.log(`adapter: ${[a.vendor, a.architecture, a.description].filter(Boolean).join(' / ') || '?'}` +
    `${a.fallback ? ' (fallback)' : ''}; kvq: ${JSON.stringify(result.kvq || {})}`);
  const results = result.results || [];
  for (const { codec, check: c } of results) {
    console.log(`check ${codec.padEnd(11)} ${c.ok ? 'pass' : 'FAIL'}` + (c.error ? `  ${c.error}` :
      `  attention err ${c.kernel_err.toExponential(2)}, rows: ${c.rows_equal} equal, ${c.rows_tied} ties ` +
      `of ${c.rows}, lengths ${c.lengths_ok ? 'ok' : 'WRONG'}` + (c.problem ? `  ${c.problem}` : '')));
  }
  const s = result.settings || {};
  if (results.length) console.log(`decode benchmark: ${s.layers} layers, context ${s.context}, ${s.steps} steps (llama3-8b attention shape)`);
  if (results.length) console.log('codec        bits K  bits V  K/V store MiB  device MiB  ms/step  tokens/s  vs none  build s');
  const none = results.find((r) => r.codec === 'none' && !r.bench.error);
  for (const { codec, bench: r } of results) {
    if (r.error) { console.log(`${codec.padEnd(11)}  ${r.error}`); continue; }
    console.log(`${codec.padEnd(11)} ${r.bits_k.toFixed(2).padStart(7)} ${r.bits_v.toFixed(2).padStart(7)}` +
      ` ${(r.kv_bytes / 1048576).toFixed(2).padStart(14)} ${(r.device_bytes / 1048576).toFixed(2).padStart(11)}` +
      ` ${r.ms_per_step.toFixed(2).padStart(8)} ${r.tokens_per_s.toFixed(1).padStart(9)}` +
      ` ${none ? (r.tokens_per_s / none.bench.tokens_per_s).toFixed(2).padStart(7) + '×' : '        '}` +
      ` ${(r.build_ms / 1000).toFixed(1).padStart(8)}`);
  }
  for (const codec of REQUIRED) {
    const r = results.find((x) => x.codec === codec);
    if (!r) problems.push(`no result for ${codec}`);
    else if (!r.check.ok) problems.push(`${codec}: ${r.check.error || r.check.problem || 'check failed'}`);
    else if (r.bench.error) problems.push(`${codec} benchmark: ${r.bench.error}`);
  }
  if (htmlOut && result.dom) await writeFile(htmlOut, result.dom);
  delete result.dom;
  if (jsonOut) await writeFile(jsonOut, JSON.stringify(result, null, 2));
}
if (problems.length) {
  console.error(`\nbrowser test FAILED (${elapsed().trim()}):\n  ` + problems.join('\n  '));
  if (!result) console.error(`Chromium's last output:\n${log.slice(-3000)}`);
  process.exit(1);
}
console.log(`browser test passed (${elapsed().trim()})`);
