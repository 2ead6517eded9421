// Speculative decoding through the server: every slot speculates, the windows
// of several slots share one forward, and every response equals the same
// request served alone without speculation (the drafts change only speed).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { metrics, startServer } from './helpers.mjs';

let srv;
before(async () => {
  // n-gram drafts with a fixed window, so the governor cannot park drafting.
  srv = await startServer(['--parallel', '3', '--ctx-size', '1024', '--spec', '--spec-type', 'ngram',
                           '--spec-draft', '4', '--spec-fixed']);
});
after(async () => {
  assert.equal(await srv.stop(), 0);
});

// Greedy with a repetition bonus (penalty below 1): the random-weight model
// then falls into loops that the n-gram drafter predicts.
const body = (p, extra = {}) => ({
  model: srv.model,
  prompt: p,
  temperature: 0,
  repeat_penalty: 0.2,
  ignore_eos: true,
  max_tokens: 48,
  ...extra,
});
const complete = async (p, extra) => (await srv.client.completions.create(body(p, extra)));

describe('speculative', () => {
  const prompts = ['one two three one two three', 'the cat the cat the', 'a b c d a b c d'];

  test('batched speculative output equals each request served alone, plainly', async () => {
    const plain = [];
    for (const p of prompts) plain.push((await complete(p, { speculative: false })).choices[0].text);
    const before = await metrics(srv.url);
    // One request with the three prompts: its choices are admitted in the same step
    // and decode in lockstep, so their windows share verifies however loaded the
    // machine is (three requests sent at once may not overlap).
    const together = await complete(prompts);
    const after = await metrics(srv.url);
    assert.equal(together.choices.length, prompts.length);
    together.choices.forEach((c) => assert.equal(c.text, plain[c.index], `prompt ${c.index}`));
    const drafted = together.timings.draft_n;
    const accepted = together.timings.draft_n_accepted;
    assert.ok(accepted > 0 && accepted < drafted, `accepted ${accepted} of ${drafted}`);
    assert.equal(after.glm5_speculative_drafted_total - before.glm5_speculative_drafted_total, drafted);
    // Windows of two or more slots were verified in one forward.
    assert.ok(after.glm5_speculative_shared_verifies_total > before.glm5_speculative_shared_verifies_total);
  });

  test('a request can turn speculation off or override it', async () => {
    const off = await complete(prompts[0], { speculative: false });
    assert.equal(off.timings.draft_n, 0);
    const narrow = await complete(prompts[0], { speculative: { type: 'ngram', draft: 1 } });
    assert.equal(narrow.choices[0].text, off.choices[0].text);
    assert.ok(narrow.timings.draft_n > 0);
  });

  test('mtp without a loaded NextN block is a 400', async () => {
    const res = await fetch(`${srv.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body('x', { speculative: { type: 'mtp' } })),
    });
    assert.equal(res.status, 400);
    const j = await res.json();
    assert.equal(j.error.param, 'speculative.type');
  });
});
