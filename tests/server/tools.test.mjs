// Tool calling through the official openai client.
//
// A random-weight model does not decide to call tools by itself, so these tests make
// the call happen with tool_choice (a named function, or "required"): the server then
// constrains generation to GLM's tool-call format (<tool_call>NAME<arg_key>...), the
// model's own tokens spell the call, and the server's reply parser turns that text
// into OpenAI tool_calls. What is checked is the protocol: the parsed call, its
// arguments against the tool's schema, finish_reason "tool_calls", the streamed
// tool_calls deltas, and a second turn carrying the assistant's call and the tool's
// result.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { BadRequestError } from 'openai';
import { collectChat, startServer } from './helpers.mjs';

let srv;
before(async () => {
  srv = await startServer();
});
after(async () => {
  assert.equal(await srv.stop(), 0);
});

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Current weather in a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string' },
          unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
          days: { type: 'integer' },
        },
        required: ['city', 'unit'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'get_time',
      description: 'Current time in a time zone',
      parameters: { type: 'object', properties: { tz: { type: 'string' } }, required: ['tz'] },
    },
  },
];
const question = [{ role: 'user', content: 'What is the weather in Paris?' }];

function checkWeatherArgs(args) {
  assert.equal(typeof args.city, 'string');
  assert.ok(['celsius', 'fahrenheit'].includes(args.unit), `unit ${args.unit}`);
  if ('days' in args) assert.ok(Number.isInteger(args.days), `days ${args.days}`);
  for (const k of Object.keys(args)) assert.ok(['city', 'unit', 'days'].includes(k), `unexpected argument ${k}`);
}

describe('tools', () => {
  const named = { type: 'function', function: { name: 'get_weather' } };

  test('a forced call comes back parsed, and its result goes into the next turn', async () => {
    const r1 = await srv.client.chat.completions.create({
      model: srv.model,
      messages: question,
      tools,
      tool_choice: named,
      temperature: 0,
      max_tokens: 48,
    });
    const c = r1.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.role, 'assistant');
    assert.equal(c.message.content, null, 'a pure tool call has null content');
    assert.equal(c.message.tool_calls.length, 1);
    const call = c.message.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
    assert.equal(call.function.name, 'get_weather');
    checkWeatherArgs(JSON.parse(call.function.arguments));

    // Second turn: the assistant's call and the tool's answer are part of the prompt.
    const result = JSON.stringify({ temperature: 21, sky: 'clear' });
    const r2 = await srv.client.chat.completions.create({
      model: srv.model,
      messages: [...question, c.message, { role: 'tool', tool_call_id: call.id, content: result }],
      tools,
      temperature: 0,
      max_tokens: 8,
      ignore_eos: true,
    });
    assert.equal(r2.choices[0].message.role, 'assistant');
    assert.equal(typeof r2.choices[0].message.content, 'string');
    assert.equal(r2.choices[0].finish_reason, 'length');
    // The new prompt holds the first one, the call and the result.
    assert.ok(r2.usage.prompt_tokens > r1.usage.prompt_tokens + 10);
    // The call and its result were rendered from the history: the same turn with a
    // different result is a different prompt.
    const r3 = await srv.client.chat.completions.create({
      model: srv.model,
      messages: [...question, c.message, { role: 'tool', tool_call_id: call.id, content: result + ' and windy' }],
      tools,
      temperature: 0,
      max_tokens: 1,
    });
    assert.ok(r3.usage.prompt_tokens > r2.usage.prompt_tokens);
  });

  test('streamed tool calls: OpenAI deltas that assemble into the same call', async () => {
    const req = { model: srv.model, messages: question, tools, tool_choice: named, temperature: 0, max_tokens: 48 };
    const plain = (await srv.client.chat.completions.create(req)).choices[0].message.tool_calls[0];
    const s = await collectChat(await srv.client.chat.completions.create({ ...req, stream: true }));
    assert.equal(s.finish, 'tool_calls');
    assert.ok(s.toolDeltas.length >= 1);
    const first = s.toolDeltas[0];
    assert.equal(first.index, 0);
    assert.match(first.id, /^call_/);
    assert.equal(first.type, 'function');
    assert.equal(first.function.name, 'get_weather');
    const args = s.toolDeltas.filter((d) => d.index === 0).map((d) => d.function?.arguments ?? '').join('');
    assert.deepEqual(JSON.parse(args), JSON.parse(plain.function.arguments));
    // The official client's stream helper assembles the same message.
    const final = await srv.client.chat.completions.stream(req).finalChatCompletion();
    const fc = final.choices[0].message.tool_calls[0];
    assert.equal(fc.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(fc.function.arguments), JSON.parse(plain.function.arguments));
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
  });

  test('a forced call cut off by max_tokens is a partial call with finish_reason length, never markup', async () => {
    // Budgets from too short for the name to one that cuts the arguments (the
    // fixture's call spells its name within 8 tokens and is not whole at 20).
    let partial = 0;
    for (const max_tokens of [2, 6, 8, 12, 20]) {
      const req = { model: srv.model, messages: question, tools, tool_choice: named, temperature: 0, max_tokens };
      const plain = (await srv.client.chat.completions.create(req)).choices[0];
      const s = await collectChat(await srv.client.chat.completions.create({ ...req, stream: true }));
      for (const text of [plain.message.content ?? '', s.content]) {
        assert.ok(!/<tool_call>|<arg_|<\/arg_/.test(text), `markup at max_tokens ${max_tokens}: ${text}`);
      }
      assert.equal(plain.finish_reason, 'length', `max_tokens ${max_tokens}`);
      assert.equal(s.finish, 'length');
      const calls = plain.message.tool_calls ?? [];
      const streamed = s.toolDeltas.filter((d) => d.index === 0);
      assert.equal(streamed.length > 0, calls.length > 0, `max_tokens ${max_tokens}`);
      if (calls.length === 0) continue;
      partial++;
      assert.equal(calls.length, 1);
      assert.equal(calls[0].function.name, 'get_weather');
      const args = JSON.parse(calls[0].function.arguments);
      for (const k of Object.keys(args)) assert.ok(['city', 'unit', 'days'].includes(k), `argument ${k}`);
      if ('unit' in args) assert.ok(['celsius', 'fahrenheit'].includes(args.unit));
      assert.equal(streamed[0].function.name, 'get_weather');
      const sargs = streamed.map((d) => d.function?.arguments ?? '').join('');
      assert.deepEqual(JSON.parse(sargs), args);
    }
    assert.ok(partial >= 2, `partial calls seen: ${partial}`);
  });

  test('tool_choice "required" calls one of the tools, with reasoning too', async () => {
    for (const think of [false, true]) {
      for (const seed of [1, 2, 3]) {
        const r = await srv.client.chat.completions.create({
          model: srv.model,
          messages: question,
          tools,
          tool_choice: 'required',
          temperature: 1.0,
          seed,
          think,
          max_tokens: 64,
        });
        const m = r.choices[0].message;
        assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(m));
        assert.equal(m.tool_calls.length, 1);
        const { name, arguments: a } = m.tool_calls[0].function;
        const args = JSON.parse(a);
        if (name === 'get_weather') checkWeatherArgs(args);
        else {
          assert.equal(name, 'get_time');
          assert.equal(typeof args.tz, 'string');
        }
        if (think) assert.equal(typeof m.reasoning_content, 'string');
      }
    }
  });

  test('tool_choice "none" and no tools: no tool calls', async () => {
    for (const extra of [{ tools, tool_choice: 'none' }, {}]) {
      const r = await srv.client.chat.completions.create({
        model: srv.model,
        messages: question,
        temperature: 0.8,
        seed: 5,
        max_tokens: 32,
        ...extra,
      });
      assert.equal(r.choices[0].message.tool_calls, undefined);
      assert.notEqual(r.choices[0].finish_reason, 'tool_calls');
    }
  });

  test('bad tool requests are 400s naming the field', async () => {
    await assert.rejects(
      srv.client.chat.completions.create({
        model: srv.model,
        messages: question,
        tools,
        tool_choice: { type: 'function', function: { name: 'launch_rocket' } },
      }),
      (e) => e instanceof BadRequestError && e.param === 'tool_choice',
    );
    await assert.rejects(
      srv.client.chat.completions.create({ model: srv.model, messages: question, tools: [{ type: 'function' }] }),
      (e) => e instanceof BadRequestError && e.param === 'tools',
    );
  });
});
