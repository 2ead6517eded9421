// What llama.cpp and OpenAI users expect, through the official openai client and plain
// fetch: logprobs (chat and completions, streamed too, agreeing with `glm5 logits`),
// penalties and logit_bias, fields of other servers at their neutral values (and 400s
// naming those that would change the output), llama.cpp's top-level json_schema, the
// utility endpoints (/tokenize, /detokenize, /apply-template, /props) and llama.cpp's
// Prometheus names.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { BINARY, MODEL, startServer } from './helpers.mjs';

let srv;
before(async () => {
  srv = await startServer(['--ctx-size', '1024']);
});
after(async () => {
  assert.equal(await srv.stop(), 0);
});

const post = async (path, body) => {
  const res = await fetch(`${srv.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' },
                                                  body: JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
};
const chat = (extra = {}) => ({ model: srv.model, messages: [{ role: 'user', content: 'Hello there' }], temperature: 0,
                                max_tokens: 8, ...extra });

describe('compat', () => {
  test('logprobs: the greedy token is the top one, plain and streamed agree', async () => {
    const r = await srv.client.chat.completions.create(chat({ logprobs: true, top_logprobs: 3 }));
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, r.usage.completion_tokens);
    for (const t of lp) {
      assert.equal(t.top_logprobs.length, 3);
      assert.equal(t.top_logprobs[0].token, t.token);
      assert.equal(t.top_logprobs[0].logprob, t.logprob);
      assert.ok(t.logprob <= 0);
      assert.ok(t.top_logprobs[1].logprob <= t.top_logprobs[0].logprob);
      // The token's text where its bytes are whole UTF-8 (else U+FFFD stands in).
      const text = Buffer.from(t.bytes).toString('utf8');
      if (!text.includes('\ufffd')) assert.equal(t.token, text);
    }
    assert.equal(Buffer.concat(lp.map((t) => Buffer.from(t.bytes))).toString('utf8'), r.choices[0].message.content);
    const s = await srv.client.chat.completions.create(chat({ logprobs: true, top_logprobs: 3, stream: true }));
    const streamed = [];
    for await (const c of s) streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
    assert.deepEqual(streamed, lp);
    // Without the flag: none.
    const none = await srv.client.chat.completions.create(chat());
    assert.equal(none.choices[0].logprobs, null);
  });

  test('completions logprobs agree with glm5 logits on the same tokens', async () => {
    const ids = [5, 9, 17, 33, 65];
    const r = await srv.client.completions.create({ model: srv.model, prompt: ids, max_tokens: 1, temperature: 0,
                                                    logprobs: 2 });
    const lp = r.choices[0].logprobs;
    assert.deepEqual(lp.text_offset, [0]);
    assert.equal(lp.tokens[0], r.choices[0].text);
    const out = JSON.parse(execFileSync(BINARY, ['logits', '-m', MODEL, '-t', '1', '--tokens', ids.join(',')],
                                        { stdio: ['ignore', 'pipe', 'ignore'] }));
    const row = out.logits.at(-1) ?? out.logits;
    const mx = Math.max(...row);
    const lz = mx + Math.log(row.reduce((a, l) => a + Math.exp(l - mx), 0));
    const best = row.indexOf(mx);
    assert.ok(Math.abs(lp.token_logprobs[0] - (row[best] - lz)) < 1e-4, `${lp.token_logprobs[0]} vs ${row[best] - lz}`);
    const tok = await post('/tokenize', { content: lp.tokens[0], with_pieces: false });
    assert.deepEqual(tok.body.tokens, [best]);
  });

  test('penalties and logit_bias change the sampling as asked', async () => {
    const base = await srv.client.chat.completions.create(chat({ logprobs: true }));
    const first = (await post('/tokenize', { content: base.choices[0].logprobs.content[0].token })).body.tokens;
    assert.equal(first.length, 1);
    // Banning the greedy first token: it never comes first again (OpenAI's form, and llama.cpp's).
    for (const logit_bias of [{ [first[0]]: -100 }, [[first[0], false]]]) {
      const r = await srv.client.chat.completions.create(chat({ logprobs: true, logit_bias }));
      assert.notEqual(r.choices[0].logprobs.content[0].token, base.choices[0].logprobs.content[0].token);
    }
    const pen = await srv.client.chat.completions.create(chat({ presence_penalty: 1.5, frequency_penalty: 1.0,
                                                                repeat_last_n: 64, max_tokens: 24 }));
    assert.equal(pen.choices[0].finish_reason === 'length' || pen.choices[0].finish_reason === 'stop', true);
    for (const [field, value] of [['presence_penalty', 3], ['logit_bias', { 999999: 1 }], ['logit_bias', { 5: 500 }]]) {
      const r = await post('/v1/chat/completions', chat({ [field]: value }));
      assert.equal(r.status, 400, `${field}`);
      assert.equal(r.body.error.param, field);
    }
  });

  test('fields of other servers: neutral values pass, others are 400s naming them', async () => {
    // SillyTavern's llama.cpp mode sends these at their defaults.
    const neutral = { typical_p: 1, mirostat: 0, mirostat_tau: 5, mirostat_eta: 0.1, dry_multiplier: 0, dry_base: 1.75,
                      dry_allowed_length: 2, dry_sequence_breakers: ['\n'], xtc_probability: 0, xtc_threshold: 0.1,
                      tfs_z: 1, n_probs: 0, grammar: '', min_keep: 0, top_n_sigma: -1, penalize_nl: false, user: 'u' };
    assert.equal((await post('/v1/chat/completions', chat(neutral))).status, 200);
    for (const [field, value] of [['grammar', 'root ::= "a"'], ['n_probs', 5], ['mirostat', 2], ['typical_p', 0.5],
                                  ['dry_multiplier', 0.8], ['xtc_probability', 0.5], ['samplers', ['top_k']],
                                  ['functions', [{ name: 'f' }]]]) {
      const r = await post('/v1/chat/completions', chat({ [field]: value }));
      assert.equal(r.status, 400, field);
      assert.equal(r.body.error.param, field);
      assert.equal(r.body.error.code, 'unsupported_parameter');
    }
  });

  test("llama.cpp's top-level json_schema constrains the reply", async () => {
    const schema = { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] };
    const r = await post('/v1/chat/completions', chat({ json_schema: schema, max_tokens: 32, temperature: 1, seed: 3 }));
    assert.equal(r.status, 200);
    const v = JSON.parse(r.body.choices[0].message.content);
    assert.ok(Number.isInteger(v.n));
    const both = await post('/v1/chat/completions', chat({ json_schema: schema, response_format: { type: 'json_object' } }));
    assert.equal(both.status, 400);
  });

  test('/tokenize, /detokenize, /apply-template and /props', async () => {
    const t = await post('/tokenize', { content: 'Hello world' });
    assert.ok(t.body.tokens.length > 0 && t.body.tokens.every(Number.isInteger));
    const d = await post('/detokenize', { tokens: t.body.tokens });
    assert.equal(d.body.content, 'Hello world');
    const p = await post('/tokenize', { content: 'Hello world', with_pieces: true });
    assert.deepEqual(p.body.tokens.map((x) => x.id), t.body.tokens);
    assert.equal(p.body.tokens.map((x) => x.piece).join(''), 'Hello world');
    assert.equal((await post('/detokenize', { tokens: [1e9] })).status, 400);
    const a = await post('/apply-template', { messages: [{ role: 'system', content: 'Be brief.' },
                                                          { role: 'user', content: 'Hello there' }] });
    assert.match(a.body.prompt, /<\|system\|>Be brief\.<\|user\|>Hello there<\|assistant\|>/);
    // The template's prompt is the one chat completions evaluate.
    const tokens = (await post('/tokenize', { content: a.body.prompt })).body.tokens;
    const c = await srv.client.chat.completions.create({ model: srv.model, max_tokens: 1,
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }] });
    assert.equal(c.usage.prompt_tokens, tokens.length);
    const props = await (await fetch(`${srv.url}/props`)).json();
    assert.equal(props.default_generation_settings.n_ctx, 1024);
    assert.equal(props.default_generation_settings.params.temperature, 0.8);
    assert.equal(props.default_generation_settings.params.top_k, 40);
    assert.equal(props.total_slots, 4);
    assert.equal(props.model_path, MODEL);
    assert.equal(typeof props.chat_template, 'string');
    assert.equal(props.modalities.vision, false);
  });

  test("Prometheus: llama.cpp's names beside ours", async () => {
    const text = await (await fetch(`${srv.url}/metrics`)).text();
    const value = (name) => Number(text.match(new RegExp(`^${name.replace(':', '\\:')} (\\S+)$`, 'm'))?.[1]);
    for (const name of ['llamacpp:prompt_tokens_total', 'llamacpp:tokens_predicted_total', 'llamacpp:n_decode_total',
                        'llamacpp:requests_processing', 'llamacpp:requests_deferred', 'llamacpp:kv_cache_usage_ratio'])
      assert.ok(Number.isFinite(value(name)), name);
    assert.equal(value('llamacpp:tokens_predicted_total'), value('glm5_generated_tokens_total'));
    assert.ok(value('llamacpp:prompt_tokens_total') > 0);
  });
});
