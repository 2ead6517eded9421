// The chat page at / in a real browser: Debian's Chromium driven by playwright-core.
// It shows the model and context, streams a reply as it is generated, stops a long one
// (the server cancels it), regenerates, folds reasoning away, asks for the API key a
// server has, and never runs HTML a reply holds. --no-webui turns the page off.
// GLM5_SCREENSHOT=PATH saves a screenshot of a conversation (docs/webui.png).
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { chromium } from 'playwright-core';
import { metrics, startServer, waitFor } from './helpers.mjs';

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
let browser;
let srv;

before(async () => {
  assert.ok(existsSync(CHROMIUM), `no browser at ${CHROMIUM}: scripts/deps.sh installs Debian's chromium`);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    // The flags a closed network needs (no background connections to Google's hosts).
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'],
  });
  srv = await startServer(['--ctx-size', '32768', '--temp', '0', '--seed', '1']);
});
after(async () => {
  await browser?.close();
  if (srv) assert.equal(await srv.stop(), 0);
});

async function open(url) {
  const page = await browser.newPage({ viewport: { width: 1000, height: 700 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  await page.goto(url);
  return { page, errors };
}

async function say(page, text) {
  await page.fill('#input', text);
  await page.press('#input', 'Enter');
}

describe('chat page', () => {
  test('shows the model and context, and streams a reply', async () => {
    const { page, errors } = await open(srv.url);
    await page.waitForFunction(() => document.querySelector('#ctx').textContent.includes('32,768'));
    assert.equal(await page.textContent('#model'), srv.model);
    // A long reply (the tiny model's replies end early: the page's request is made
    // long), its text recorded at every change the page makes while it streams.
    await page.route('**/v1/chat/completions', async (route) => {
      const body = JSON.parse(route.request().postData());
      await route.continue({ postData: JSON.stringify({ ...body, ignore_eos: true, max_tokens: 3000 }) });
    });
    await page.evaluate(() => {
      window.__seen = [];
      new MutationObserver(() => {
        const r = [...document.querySelectorAll('.msg.assistant')].pop();
        if (r) window.__seen.push([r.dataset.state, r.querySelector('.body').textContent.length]);
      }).observe(document.querySelector('#log'), { subtree: true, childList: true, characterData: true });
    });
    await say(page, 'Hello there');
    const reply = page.locator('.msg.assistant').last();
    await page.waitForSelector('.msg.assistant[data-state=done]', { timeout: 120000 });
    const seen = await page.evaluate(() => window.__seen);
    const partial = new Set(seen.filter(([s, n]) => s === 'streaming' && n > 0).map(([, n]) => n));
    const final = (await reply.locator('.body').textContent()).length;
    assert.ok(partial.size >= 2, `text seen while streaming: ${JSON.stringify(seen.slice(0, 20))}`);
    assert.ok([...partial].every((n) => n <= final));
    assert.equal(await page.locator('.msg.user .body').textContent(), 'Hello there');
    assert.deepEqual(errors, []);
    if (process.env.GLM5_SCREENSHOT) await page.screenshot({ path: process.env.GLM5_SCREENSHOT });
    await page.close();
  });

  test('stop ends a long reply and the server cancels it', async () => {
    const m0 = await metrics(srv.url);
    const { page } = await open(srv.url);
    await page.waitForFunction(() => document.querySelector('#ctx').textContent !== '');
    // The tiny model's replies end early: the request the page sends is made long.
    await page.route('**/v1/chat/completions', async (route) => {
      const body = JSON.parse(route.request().postData());
      await route.continue({ postData: JSON.stringify({ ...body, ignore_eos: true, max_tokens: 30000 }) });
    });
    await say(page, 'Tell me a long story');
    const reply = page.locator('.msg.assistant').last();
    await waitFor(async () => (await reply.locator('.body').textContent()).length > 20, 30000, 'some text');
    assert.equal(await page.isVisible('#stop'), true);
    await page.click('#stop');
    await waitFor(async () => (await reply.getAttribute('data-state')) === 'stopped', 10000, 'the reply to stop');
    assert.equal(await page.isVisible('#stop'), false);
    await waitFor(async () => (await metrics(srv.url)).glm5_busy_slots === 0, 10000, 'the slot to free');
    const m1 = await metrics(srv.url);
    assert.equal(m1.glm5_requests_cancelled_total, m0.glm5_requests_cancelled_total + 1);
    assert.ok(m1.glm5_generated_tokens_total - m0.glm5_generated_tokens_total < 30000);
    await page.close();
  });

  test('regenerate replaces the last reply', async () => {
    const { page } = await open(srv.url);
    await page.waitForFunction(() => document.querySelector('#ctx').textContent !== '');
    let posts = 0;
    page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) posts++; });
    await say(page, 'Hello there');
    await page.waitForSelector('.msg.assistant[data-state=done]');
    const first = await page.locator('.msg.assistant .body').textContent();
    await page.click('.regenerate');
    await page.waitForSelector('.msg.assistant[data-state=done]');
    assert.equal(await page.locator('.msg.assistant').count(), 1);
    // Greedy (--temp 0): the same reply again.
    assert.equal(await page.locator('.msg.assistant .body').textContent(), first);
    assert.equal(posts, 2);
    await page.close();
  });

  test('reasoning is shown folded', async () => {
    const { page } = await open(srv.url);
    await page.waitForFunction(() => document.querySelector('#ctx').textContent !== '');
    await page.check('#think');
    await say(page, 'Hello there');
    await page.waitForSelector('.msg.assistant[data-state=done]');
    const details = page.locator('.msg.assistant details');
    assert.equal(await details.isVisible(), true);
    assert.equal(await details.getAttribute('open'), null);
    assert.ok((await page.locator('.msg.assistant .reasoning').textContent()).length > 0);
    await page.close();
  });

  test('HTML in a reply is shown as text and never runs', async () => {
    const { page, errors } = await open(srv.url);
    await page.waitForFunction(() => document.querySelector('#ctx').textContent !== '');
    const evil = [
      '<img src=x onerror="window.__pwned=1">',
      '<script>window.__pwned=2</script>',
      '[click](javascript:window.__pwned=3)',
      '**bold** and `<b>code</b>`',
      '```\n<svg onload="window.__pwned=4">\n```',
    ].join('\n\n');
    // The server's reply, as a stream of OpenAI chunks holding that text.
    await page.route('**/v1/chat/completions', (route) => {
      const chunk = (content) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content } }] })}\n\n`;
      route.fulfill({
        status: 200,
        headers: { 'content-type': 'text/event-stream' },
        body: chunk(evil.slice(0, 20)) + chunk(evil.slice(20)) + 'data: [DONE]\n\n',
      });
    });
    await say(page, 'say something dangerous');
    await page.waitForSelector('.msg.assistant[data-state=done]');
    const body = page.locator('.msg.assistant .body');
    assert.equal(await page.evaluate(() => window.__pwned), undefined);
    assert.equal(await body.locator('img, script, svg, [onerror], [onload]').count(), 0);
    assert.equal(await body.locator('a').count(), 0);
    const text = await body.textContent();
    assert.ok(text.includes('<img src=x onerror="window.__pwned=1">'), text);
    assert.ok(text.includes('<script>window.__pwned=2</script>'), text);
    assert.equal(await body.locator('strong').textContent(), 'bold');
    assert.equal(await body.locator('p code').textContent(), '<b>code</b>');
    // The user's own text is text too.
    await page.unroute('**/v1/chat/completions');
    assert.deepEqual(errors.filter((e) => !e.includes('Content Security Policy')), []);
    await page.close();
  });

  test('a server with an API key: the page asks for it and then works', async () => {
    const keyed = await startServer(['--api-key', 'sk-page'], { apiKey: 'sk-page' });
    try {
      const { page } = await open(keyed.url);
      await page.waitForSelector('#keydlg[open]');
      await page.fill('#key', 'sk-page');
      await page.click('#keyform button');
      await page.waitForFunction(() => document.querySelector('#ctx').textContent !== '');
      await say(page, 'Hello');
      await page.waitForSelector('.msg.assistant[data-state=done]', { timeout: 60000 });
      await page.close();
      // Without the key the API refuses; the page itself needs none.
      const res = await fetch(`${keyed.url}/v1/models`);
      assert.equal(res.status, 401);
      const html = await fetch(`${keyed.url}/`);
      assert.equal(html.status, 200);
      assert.match(html.headers.get('content-security-policy'), /script-src 'self'/);
    } finally {
      assert.equal(await keyed.stop(), 0);
    }
  });

  test('images, with a vision tower', async () => {
    const data = new URL('../data', import.meta.url).pathname;
    const vis = await startServer(['-m', `${data}/glm5next/tiny.gguf`, '--mmproj', `${data}/glm5next/mmproj-tiny.gguf`,
                                   '--ctx-size', '256', '--cache-type', 'f32']);
    try {
      const { page, errors } = await open(vis.url);
      await page.waitForSelector('#attach', { state: 'visible' });
      let sent = null;
      page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) sent = JSON.parse(r.postData()); });
      await page.setInputFiles('#image', `${data}/glm5next/img-a.png`);
      await page.waitForSelector('#attachments img');
      await say(page, 'What is in the picture?');
      await page.waitForSelector('.msg.assistant[data-state=done]', { timeout: 60000 });
      const parts = sent.messages[0].content;
      assert.equal(parts[1].type, 'image_url');
      assert.match(parts[1].image_url.url, /^data:image\/png;base64,/);
      assert.equal(await page.locator('.msg.user img.attached').count(), 1);
      assert.equal(await page.locator('.msg.assistant .error').count(), 0);
      assert.deepEqual(errors, []);
      await page.close();
    } finally {
      assert.equal(await vis.stop(), 0);
    }
  });

  test('--no-webui turns the page off', async () => {
    const off = await startServer(['--no-webui']);
    try {
      assert.equal((await fetch(`${off.url}/`)).status, 404);
      assert.equal((await fetch(`${off.url}/webui.js`)).status, 404);
    } finally {
      assert.equal(await off.stop(), 0);
    }
  });
});
