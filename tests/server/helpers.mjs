// Shared pieces of the glm5 serve end-to-end tests: start the real server on a free
// loopback port (--port 0; the port is read from its "listening on" line), an
// official openai client pointed at it, metrics, and stream collection.
import { spawn } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, '..', '..');

export const BINARY = process.env.GLM5_BINARY ?? resolve(repo, 'build', 'glm5');
export const MODEL = process.env.GLM5_MODEL ?? resolve(repo, 'tests', 'data', 'glm-dsa', 'tiny.gguf');

// Starts `glm5 serve` with extra flags; resolves once it listens. apiKey: the key the
// server was given (--api-key), for the openai client.
export async function startServer(extra = [], { apiKey = 'unused' } = {}) {
  const args = ['serve', '-m', MODEL, '--host', '127.0.0.1', '--port', '0', '--threads', '1', ...extra];
  const proc = spawn(BINARY, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const exited = new Promise((res) => proc.on('exit', (code, signal) => res({ code, signal })));
  const port = await new Promise((res, rej) => {
    const timer = setTimeout(() => rej(new Error(`glm5 serve did not start:\n${log}`)), 60000);
    proc.stderr.on('data', (d) => {
      log += d; // always drained, so the server never blocks on a full pipe
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        res(Number(m[1]));
      }
    });
    exited.then(({ code }) => {
      clearTimeout(timer);
      rej(new Error(`glm5 serve exited (${code}) before listening:\n${log}`));
    });
  });
  const url = `http://127.0.0.1:${port}`;
  if (extra.includes('--api-key')) keys.set(url, apiKey);
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
  const model = (await client.models.list()).data[0].id;
  return {
    proc,
    port,
    url,
    client,
    model,
    log: () => log,
    // SIGTERM, then the exit code (SIGKILL after 30 s).
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 30000);
      const { code } = await exited;
      clearTimeout(timer);
      return code;
    },
  };
}

// The keys servers were started with, by URL (/metrics needs one where it is set).
const keys = new Map();

// /metrics as {name: value} for the unlabelled samples.
export async function metrics(url) {
  const key = keys.get(url);
  const headers = key ? { authorization: `Bearer ${key}` } : {};
  const text = await (await fetch(`${url}/metrics`, { headers })).text();
  const out = {};
  for (const line of text.split('\n')) {
    const m = line.match(/^(glm5_[a-z_]+) (\S+)$/);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls fn() until it returns something truthy; that value, or throws after timeoutMs.
export async function waitFor(fn, timeoutMs, what) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(20);
  }
}

// Reads a chat stream to the end: the text of each kind, tool-call deltas, the
// finish reason and the usage chunk.
export async function collectChat(stream) {
  const r = { content: '', reasoning: '', toolDeltas: [], finish: null, usage: null, chunks: 0, ids: new Set(), order: [] };
  for await (const chunk of stream) {
    r.chunks++;
    r.ids.add(chunk.id);
    if (chunk.usage) r.usage = chunk.usage;
    for (const c of chunk.choices) {
      const d = c.delta ?? {};
      if (d.reasoning_content) {
        r.reasoning += d.reasoning_content;
        r.order.push('reasoning');
      }
      if (d.content) {
        r.content += d.content;
        r.order.push('content');
      }
      if (d.tool_calls) r.toolDeltas.push(...d.tool_calls);
      if (c.finish_reason) r.finish = c.finish_reason;
    }
  }
  return r;
}

// Reads a completions stream: {text, finish, usage}.
export async function collectCompletion(stream) {
  const r = { text: '', finish: null, usage: null };
  for await (const chunk of stream) {
    if (chunk.usage) r.usage = chunk.usage;
    for (const c of chunk.choices) {
      r.text += c.text ?? '';
      if (c.finish_reason) r.finish = c.finish_reason;
    }
  }
  return r;
}
