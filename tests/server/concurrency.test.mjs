// Several clients at once through the official openai client: concurrent streams
// give exactly what each request gives alone (temperature 0), requests beyond
// --parallel queue and complete, the engine batches them, and a client that goes
// away (streaming or not, running or queued) has its slot freed at once.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { collectChat, metrics, sleep, startServer, waitFor } from './helpers.mjs';

const PARALLEL = 4;
let srv;
before(async () => {
  srv = await startServer(['--parallel', String(PARALLEL), '--ctx-size', '8192']);
});
after(async () => {
  assert.equal(await srv.stop(), 0);
});

const prompts = [
  'Describe a mountain.',
  'Write about the ocean at night.',
  'List some fruits.',
  'Explain how a bicycle works.',
  'Tell a story about a cat.',
  'What is the capital of France?',
];
const request = (p, extra = {}) => ({
  model: srv.model,
  messages: [{ role: 'user', content: p }],
  temperature: 0,
  ignore_eos: true,
  max_tokens: 64,
  stream: true,
  ...extra,
});
const streamOf = async (p, extra) => collectChat(await srv.client.chat.completions.create(request(p, extra)));

describe('concurrency', () => {
  test('concurrent streams equal the same requests served alone', async () => {
    const alone = [];
    const first = await metrics(srv.url);
    for (const p of prompts) alone.push((await streamOf(p)).content);
    const before = await metrics(srv.url);
    // Six streams on four slots: two of them queue first.
    const together = await Promise.all(prompts.map((p) => streamOf(p)));
    const after = await metrics(srv.url);
    together.forEach((r, i) => {
      assert.equal(r.finish, 'length', prompts[i]);
      assert.equal(r.content, alone[i], `prompt ${i} differs when batched`);
    });
    // They were batched: far fewer forwards than tokens generated.
    const forwards = after.glm5_forwards_total - before.glm5_forwards_total;
    const generated = after.glm5_generated_tokens_total - before.glm5_generated_tokens_total;
    assert.equal(generated, 64 * prompts.length);
    assert.ok(forwards < 0.6 * generated, `${forwards} forwards for ${generated} tokens`);
    // ... and read the weights once per batch: fewer weight bytes per token
    // than the same requests one at a time.
    const perToken = (a, b) =>
      (b.glm5_weight_bytes_read_total - a.glm5_weight_bytes_read_total) /
      (b.glm5_generated_tokens_total - a.glm5_generated_tokens_total);
    const aloneBytes = perToken(first, before);
    const togetherBytes = perToken(before, after);
    assert.ok(aloneBytes > 0, 'the weight bytes are counted');
    assert.ok(togetherBytes < 0.8 * aloneBytes, `${togetherBytes} bytes a token batched, ${aloneBytes} alone`);
    // The same request four times at once: four identical replies.
    const same = await Promise.all([0, 1, 2, 3].map(() => streamOf(prompts[1])));
    for (const r of same) assert.equal(r.content, alone[1]);
  });

  test('busy slots never exceed --parallel; the queue drains', async () => {
    let maxBusy = 0;
    let maxQueue = 0;
    let done = false;
    const watcher = (async () => {
      while (!done) {
        const m = await metrics(srv.url);
        maxBusy = Math.max(maxBusy, m.glm5_busy_slots);
        maxQueue = Math.max(maxQueue, m.glm5_queue_depth);
        await sleep(5);
      }
    })();
    const runs = await Promise.all(
      Array.from({ length: 10 }, (_, i) => streamOf(prompts[i % prompts.length], { max_tokens: 200 })),
    );
    done = true;
    await watcher;
    for (const r of runs) assert.equal(r.finish, 'length');
    assert.ok(maxBusy <= PARALLEL, `busy slots reached ${maxBusy}`);
    assert.ok(maxBusy >= 2, `busy slots only reached ${maxBusy}`);
    const m = await metrics(srv.url);
    assert.equal(m.glm5_busy_slots, 0);
    assert.equal(m.glm5_queue_depth, 0);
  });

  test('aborting a stream mid-way cancels it and frees its slot at once', async () => {
    const m0 = await metrics(srv.url);
    const stream = await srv.client.chat.completions.create(request(prompts[0], { max_tokens: 6000 }));
    let chunks = 0;
    for await (const chunk of stream) {
      if (++chunks === 10) break; // leaving the loop aborts the request
    }
    const t0 = Date.now();
    await waitFor(async () => (await metrics(srv.url)).glm5_busy_slots === 0, 2000, 'the slot to free');
    const freedMs = Date.now() - t0;
    const m1 = await metrics(srv.url);
    assert.equal(m1.glm5_requests_cancelled_total, m0.glm5_requests_cancelled_total + 1);
    // Nothing keeps generating for it.
    await sleep(200);
    const m2 = await metrics(srv.url);
    assert.equal(m2.glm5_generated_tokens_total, m1.glm5_generated_tokens_total);
    assert.ok(m1.glm5_generated_tokens_total - m0.glm5_generated_tokens_total < 6000);
    assert.ok(freedMs < 1000, `slot freed after ${freedMs} ms`);
  });

  test('aborting a plain request cancels it too', async () => {
    const m0 = await metrics(srv.url);
    const ac = new AbortController();
    const pending = srv.client.chat.completions.create(request(prompts[2], { max_tokens: 6000, stream: false }), {
      signal: ac.signal,
    });
    await waitFor(async () => (await metrics(srv.url)).glm5_busy_slots === 1, 5000, 'the request to start');
    ac.abort();
    await assert.rejects(pending);
    await waitFor(async () => (await metrics(srv.url)).glm5_busy_slots === 0, 2000, 'the slot to free');
    const m1 = await metrics(srv.url);
    assert.equal(m1.glm5_requests_cancelled_total, m0.glm5_requests_cancelled_total + 1);
  });

  test('a queued request whose client leaves never runs', async () => {
    const fill = Array.from({ length: PARALLEL }, () => new AbortController());
    const running = fill.map((ac, i) =>
      srv.client.chat.completions
        .create(request(prompts[i], { max_tokens: 6000 }), { signal: ac.signal })
        .then(async (s) => {
          for await (const _ of s);
        })
        .catch(() => {}),
    );
    await waitFor(async () => (await metrics(srv.url)).glm5_busy_slots === PARALLEL, 5000, 'the slots to fill');
    const m0 = await metrics(srv.url);
    const late = new AbortController();
    const queued = srv.client.chat.completions
      .create(request(prompts[5], { max_tokens: 6000 }), { signal: late.signal })
      .then(async (s) => {
        for await (const _ of s);
      })
      .catch(() => {});
    await waitFor(async () => (await metrics(srv.url)).glm5_queue_depth === 1, 5000, 'the request to queue');
    late.abort();
    await waitFor(async () => (await metrics(srv.url)).glm5_queue_depth === 0, 2000, 'the queue to empty');
    const m1 = await metrics(srv.url);
    assert.equal(m1.glm5_busy_slots, PARALLEL, 'the running requests go on');
    assert.equal(m1.glm5_requests_cancelled_total, m0.glm5_requests_cancelled_total + 1);
    for (const ac of fill) ac.abort();
    await Promise.all([...running, queued]);
    await waitFor(async () => (await metrics(srv.url)).glm5_busy_slots === 0, 3000, 'all slots to free');
  });

  test('a request past the context gets its 400 while another stream keeps going', async () => {
    const alone = (await streamOf(prompts[2], { max_tokens: 100 })).content;
    const running = streamOf(prompts[2], { max_tokens: 100 });
    const post = (path, body) =>
      fetch(`${srv.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
    // A prompt that alone fills the context, in OpenAI's wording.
    let r = await post('/v1/completions', { model: srv.model, prompt: Array(8192).fill(5), max_tokens: 1 });
    assert.equal(r.status, 400);
    let e = (await r.json()).error;
    assert.equal(e.code, 'context_length_exceeded');
    assert.equal(e.param, 'prompt');
    assert.match(e.message, /^This model's maximum context length is \d+ tokens\. However, your messages resulted in 8192 tokens\./);
    const res = await running;
    assert.equal(res.finish, 'length');
    assert.equal(res.content, alone, 'the other stream is unaffected');
    // The cache memory stays inside the plan.
    const m = await metrics(srv.url);
    assert.ok(m.glm5_cache_planned_bytes > 0);
    assert.ok(m.glm5_cache_used_bytes <= m.glm5_cache_planned_bytes, 'cache memory within the plan');
  });
});
