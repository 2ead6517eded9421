#!/usr/bin/env node
// Bounded load run against glm5 serve: N clients for a while, every response checked
// complete and equal to the same request served alone.
//
//   node load.mjs [--duration 60] [--streams 8] [--url http://host:port] [--parallel N]
//
// Without --url it starts `glm5 serve` itself (GLM5_BINARY, GLM5_MODEL; see helpers.mjs)
// with --parallel (default: --streams / 2, so requests also queue). The requests are a
// fixed set of chat and completion requests, greedy or seeded, with and without
// reasoning, streamed or not; each is first served alone to get its reference reply.
// Exits 1 on any mismatch, error or incomplete response.
import OpenAI from 'openai';
import { parseArgs } from 'node:util';
import { collectChat, collectCompletion, metrics, startServer } from './helpers.mjs';

const { values: opt } = parseArgs({
  options: {
    duration: { type: 'string', default: '60' },
    streams: { type: 'string', default: '8' },
    url: { type: 'string' },
    parallel: { type: 'string' },
  },
});
const duration = Number(opt.duration) * 1000;
const streams = Number(opt.streams);

let srv = null;
let client;
let model;
let url = opt.url;
if (url) {
  client = new OpenAI({ baseURL: `${url}/v1`, apiKey: process.env.GLM5_API_KEY ?? 'unused', maxRetries: 0 });
  model = (await client.models.list()).data[0].id;
} else {
  const parallel = opt.parallel ?? String(Math.max(1, Math.floor(streams / 2)));
  srv = await startServer(['--parallel', parallel, '--ctx-size', '2048', '--no-log-requests']);
  ({ client, model, url } = srv);
}

const topics = ['rivers', 'a lighthouse', 'prime numbers', 'bread', 'the moon', 'chess', 'volcanoes', 'jazz'];
const requests = [];
topics.forEach((t, i) => {
  const base = { model, max_tokens: 24 + 8 * (i % 5), ignore_eos: true };
  requests.push({ kind: 'chat', body: { ...base, messages: [{ role: 'user', content: `Tell me about ${t}.` }], temperature: 0 } });
  requests.push({
    kind: 'chat',
    body: { ...base, messages: [{ role: 'user', content: `Think about ${t}.` }], think: true, temperature: 0.9, seed: 100 + i },
  });
  requests.push({ kind: 'completion', body: { ...base, prompt: `Notes on ${t}:`, temperature: 0 } });
});

async function serve(r, stream) {
  if (r.kind === 'chat') {
    if (stream) {
      const s = await collectChat(await client.chat.completions.create({ ...r.body, stream: true, stream_options: { include_usage: true } }));
      return { text: s.content, reasoning: s.reasoning, finish: s.finish, tokens: s.usage?.completion_tokens };
    }
    const a = await client.chat.completions.create(r.body);
    const m = a.choices[0].message;
    return { text: m.content ?? '', reasoning: m.reasoning_content ?? '', finish: a.choices[0].finish_reason, tokens: a.usage.completion_tokens };
  }
  if (stream) {
    const s = await collectCompletion(await client.completions.create({ ...r.body, stream: true, stream_options: { include_usage: true } }));
    return { text: s.text, reasoning: '', finish: s.finish, tokens: s.usage?.completion_tokens };
  }
  const a = await client.completions.create(r.body);
  return { text: a.choices[0].text, reasoning: '', finish: a.choices[0].finish_reason, tokens: a.usage.completion_tokens };
}

// References: each request alone.
const reference = [];
for (const r of requests) reference.push(await serve(r, true));

let done = 0;
let failures = 0;
let tokens = 0;
const latencies = [];
const problems = [];
const t0 = Date.now();
async function worker(w) {
  for (let i = w; Date.now() - t0 < duration; i += streams) {
    const k = i % requests.length;
    const stream = i % 3 !== 0;
    const start = Date.now();
    try {
      const got = await serve(requests[k], stream);
      const want = reference[k];
      const bad = [];
      if (got.finish !== 'length') bad.push(`finish ${got.finish}`);
      if (got.tokens !== requests[k].body.max_tokens) bad.push(`${got.tokens} tokens`);
      if (got.text !== want.text) bad.push('text differs');
      if (got.reasoning !== want.reasoning) bad.push('reasoning differs');
      if (bad.length) {
        failures++;
        if (problems.length < 10) problems.push(`request ${k} (${stream ? 'stream' : 'plain'}): ${bad.join(', ')}`);
      } else {
        done++;
        tokens += got.tokens;
        latencies.push(Date.now() - start);
      }
    } catch (e) {
      failures++;
      if (problems.length < 10) problems.push(`request ${k}: ${e.message}`);
    }
  }
}
await Promise.all(Array.from({ length: streams }, (_, w) => worker(w)));
const secs = (Date.now() - t0) / 1000;
const m = await metrics(url);
latencies.sort((a, b) => a - b);
const pct = (p) => latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))] ?? 0;
console.log(
  `load: ${streams} clients for ${secs.toFixed(1)} s: ${done} responses ok, ${failures} failed; ` +
    `${tokens} tokens, ${(tokens / secs).toFixed(1)} tokens/s; latency p50 ${pct(50)} ms, p95 ${pct(95)} ms; ` +
    `busy slots now ${m.glm5_busy_slots}, queue ${m.glm5_queue_depth}`,
);
for (const p of problems) console.log(`  ${p}`);
let code = failures === 0 && done > 0 && m.glm5_busy_slots === 0 && m.glm5_queue_depth === 0 ? 0 : 1;
if (srv) {
  const exit = await srv.stop();
  if (exit !== 0) {
    console.log(`glm5 serve exited with ${exit}`);
    code = 1;
  }
}
console.log(code === 0 ? 'PASS' : 'FAIL');
process.exit(code);
