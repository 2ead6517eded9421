// Anthropic's Messages API through the official @anthropic-ai/sdk client: plain and
// streamed replies agree (and the SDK's stream helper assembles the same message), a
// forced tool call and its result in the next turn, thinking with a budget, stop
// sequences, count_tokens, errors in Anthropic's shape, x-api-key, and a stream the
// client abandons is cancelled.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import Anthropic from '@anthropic-ai/sdk';
import { metrics, sleep, startServer, waitFor } from './helpers.mjs';

let srv;
let client;
before(async () => {
  srv = await startServer(['--ctx-size', '4096', '--api-key', 'sk-test-key'], { apiKey: 'sk-test-key' });
  client = new Anthropic({ baseURL: srv.url, apiKey: 'sk-test-key', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  assert.equal(await srv.stop(), 0);
});

// Claude Code names its own models: whatever is named is served, and echoed.
const MODEL = 'claude-sonnet-4-5';
const base = { model: MODEL, max_tokens: 24, temperature: 0, messages: [{ role: 'user', content: 'Hello there' }] };

// The reply a stream of raw events adds up to.
async function collect(stream) {
  const r = { blocks: [], types: [], stop_reason: null, stop_sequence: null, usage: null, start: null };
  for await (const ev of stream) {
    r.types.push(ev.type);
    if (ev.type === 'message_start') r.start = ev.message;
    if (ev.type === 'content_block_start') r.blocks[ev.index] = { ...ev.content_block, json: '' };
    if (ev.type === 'content_block_delta') {
      const b = r.blocks[ev.index];
      if (ev.delta.type === 'text_delta') b.text += ev.delta.text;
      if (ev.delta.type === 'thinking_delta') b.thinking += ev.delta.thinking;
      if (ev.delta.type === 'signature_delta') b.signature = ev.delta.signature;
      if (ev.delta.type === 'input_json_delta') b.json += ev.delta.partial_json;
    }
    if (ev.type === 'message_delta') {
      r.stop_reason = ev.delta.stop_reason;
      r.stop_sequence = ev.delta.stop_sequence;
      r.usage = ev.usage;
    }
  }
  for (const b of r.blocks) {
    if (b.type === 'tool_use') b.input = JSON.parse(b.json || '{}');
    delete b.json;
  }
  return r;
}

const weather = {
  name: 'get_weather',
  description: 'Current weather in a city',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
    required: ['city', 'unit'],
  },
};

describe('anthropic messages', () => {
  test('plain and streamed replies agree, and the stream helper assembles the same message', async () => {
    const plain = await client.messages.create(base);
    assert.equal(plain.type, 'message');
    assert.equal(plain.role, 'assistant');
    assert.equal(plain.model, MODEL);
    assert.match(plain.id, /^msg_/);
    assert.ok(['end_turn', 'max_tokens'].includes(plain.stop_reason));
    assert.equal(plain.content.length, 1);
    assert.equal(plain.content[0].type, 'text');
    assert.ok(plain.usage.input_tokens > 0 && plain.usage.output_tokens > 0);

    const s = await collect(await client.messages.create({ ...base, stream: true }));
    assert.equal(s.types[0], 'message_start');
    assert.equal(s.types.at(-1), 'message_stop');
    assert.equal(s.types.at(-2), 'message_delta');
    assert.equal(s.start.model, MODEL);
    assert.equal(s.blocks.length, 1);
    assert.equal(s.blocks[0].text, plain.content[0].text);
    assert.equal(s.stop_reason, plain.stop_reason);
    assert.equal(s.usage.output_tokens, plain.usage.output_tokens);

    // On the wire: event lines, and a ping after message_start (the SDK hides pings).
    const wire = await (await fetch(`${srv.url}/v1/messages`, {
      method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test-key' },
      body: JSON.stringify({ ...base, stream: true }),
    })).text();
    const events = [...wire.matchAll(/^event: (\w+)$/gm)].map((m) => m[1]);
    assert.deepEqual(events.slice(0, 3), ['message_start', 'ping', 'content_block_start']);
    assert.equal(events.at(-1), 'message_stop');

    const final = await client.messages.stream(base).finalMessage();
    assert.deepEqual(final.content.map((b) => b.text), plain.content.map((b) => b.text));
    assert.equal(final.stop_reason, plain.stop_reason);
  });

  test('system prompts, text blocks and count_tokens', async () => {
    const req = { ...base, system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
                  metadata: { user_id: 'u1' } };
    const m = await client.messages.create(req);
    const counted = await client.messages.countTokens({ model: MODEL, system: req.system, messages: req.messages });
    assert.equal(counted.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
    const alone = await client.messages.countTokens({ model: MODEL, messages: req.messages });
    assert.ok(counted.input_tokens > alone.input_tokens);
  });

  test('a forced tool call is a tool_use block, and its result goes into the next turn', async () => {
    const req = { ...base, max_tokens: 64, tools: [weather], tool_choice: { type: 'tool', name: 'get_weather' },
                  messages: [{ role: 'user', content: 'What is the weather in Paris?' }] };
    const m = await client.messages.create(req);
    assert.equal(m.stop_reason, 'tool_use');
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.ok(use, JSON.stringify(m.content));
    assert.match(use.id, /^toolu_/);
    assert.equal(use.name, 'get_weather');
    assert.equal(typeof use.input.city, 'string');
    assert.ok(['celsius', 'fahrenheit'].includes(use.input.unit));

    // Streamed: the same call, as input_json_delta.
    const s = await collect(await client.messages.create({ ...req, stream: true }));
    assert.equal(s.stop_reason, 'tool_use');
    const suse = s.blocks.find((b) => b.type === 'tool_use');
    assert.deepEqual(suse.input, use.input);

    const next = await client.messages.create({
      ...base,
      tools: [weather],
      messages: [
        ...req.messages,
        { role: 'assistant', content: m.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 degrees, sunny' },
                                  { type: 'text', text: 'Thanks' }] },
      ],
    });
    assert.equal(next.content[0].type, 'text');
    // (input_tokens leaves out what the prefix cache served: the first turn, reused.)
    const prompt = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0);
    assert.ok(prompt(next.usage) > prompt(m.usage));

    // tool_choice any: one of the tools; none: no call.
    const any = await client.messages.create({ ...req, tool_choice: { type: 'any' } });
    assert.equal(any.stop_reason, 'tool_use');
    const none = await client.messages.create({ ...req, tool_choice: { type: 'none' } });
    assert.ok(none.content.every((b) => b.type !== 'tool_use'));
  });

  test('thinking comes back as a thinking block, bounded by its budget', async () => {
    const req = { ...base, max_tokens: 48 };
    const open = await client.messages.create({ ...req, thinking: { type: 'adaptive' } });
    const bounded = await client.messages.create({ ...req, thinking: { type: 'enabled', budget_tokens: 4 } });
    const none = await client.messages.create({ ...req, thinking: { type: 'enabled', budget_tokens: 0 } });
    const th = (m) => m.content.find((b) => b.type === 'thinking');
    assert.ok(th(open) && th(open).thinking.length > 0, JSON.stringify(open.content));
    assert.ok(th(bounded), JSON.stringify(bounded.content));
    assert.ok(th(bounded).signature.length > 0);
    // Greedy: the bounded reasoning is the first tokens of the open one, and shorter.
    assert.ok(th(open).thinking.startsWith(th(bounded).thinking));
    assert.ok(th(bounded).thinking.length < th(open).thinking.length);
    assert.ok(!th(none) || th(none).thinking === '');
    // Exactly the budget: 4 reasoning tokens, then </think> is the fifth.
    const five = await client.messages.create({ ...req, max_tokens: 5, thinking: { type: 'enabled', budget_tokens: 4 } });
    assert.equal(five.usage.output_tokens, 5);
    assert.equal(th(five).thinking, th(bounded).thinking);
    assert.ok(five.content.every((b) => b.type !== 'text' || b.text === ''), JSON.stringify(five.content));
    const five_open = await client.messages.create({ ...req, max_tokens: 5, thinking: { type: 'adaptive' } });
    assert.ok(th(five_open).thinking.length > th(five).thinking.length);
    // Streamed thinking: a thinking block with its signature, before the text.
    const s = await collect(await client.messages.create({ ...req, stream: true, thinking: { type: 'enabled', budget_tokens: 4 } }));
    assert.equal(s.blocks[0].type, 'thinking');
    assert.equal(s.blocks[0].thinking, th(bounded).thinking);
    assert.equal(s.blocks[0].signature, th(bounded).signature);
  });

  test('stop_sequences end the reply with stop_reason stop_sequence', async () => {
    const long = await client.messages.create({ ...base, max_tokens: 40 });
    const text = long.content[0].text;
    // A piece from the middle of the greedy reply.
    const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
    assert.ok(stop.length === 3, `reply too short: ${JSON.stringify(text)}`);
    const m = await client.messages.create({ ...base, max_tokens: 40, stop_sequences: [stop] });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, stop);
    assert.equal(m.content[0].text, text.slice(0, text.indexOf(stop)));
    const s = await collect(await client.messages.create({ ...base, max_tokens: 40, stop_sequences: [stop], stream: true }));
    assert.equal(s.stop_reason, 'stop_sequence');
    assert.equal(s.stop_sequence, stop);
  });

  test('errors come in Anthropic shape', async () => {
    const raw = async (body, headers = {}) => {
      const res = await fetch(`${srv.url}/v1/messages`, {
        method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test-key', ...headers }, body,
      });
      return { status: res.status, body: await res.json() };
    };
    const cases = [
      ['{"model":', 400, 'invalid_request_error'],
      [JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }] }), 400, 'invalid_request_error'],
      [JSON.stringify({ ...base, max_tokens: 'many' }), 400, 'invalid_request_error'],
      [JSON.stringify({ ...base, messages: [{ role: 'wizard', content: 'hi' }] }), 400, 'invalid_request_error'],
      [JSON.stringify({ ...base, messages: [{ role: 'user', content: [{ type: 'document', source: {} }] }] }), 400, 'invalid_request_error'],
      [JSON.stringify({ ...base, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://x/y.png' } }] }] }), 400, 'invalid_request_error'],
      [JSON.stringify({ ...base, messages: [{ role: 'user', content: 'x'.repeat(40000) }] }), 400, 'invalid_request_error'],
      [JSON.stringify({ ...base, tools: [{ type: 'web_search_20250305', name: 'web_search' }] }), 400, 'invalid_request_error'],
      [JSON.stringify({ ...base, thinking: { type: 'enabled', budget_tokens: 100 } }), 400, 'invalid_request_error'],
      [JSON.stringify(base) + '\u0000{', 400, 'invalid_request_error'],
    ];
    for (const [body, status, type] of cases) {
      const r = await raw(body);
      assert.equal(r.status, status, body.slice(0, 200));
      assert.equal(r.body.type, 'error', JSON.stringify(r.body));
      assert.equal(r.body.error.type, type);
      assert.equal(typeof r.body.error.message, 'string');
    }
    // A wrong key, through the SDK: its typed error.
    const bad = new Anthropic({ baseURL: srv.url, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.messages.create(base), (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 &&
      e.error?.error?.type === 'authentication_error');
    // A prompt past the context, through the SDK: Anthropic's wording, which Claude Code
    // compacts its conversation on.
    await assert.rejects(client.messages.create({ ...base, messages: [{ role: 'user', content: 'word '.repeat(5000) }] }),
      (e) => e instanceof Anthropic.BadRequestError && e.error?.type === 'error' &&
        /^prompt is too long: \d+ tokens > \d+ maximum$/.test(e.error?.error?.message));
    // The server still serves.
    assert.equal((await client.messages.create(base)).type, 'message');
  });

  test('a stream the client abandons is cancelled', async () => {
    const before = await metrics(srv.url);
    const ac = new AbortController();
    // ignore_eos (an extension the chat endpoint has too): the reply cannot end early.
    const stream = await client.messages.create({ ...base, max_tokens: 3000, stream: true, ignore_eos: true,
      messages: [{ role: 'user', content: 'Tell me a long story' }] }, { signal: ac.signal });
    let seen = 0;
    for await (const ev of stream) {
      if (ev.type === 'content_block_delta' && ++seen === 3) {
        ac.abort();
        break;
      }
    }
    assert.equal(seen, 3);
    await waitFor(async () => (await metrics(srv.url)).glm5_busy_slots === 0, 20000, 'the slot to free');
    const m = await metrics(srv.url);
    assert.equal(m.glm5_requests_cancelled_total, before.glm5_requests_cancelled_total + 1);
    assert.ok(m.glm5_generated_tokens_total - before.glm5_generated_tokens_total < 3000);
    await sleep(10);
  });
});
