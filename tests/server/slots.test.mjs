// The prompt cache on disk (--slot-save-path, llama-server's /slots/{id}?action=...):
// a slot's sequence saved by one server and restored by another is adopted by a
// request sharing its prefix, whose logprobs are then bitwise those of the prefix
// computed fresh, for glm-dsa and for glm5next's recurrent (KDA) state; file names
// cannot leave the folder; files of another model or cache type are refused.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { MODEL, startServer } from './helpers.mjs';

const DATA = new URL('../data', import.meta.url).pathname;
const NEXT = `${DATA}/glm5next/tiny.gguf`;
let dir;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'glm5-slots-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

async function post(url, path, body) {
  const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' },
                                             body: JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
}

// A completion over token ids, greedy, with the raw logprobs of what it generates.
const complete = (url, prompt, max_tokens) =>
  post(url, '/v1/completions', { prompt, max_tokens, temperature: 0, logprobs: 3, ignore_eos: true });

async function roundTrip(model, extra) {
  const prompt = Array.from({ length: 40 }, (_, i) => (i * 7 + 3) % 200);
  const next = [...prompt, 11, 12];
  const file = `seq-${model.split('/').at(-2)}.bin`;
  // Server A: the prompt alone (max_tokens 1 leaves exactly the prompt's state), saved.
  const a = await startServer(['-m', model, '--slot-save-path', dir, '--parallel', '1', ...extra]);
  let fresh;
  try {
    assert.equal((await complete(a.url, prompt, 1)).status, 200);
    const saved = await post(a.url, '/slots/0?action=save', { filename: file });
    assert.equal(saved.status, 200, JSON.stringify(saved.body));
    assert.equal(saved.body.n_saved, prompt.length);
    assert.ok(saved.body.n_written > 0);
    assert.deepEqual(readdirSync(dir).filter((f) => f === file), [file]);
  } finally {
    assert.equal(await a.stop(), 0);
  }
  // Server B, fresh: the longer prompt computed from nothing.
  const b = await startServer(['-m', model, '--parallel', '1', ...extra]);
  try {
    fresh = await complete(b.url, next, 6);
    assert.equal(fresh.body.usage.prompt_tokens_details.cached_tokens, 0);
  } finally {
    assert.equal(await b.stop(), 0);
  }
  // Server C restores the file: the longer prompt adopts it and answers bit for bit.
  const c = await startServer(['-m', model, '--slot-save-path', dir, '--parallel', '1', ...extra]);
  try {
    const r = await post(c.url, '/slots/0?action=restore', { filename: file });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.n_restored, prompt.length);
    const again = await complete(c.url, next, 6);
    assert.equal(again.body.usage.prompt_tokens_details.cached_tokens, prompt.length);
    assert.equal(again.body.choices[0].text, fresh.body.choices[0].text);
    assert.deepEqual(again.body.choices[0].logprobs, fresh.body.choices[0].logprobs);
    // Erased, the next request computes the prefix again.
    const e = await post(c.url, '/slots/0?action=erase', {});
    assert.equal(e.status, 200);
  } finally {
    assert.equal(await c.stop(), 0);
  }
}

describe('slots', () => {
  test('glm-dsa: saved, restored in another server, reused bitwise', async () => {
    await roundTrip(MODEL, []);
  });

  test("glm5next: the KDA state travels with the rows", async () => {
    await roundTrip(NEXT, ['--cache-type', 'f32']);
  });

  test('refusals: names outside the folder, other models and cache types, no folder', async () => {
    const s = await startServer(['--slot-save-path', dir, '--parallel', '2']);
    try {
      assert.equal((await complete(s.url, [1, 2, 3, 4], 1)).status, 200);
      for (const filename of ['../escape.bin', 'a/b.bin', '.hidden', '', 'x\\y']) {
        const r = await post(s.url, '/slots/0?action=save', { filename });
        assert.equal(r.status, 400, filename);
        assert.equal(r.body.error.param, 'filename');
      }
      assert.equal((await post(s.url, '/slots/7?action=save', { filename: 'x.bin' })).status, 400);
      assert.equal((await post(s.url, '/slots/1?action=save', { filename: 'x.bin' })).status, 400);  // empty slot
      assert.equal((await post(s.url, '/slots/0?action=frobnicate', { filename: 'x.bin' })).status, 400);
      const missing = await post(s.url, '/slots/0?action=restore', { filename: 'nothing.bin' });
      assert.equal(missing.status, 400);
      writeFileSync(join(dir, 'junk.bin'), 'not a slot file');
      assert.match((await post(s.url, '/slots/0?action=restore', { filename: 'junk.bin' })).body.error.message,
                   /not a saved sequence/);
      // Written by glm5next, and by this model with F32 caches: refused, saying why.
      for (const f of ['seq-glm5next.bin']) {
        const r = await post(s.url, '/slots/0?action=restore', { filename: f });
        assert.equal(r.status, 400);
        assert.match(r.body.error.message, /another model or cache type/);
      }
    } finally {
      assert.equal(await s.stop(), 0);
    }
    const f32 = await startServer(['--slot-save-path', dir, '--cache-type', 'f32']);
    try {
      const r = await post(f32.url, '/slots/0?action=restore', { filename: 'seq-glm-dsa.bin' });
      assert.equal(r.status, 400);
      assert.match(r.body.error.message, /another model or cache type/);
    } finally {
      assert.equal(await f32.stop(), 0);
    }
    const none = await startServer([]);
    try {
      assert.equal((await post(none.url, '/slots/0?action=save', { filename: 'x.bin' })).status, 501);
    } finally {
      assert.equal(await none.stop(), 0);
    }
  });
});
