// Chat and completions through the official openai client: plain and streaming
// replies agree, usage is reported, stop strings cut the text, reasoning comes apart
// from the content, the prefix cache reports cached tokens.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { NotFoundError } from 'openai';
import { collectChat, collectCompletion, startServer } from './helpers.mjs';

let srv;
before(async () => {
  srv = await startServer(['--parallel', '2']);
});
after(async () => {
  assert.equal(await srv.stop(), 0, 'glm5 serve exits with code 0 on SIGTERM');
});

const user = (text) => [{ role: 'user', content: text }];
// Random weights end replies early; ignore_eos keeps them a fixed length.
const greedy = { temperature: 0, ignore_eos: true };

describe('models', () => {
  test('lists the one model and refuses unknown ones', async () => {
    const list = await srv.client.models.list();
    assert.equal(list.data.length, 1);
    assert.equal(list.data[0].object, 'model');
    assert.equal(list.data[0].id, srv.model);
    assert.equal((await srv.client.models.retrieve(srv.model)).id, srv.model);
    await assert.rejects(
      srv.client.chat.completions.create({ model: 'gpt-4o', messages: user('hi'), max_tokens: 2 }),
      (e) => e instanceof NotFoundError && e.status === 404 && e.code === 'model_not_found' && e.param === 'model',
    );
  });
});

describe('chat', () => {
  const req = { messages: user('Write a sentence about the sea.'), max_tokens: 24, ...greedy };

  test('plain reply: shape, usage, determinism', async () => {
    const a = await srv.client.chat.completions.create({ model: srv.model, ...req });
    assert.equal(a.object, 'chat.completion');
    assert.match(a.id, /^chatcmpl-/);
    assert.equal(a.model, srv.model);
    assert.equal(a.choices.length, 1);
    const c = a.choices[0];
    assert.equal(c.index, 0);
    assert.equal(c.message.role, 'assistant');
    assert.equal(typeof c.message.content, 'string');
    assert.ok(c.message.content.length > 0);
    assert.equal(c.message.reasoning_content, undefined, 'no reasoning unless asked');
    assert.equal(c.finish_reason, 'length');
    assert.equal(a.usage.completion_tokens, 24);
    assert.ok(a.usage.prompt_tokens > 5);
    assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + a.usage.completion_tokens);
    assert.equal(typeof a.usage.prompt_tokens_details.cached_tokens, 'number');
    const b = await srv.client.chat.completions.create({ model: srv.model, ...req });
    assert.equal(b.choices[0].message.content, c.message.content, 'temperature 0 is deterministic');
  });

  test('streaming equals plain, with usage in the last chunk', async () => {
    const plain = await srv.client.chat.completions.create({ model: srv.model, ...req });
    const s = await collectChat(
      await srv.client.chat.completions.create({
        model: srv.model,
        ...req,
        stream: true,
        stream_options: { include_usage: true },
      }),
    );
    assert.equal(s.content, plain.choices[0].message.content);
    assert.equal(s.finish, 'length');
    assert.equal(s.ids.size, 1, 'every chunk carries the same id');
    assert.ok(s.chunks >= 5, 'the reply arrives in pieces');
    assert.equal(s.usage.completion_tokens, 24);
    assert.equal(s.usage.prompt_tokens, plain.usage.prompt_tokens);
    assert.equal(s.usage.total_tokens, s.usage.prompt_tokens + 24);
    // Without include_usage there is no usage chunk.
    const t = await collectChat(await srv.client.chat.completions.create({ model: srv.model, ...req, stream: true }));
    assert.equal(t.usage, null);
    assert.equal(t.content, s.content);
  });

  test('the official stream helper assembles the same message', async () => {
    const plain = await srv.client.chat.completions.create({ model: srv.model, ...req });
    const final = await srv.client.chat.completions.stream({ model: srv.model, ...req }).finalChatCompletion();
    assert.equal(final.choices[0].message.content, plain.choices[0].message.content);
    assert.equal(final.choices[0].finish_reason, 'length');
  });

  test('stop strings end the reply before them, streaming or not', async () => {
    const full = (await srv.client.chat.completions.create({ model: srv.model, ...req })).choices[0].message.content;
    // A piece of the reply that first occurs some way in.
    let at = -1;
    let stop = '';
    for (let i = 4; i + 2 <= full.length; i++) {
      const cand = full.slice(i, i + 2);
      if (full.indexOf(cand) === i && cand.trim().length === 2) {
        at = i;
        stop = cand;
        break;
      }
    }
    assert.ok(at > 0, `no usable stop string in ${JSON.stringify(full)}`);
    const a = await srv.client.chat.completions.create({ model: srv.model, ...req, stop: [stop, 'never-there'] });
    assert.equal(a.choices[0].message.content, full.slice(0, at));
    assert.equal(a.choices[0].finish_reason, 'stop');
    assert.ok(a.usage.completion_tokens < 24);
    const s = await collectChat(await srv.client.chat.completions.create({ model: srv.model, ...req, stop, stream: true }));
    assert.equal(s.content, full.slice(0, at));
    assert.equal(s.finish, 'stop');
  });

  test('n choices, seeded sampling', async () => {
    const r = await srv.client.chat.completions.create({
      model: srv.model,
      messages: user('Pick a word.'),
      max_tokens: 12,
      n: 3,
      temperature: 1.0,
      seed: 1234,
      ignore_eos: true,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    assert.equal(r.usage.completion_tokens, 36);
    const again = await srv.client.chat.completions.create({
      model: srv.model,
      messages: user('Pick a word.'),
      max_tokens: 12,
      n: 3,
      temperature: 1.0,
      seed: 1234,
      ignore_eos: true,
    });
    assert.deepEqual(again.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content), 'a seed fixes the samples');
  });
});

describe('reasoning', () => {
  const req = { messages: user('What is 17 * 23?'), max_tokens: 32, temperature: 0 };

  test('think: true puts the reasoning in reasoning_content, streamed apart and first', async () => {
    const a = await srv.client.chat.completions.create({ model: srv.model, ...req, think: true });
    const m = a.choices[0].message;
    assert.equal(typeof m.reasoning_content, 'string');
    assert.ok(m.reasoning_content.length > 0);
    assert.ok(!m.reasoning_content.includes('<think>') && !m.reasoning_content.includes('</think>'));
    const s = await collectChat(await srv.client.chat.completions.create({ model: srv.model, ...req, think: true, stream: true }));
    assert.equal(s.reasoning, m.reasoning_content);
    assert.equal(s.content, m.content ?? '');
    const firstContent = s.order.indexOf('content');
    if (firstContent >= 0) assert.ok(!s.order.slice(firstContent).includes('reasoning'), 'reasoning comes before content');
    // The reasoning is not echoed in the content.
    assert.ok(!(m.content ?? '').includes(m.reasoning_content));
  });

  test('reasoning_effort turns reasoning on; "none" and think: false turn it off', async () => {
    for (const effort of ['low', 'medium', 'high']) {
      const a = await srv.client.chat.completions.create({ model: srv.model, ...req, reasoning_effort: effort });
      assert.ok(a.choices[0].message.reasoning_content?.length > 0, effort);
    }
    const low = await srv.client.chat.completions.create({ model: srv.model, ...req, max_tokens: 1, reasoning_effort: 'low' });
    const off = await srv.client.chat.completions.create({ model: srv.model, ...req, max_tokens: 1, reasoning_effort: 'none' });
    assert.ok(off.usage.prompt_tokens < low.usage.prompt_tokens, 'the effort line is only in reasoning prompts');
    const no = await srv.client.chat.completions.create({ model: srv.model, ...req, think: false });
    assert.equal(no.choices[0].message.reasoning_content, undefined);
  });
});

describe('completions', () => {
  const req = { prompt: 'The old lighthouse keeper', max_tokens: 16, ...greedy };

  test('plain and streaming agree; echo prepends the prompt', async () => {
    const a = await srv.client.completions.create({ model: srv.model, ...req });
    assert.equal(a.object, 'text_completion');
    assert.equal(a.choices[0].finish_reason, 'length');
    assert.equal(a.usage.completion_tokens, 16);
    assert.ok(a.choices[0].text.length > 0);
    const s = await collectCompletion(
      await srv.client.completions.create({ model: srv.model, ...req, stream: true, stream_options: { include_usage: true } }),
    );
    assert.equal(s.text, a.choices[0].text);
    assert.equal(s.finish, 'length');
    assert.equal(s.usage.completion_tokens, 16);
    const e = await srv.client.completions.create({ model: srv.model, ...req, echo: true });
    assert.equal(e.choices[0].text, req.prompt + a.choices[0].text);
  });

  test('several prompts, token prompts', async () => {
    const a = await srv.client.completions.create({ model: srv.model, ...req, prompt: ['one', 'two'] });
    assert.equal(a.choices.length, 2);
    const one = await srv.client.completions.create({ model: srv.model, ...req, prompt: 'one' });
    assert.equal(a.choices[0].text, one.choices[0].text);
    const t = await srv.client.completions.create({ model: srv.model, ...req, prompt: [10, 20, 30, 40] });
    assert.equal(t.usage.prompt_tokens, 4);
  });
});

describe('prefix cache', () => {
  test('a follow-up turn reuses the conversation so far', async () => {
    const history = user('Tell me about rivers.');
    const first = await srv.client.chat.completions.create({ model: srv.model, messages: history, max_tokens: 6, ...greedy });
    const second = await srv.client.chat.completions.create({
      model: srv.model,
      messages: [...history, first.choices[0].message, ...user('And lakes?')],
      max_tokens: 6,
      ...greedy,
    });
    const cached = second.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached >= first.usage.prompt_tokens - 1, `cached ${cached} of the first prompt's ${first.usage.prompt_tokens}`);
    assert.ok(cached < second.usage.prompt_tokens);
  });

  test('--no-prefix-cache reports no cached tokens', async () => {
    const cold = await startServer(['--no-prefix-cache']);
    try {
      const history = user('Tell me about rivers.');
      const first = await cold.client.chat.completions.create({ model: cold.model, messages: history, max_tokens: 6, ...greedy });
      const second = await cold.client.chat.completions.create({
        model: cold.model,
        messages: [...history, first.choices[0].message, ...user('And lakes?')],
        max_tokens: 6,
        ...greedy,
      });
      assert.equal(second.usage.prompt_tokens_details.cached_tokens, 0);
    } finally {
      assert.equal(await cold.stop(), 0);
    }
  });
});
