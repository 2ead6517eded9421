// response_format through the official openai client: every reply parses as JSON and
// validates against the schema, whatever the sampling, streamed or not, with reasoning
// before it.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { BadRequestError } from 'openai';
import { collectChat, startServer } from './helpers.mjs';

let srv;
before(async () => {
  srv = await startServer(['--parallel', '4']);
});
after(async () => {
  assert.equal(await srv.stop(), 0);
});

const schema = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 24 },
    age: { type: 'integer' },
    height: { type: 'number' },
    tags: { type: 'array', items: { type: 'string', maxLength: 8 }, maxItems: 3 },
    role: { enum: ['admin', 'user', 'guest'] },
    active: { type: 'boolean' },
    address: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 16 }, zip: { type: ['string', 'null'], maxLength: 6 } },
      required: ['city'],
      additionalProperties: false,
    },
  },
  required: ['name', 'age', 'tags', 'role', 'active', 'address'],
  additionalProperties: false,
};

// A validator for the keywords the schema above uses; returns a list of problems.
function validate(v, s, path = '$') {
  const errs = [];
  const types = s.type === undefined ? null : [].concat(s.type);
  const typeOf = (x) =>
    x === null ? 'null' : Array.isArray(x) ? 'array' : Number.isInteger(x) ? 'integer' : typeof x;
  if (types) {
    const t = typeOf(v);
    const ok = types.includes(t) || (t === 'integer' && types.includes('number'));
    if (!ok) return [`${path}: ${t} is not ${types.join('|')}`];
  }
  if (s.enum && !s.enum.includes(v)) errs.push(`${path}: ${JSON.stringify(v)} not in enum`);
  if (typeof v === 'string' && s.maxLength !== undefined && [...v].length > s.maxLength)
    errs.push(`${path}: longer than ${s.maxLength}`);
  if (Array.isArray(v)) {
    if (s.maxItems !== undefined && v.length > s.maxItems) errs.push(`${path}: more than ${s.maxItems} items`);
    v.forEach((x, i) => errs.push(...validate(x, s.items ?? {}, `${path}[${i}]`)));
  }
  if (typeOf(v) === 'object') {
    for (const r of s.required ?? []) if (!(r in v)) errs.push(`${path}: missing ${r}`);
    for (const [k, x] of Object.entries(v)) {
      if (s.properties?.[k]) errs.push(...validate(x, s.properties[k], `${path}.${k}`));
      else if (s.additionalProperties === false) errs.push(`${path}: unexpected ${k}`);
    }
  }
  return errs;
}

const rf = { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } };
const ask = [{ role: 'user', content: 'Describe a person as JSON.' }];

function checkDocument(text, what) {
  let doc;
  assert.doesNotThrow(() => {
    doc = JSON.parse(text);
  }, `${what}: not JSON: ${text}`);
  assert.deepEqual(validate(doc, schema), [], `${what}: ${text}`);
  return doc;
}

describe('response_format', () => {
  test('json_schema: every reply validates, at any temperature', async () => {
    const runs = [];
    for (const temperature of [0, 0.7, 1.5])
      for (const seed of [1, 2, 3, 4])
        runs.push(
          srv.client.chat.completions
            .create({ model: srv.model, messages: ask, response_format: rf, temperature, seed, max_tokens: 160 })
            .then((r) => ({ r, what: `temperature ${temperature} seed ${seed}` })),
        );
    for (const { r, what } of await Promise.all(runs)) {
      checkDocument(r.choices[0].message.content, what);
      // A complete document ends with a stop token, or exactly at the budget's end.
      assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason), what);
    }
  });

  test('a tight budget still gives a complete document', async () => {
    const r = await srv.client.chat.completions.create({
      model: srv.model,
      messages: ask,
      response_format: rf,
      temperature: 1.0,
      seed: 9,
      max_tokens: 90,
    });
    checkDocument(r.choices[0].message.content, 'max_tokens 90');
  });

  test('streamed: the content deltas join into a valid document', async () => {
    const s = await collectChat(
      await srv.client.chat.completions.create({
        model: srv.model,
        messages: ask,
        response_format: rf,
        temperature: 0.9,
        seed: 7,
        max_tokens: 160,
        stream: true,
      }),
    );
    assert.ok(s.chunks > 3);
    checkDocument(s.content, 'stream');
  });

  test('with reasoning: reasoning_content first, then the document', async () => {
    for (const seed of [1, 2]) {
      const r = await srv.client.chat.completions.create({
        model: srv.model,
        messages: ask,
        response_format: rf,
        think: true,
        temperature: 0.8,
        seed,
        max_tokens: 200,
      });
      const m = r.choices[0].message;
      assert.ok(m.reasoning_content?.length > 0, 'there is reasoning');
      checkDocument(m.content, `think seed ${seed}`);
    }
  });

  test('json_object gives a JSON object', async () => {
    for (const seed of [1, 2, 3]) {
      const r = await srv.client.chat.completions.create({
        model: srv.model,
        messages: ask,
        response_format: { type: 'json_object' },
        temperature: 1.0,
        seed,
        max_tokens: 120,
      });
      const doc = JSON.parse(r.choices[0].message.content);
      assert.equal(typeof doc, 'object');
      assert.ok(doc !== null && !Array.isArray(doc));
    }
  });

  test('schemas the server cannot enforce are refused', async () => {
    await assert.rejects(
      srv.client.chat.completions.create({
        model: srv.model,
        messages: ask,
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^[a-z]+$' } } },
      }),
      (e) => e instanceof BadRequestError && e.param === 'response_format' && /pattern/.test(e.message),
    );
  });
});
