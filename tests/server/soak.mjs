#!/usr/bin/env node
// Soak run against glm5 serve: N concurrent clients for a while with a hostile mix,
// every completed response compared with the same request served alone, the
// server's anonymous memory (RssAnon) sampled throughout.
//
//   node soak.mjs [--duration 600] [--streams 8] [--threads 1] [--report FILE.json]
//
// It starts `glm5 serve` itself (GLM5_BINARY, GLM5_MODEL; see helpers.mjs) with 4
// slots, a queue of 4 (so some requests get 429), a 1 MiB body limit and a prefix
// cache budget small enough to evict all the time. The mix: completions with
// 1-2k-token prompts sharing prefixes and short ones, chat with and without a JSON
// schema, max_tokens up to 512, streamed or not; random cancellations (the client
// aborts mid-reply), malformed requests (400) and oversized bodies (413).
//
// Passes when every completed response equals its reference, every malformed or
// oversized request got its 4xx, the server logged no error and exited cleanly, and
// (for runs of 5 minutes or more) RssAnon grew less than 1 MiB per minute from
// minute 3 to the end (least-squares slope).
import { readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { metrics, sleep, startServer } from './helpers.mjs';

const { values: opt } = parseArgs({
  options: {
    duration: { type: 'string', default: '600' },
    streams: { type: 'string', default: '8' },
    threads: { type: 'string', default: '1' },
    report: { type: 'string' },
  },
});
const duration = Number(opt.duration) * 1000;
const streams = Number(opt.streams);
const cacheBudget = '6M';

// A small deterministic PRNG (mulberry32), so every run sends the same mix.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const srv = await startServer([
  '--parallel', '4', '--ctx-size', '4096', '--max-queue', '4', '--max-body', '1M',
  '--cache-budget', cacheBudget, '--no-log-requests', '--threads', opt.threads,
]);
const { url, model } = srv;

// The request pool.
const r0 = rng(20261201);
const ids = (n) => Array.from({ length: n }, () => 1 + Math.floor(r0() * 700));
const bases = [ids(1200), ids(1000), ids(1500)];
const pool = [];
for (let i = 0; i < 12; i++) {
  // Long prompts: a shared base and a suffix of its own (1-2k tokens in all).
  const base = bases[i % bases.length];
  const prompt = base.concat(ids(20 + Math.floor(r0() * 400)));
  pool.push({ path: '/v1/completions', body: { model, prompt, max_tokens: [16, 64, 200, 512][i % 4], temperature: i % 3 ? 0.8 : 0, seed: 7 + i } });
}
const topics = ['rivers', 'a lighthouse', 'prime numbers', 'bread', 'the moon', 'chess'];
topics.forEach((t, i) => {
  pool.push({
    path: '/v1/chat/completions',
    body: { model, messages: [{ role: 'user', content: `Tell me about ${t}.` }], max_tokens: [32, 128, 512][i % 3], temperature: 0.7, seed: 40 + i },
  });
  pool.push({
    path: '/v1/chat/completions',
    body: {
      model,
      messages: [{ role: 'system', content: 'Answer in JSON.' }, { role: 'user', content: `Describe ${t}.` }],
      max_tokens: 256,
      temperature: 0.9,
      seed: 60 + i,
      response_format: {
        type: 'json_schema',
        json_schema: { name: 'fact', schema: { type: 'object', properties: { name: { type: 'string' }, count: { type: 'integer' } }, required: ['name', 'count'] } },
      },
    },
  });
});
pool.push({ path: '/v1/completions', body: { model, prompt: 'Once upon a time', max_tokens: 48, temperature: 0 } });
pool.push({ path: '/v1/completions', body: { model, prompt: [5, 6, 7], max_tokens: 8, temperature: 0 } });

// One request: {status, text, finish} (text of every choice's content/reasoning),
// or {status, error} for a refusal. A stream is read to its end; `abortAfter` ms
// cancels it mid-way.
async function send(path, body, { stream = false, abortAfter = 0, raw = null } = {}) {
  const ac = new AbortController();
  const timer = abortAfter ? setTimeout(() => ac.abort(), abortAfter) : null;
  try {
    const payload = raw ?? JSON.stringify(stream ? { ...body, stream: true } : body);
    const res = await fetch(url + path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: payload, signal: ac.signal });
    if (res.status !== 200) {
      const text = await res.text();
      return { status: res.status, error: text, retryAfter: res.headers.get('retry-after') };
    }
    if (!stream) {
      const j = await res.json();
      const c = j.choices[0];
      return { status: 200, text: (c.message ? (c.message.reasoning_content ?? '') + '|' + (c.message.content ?? '') : c.text), finish: c.finish_reason };
    }
    let reasoning = '';
    let content = '';
    let finish = null;
    let buf = '';
    const dec = new TextDecoder();
    for await (const part of res.body) {
      buf += dec.decode(part, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k);
        buf = buf.slice(k + 2);
        if (!ev.startsWith('data: ')) continue;
        const data = ev.slice(6);
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) return { status: 200, error: JSON.stringify(j.error) };
        for (const c of j.choices) {
          if (c.delta) {
            reasoning += c.delta.reasoning_content ?? '';
            content += c.delta.content ?? '';
          } else {
            content += c.text ?? '';
          }
          if (c.finish_reason) finish = c.finish_reason;
        }
      }
    }
    return { status: 200, text: path.includes('chat') ? reasoning + '|' + content : content, finish };
  } catch (e) {
    if (ac.signal.aborted) return { status: 0, aborted: true };
    throw e;
  } finally {
    if (timer) clearTimeout(timer);
  }
}

// RssAnon of the server, every 5 s (absolute times; reported from the start of
// the soak proper, so samples taken while the references run are negative).
const rssAt = [];
const tStart = Date.now();
function sampleRss() {
  try {
    const m = readFileSync(`/proc/${srv.proc.pid}/status`, 'utf8').match(/RssAnon:\s+(\d+) kB/);
    if (m) rssAt.push([Date.now(), Number(m[1])]);
  } catch {}
}
sampleRss();
const rssTimer = setInterval(sampleRss, 5000);

// References: each request served alone.
const reference = [];
for (const r of pool) {
  const got = await send(r.path, r.body);
  if (got.status !== 200 || got.error) throw new Error(`reference request failed: ${got.status} ${got.error}`);
  reference.push(got);
}
const tRefs = (Date.now() - tStart) / 1000;
const t0 = Date.now();

const counts = { served: 0, streamed: 0, cancelled: 0, refused: 0, malformed: 0, oversized: 0, mismatched: 0, errors: 0 };
const problems = [];
const note = (p) => {
  if (problems.length < 20) problems.push(p);
};
const malformed = [
  '{"messages": [{"role": "user", "content": null}]}',
  '{"messages": []}',
  '{"messages": [{"role": "wizard", "content": "hi"}]}',
  '{"messages": [{"role": "tool", "tool_call_id": "x", "content": "hi"}]}',
  '{"prompt": "x", "max_tokens": -3}',
  '{"messages": [{"role": "user", "content": "hi"}',
  'not json at all',
];
const oversized = JSON.stringify({ prompt: 'x'.repeat(1536 * 1024), max_tokens: 1 });

async function worker(w) {
  const r = rng(1000 + w);
  while (Date.now() - t0 < duration) {
    const x = r();
    try {
      if (x < 0.08) {
        const got = await send('/v1/chat/completions', null, { raw: malformed[Math.floor(r() * malformed.length)] });
        if (got.status === 400) counts.malformed++;
        else if (got.status === 429) counts.refused++;
        else {
          counts.errors++;
          note(`malformed request got ${got.status}: ${got.error ?? ''}`);
        }
        continue;
      }
      if (x < 0.11) {
        const got = await send('/v1/completions', null, { raw: oversized });
        if (got.status === 413) counts.oversized++;
        else {
          counts.errors++;
          note(`oversized body got ${got.status}`);
        }
        continue;
      }
      const k = Math.floor(r() * pool.length);
      const stream = r() < 0.5;
      const abortAfter = x < 0.21 ? 20 + Math.floor(r() * 600) : 0;
      const got = await send(pool[k].path, pool[k].body, { stream: stream || abortAfter > 0, abortAfter });
      if (got.aborted) {
        counts.cancelled++;
      } else if (got.status === 429) {
        counts.refused++;
        await sleep(1000 * Number(got.retryAfter ?? 1));
      } else if (got.status !== 200 || got.error) {
        counts.errors++;
        note(`request ${k}: ${got.status} ${got.error}`);
      } else if (got.text !== reference[k].text || got.finish !== reference[k].finish) {
        counts.mismatched++;
        note(`request ${k} (${stream ? 'stream' : 'plain'}) differs from alone: ${JSON.stringify(got.text).slice(0, 120)} vs ${JSON.stringify(reference[k].text).slice(0, 120)}`);
      } else {
        counts.served++;
        if (stream) counts.streamed++;
      }
    } catch (e) {
      counts.errors++;
      note(`worker ${w}: ${e.message}`);
    }
  }
}
await Promise.all(Array.from({ length: streams }, (_, w) => worker(w)));
const secs = (Date.now() - t0) / 1000;
await sleep(500);
sampleRss();
clearInterval(rssTimer);
const m = await metrics(url);
const exit = await srv.stop();
const log = srv.log();
const logErrors = log.split('\n').filter((l) => /error|fail|sanitizer|abort/i.test(l));

// RssAnon slope from minute 3 of the soak (30% of a shorter run) to its end,
// least squares.
const rss = rssAt.map(([t, kb]) => [(t - t0) / 1000, kb]);
const from = Math.min(180, secs * 0.3);
const pts = rss.filter(([t]) => t >= from);
let slope = 0;
if (pts.length >= 2) {
  const n = pts.length;
  const mt = pts.reduce((s, p) => s + p[0], 0) / n;
  const mv = pts.reduce((s, p) => s + p[1], 0) / n;
  const num = pts.reduce((s, p) => s + (p[0] - mt) * (p[1] - mv), 0);
  const den = pts.reduce((s, p) => s + (p[0] - mt) ** 2, 0);
  slope = den > 0 ? (num / den) * 60 / 1024 : 0; // MiB per minute
}
const enforceRss = secs >= 300;

console.log(
  `soak: ${streams} clients for ${secs.toFixed(0)} s (after ${tRefs.toFixed(0)} s of references): ` +
    `${counts.served} served (${counts.streamed} streamed), ${counts.cancelled} cancelled, ${counts.refused} refused (429), ` +
    `${counts.malformed} malformed (400), ${counts.oversized} oversized (413), ${counts.mismatched} mismatched, ${counts.errors} errors`,
);
console.log(
  `soak: server counted ${m.glm5_requests_finished_total} engine requests finished, ${m.glm5_requests_cancelled_total} cancelled, ` +
    `${m.glm5_requests_refused_total} refused; retained ${m.glm5_retained_entries} entries / ${(m.glm5_retained_bytes / 1048576).toFixed(1)} MiB (budget ${cacheBudget})`,
);
console.log(
  `soak: RssAnon ${(rss[0][1] / 1024).toFixed(1)} -> ${(rss[rss.length - 1][1] / 1024).toFixed(1)} MiB; ` +
    `slope from ${from.toFixed(0)} s into the soak: ${slope.toFixed(3)} MiB/min${enforceRss ? ' (limit 1)' : ' (not checked: run shorter than 5 min)'}`,
);
for (const p of problems) console.log(`  ${p}`);
for (const l of logErrors.slice(0, 10)) console.log(`  server log: ${l}`);
if (opt.report)
  writeFileSync(opt.report, JSON.stringify({ streams, seconds: secs, reference_seconds: tRefs, counts, metrics: m, rss_kb: rss, slope_mib_per_min: slope, from }, null, 1));

const ok =
  counts.mismatched === 0 && counts.errors === 0 && counts.served > 0 && counts.cancelled > 0 &&
  counts.malformed > 0 && counts.oversized > 0 && exit === 0 && logErrors.length === 0 &&
  m.glm5_busy_slots === 0 && (!enforceRss || slope < 1);
console.log(ok ? 'PASS' : 'FAIL');
process.exit(ok ? 0 : 1);
