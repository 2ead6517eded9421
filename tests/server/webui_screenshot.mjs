// The screenshot of the chat page in docs/usage.md (docs/webui.png): the embedded default
// model (it writes King James English) answers one message.
//   node tests/server/webui_screenshot.mjs docs/webui.png
import { chromium } from 'playwright-core';
import { startServer } from './helpers.mjs';

const out = process.argv[2] ?? 'webui.png';
const srv = await startServer(['-m', new URL('../../models/kjv-mini.gguf', import.meta.url).pathname, '--seed', '3']);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
         '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage({ viewport: { width: 900, height: 560 } });
  await page.goto(srv.url);
  await page.waitForFunction(() => document.querySelector('#ctx').textContent !== '');
  await page.fill('#input', 'Tell me a verse about light.');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.msg.assistant[data-state=done]', { timeout: 60000 });
  await page.fill('#input', 'Continue this verse: And God said');
  await page.screenshot({ path: out });
  console.log(`wrote ${out}`);
} finally {
  await browser.close();
  await srv.stop();
}
