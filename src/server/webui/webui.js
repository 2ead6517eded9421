// The chat page of glm5 serve: one conversation with the model the server runs,
// streamed from /v1/chat/completions. No framework and nothing fetched from elsewhere.
//
// Safety: the model's text never becomes markup of its own. Replies are rendered by a
// small Markdown subset that escapes every character of the text first and only then
// adds its own tags (links only to http(s) addresses); reasoning, errors and the
// user's messages are set as text. The server's Content-Security-Policy forbids inline
// scripts and event handlers besides.
'use strict';

const $ = (id) => document.getElementById(id);
const state = {
  key: localStorage.getItem('glm5.key') || '',
  messages: [], // {role, content, reasoning, images: [dataURL]}
  controller: null,
  vision: false,
  pending: [], // images to send with the next message
};

// ---- Markdown, safely ----------------------------------------------------------

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
}

// Inline spans of escaped text: code, bold, italics, links.
function inline(escaped) {
  const codes = [];
  let s = escaped.replace(/`([^`\n]+)`/g, (_, c) => {
    codes.push(c);
    return `\u0000${codes.length - 1}\u0000`;
  });
  s = s.replace(/\*\*([^*\n]+)\*\*/g, '<strong>$1</strong>');
  s = s.replace(/(^|[^*])\*([^*\n]+)\*/g, '$1<em>$2</em>');
  // [text](http(s)://...): the address was escaped with the rest; only these schemes.
  s = s.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g,
    (_, text, href) => `<a href="${href}" rel="noopener noreferrer nofollow" target="_blank">${text}</a>`);
  return s.replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${codes[Number(i)]}</code>`);
}

function renderMarkdown(text) {
  const out = [];
  const lines = text.split('\n');
  let para = [];
  let list = null; // 'ul' | 'ol'
  const flushPara = () => {
    if (para.length) out.push(`<p>${inline(escapeHtml(para.join('\n'))).replace(/\n/g, '<br>')}</p>`);
    para = [];
  };
  const closeList = () => {
    if (list) out.push(`</${list}>`);
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^```\s*([\w+-]*)\s*$/);
    if (fence) {
      flushPara();
      closeList();
      const code = [];
      for (i++; i < lines.length && !/^```\s*$/.test(lines[i]); i++) code.push(lines[i]);
      out.push(`<pre><code>${escapeHtml(code.join('\n'))}</code></pre>`);
      continue;
    }
    const h = line.match(/^(#{1,4})\s+(.*)$/);
    const ul = line.match(/^\s*[-*]\s+(.*)$/);
    const ol = line.match(/^\s*\d+[.)]\s+(.*)$/);
    if (h) {
      flushPara();
      closeList();
      const n = h[1].length + 2;
      out.push(`<h${n}>${inline(escapeHtml(h[2]))}</h${n}>`);
    } else if (ul || ol) {
      flushPara();
      const kind = ul ? 'ul' : 'ol';
      if (list !== kind) {
        closeList();
        out.push(`<${kind}>`);
        list = kind;
      }
      out.push(`<li>${inline(escapeHtml((ul || ol)[1]))}</li>`);
    } else if (line.trim() === '') {
      flushPara();
      closeList();
    } else {
      closeList();
      para.push(line);
    }
  }
  flushPara();
  closeList();
  return out.join('');
}

// ---- The page --------------------------------------------------------------------

function headers() {
  const h = { 'content-type': 'application/json' };
  if (state.key) h.authorization = `Bearer ${state.key}`;
  return h;
}

function askKey() {
  return new Promise((resolve) => {
    const dlg = $('keydlg');
    $('keyform').onsubmit = (e) => {
      e.preventDefault();
      state.key = $('key').value;
      localStorage.setItem('glm5.key', state.key);
      dlg.close();
      resolve();
    };
    dlg.showModal();
  });
}

async function loadModel() {
  for (;;) {
    const res = await fetch('/v1/models', { headers: headers() });
    if (res.status === 401) {
      await askKey();
      continue;
    }
    const j = await res.json();
    const m = j.data[0];
    $('model').textContent = m.id;
    $('ctx').textContent = `context ${m.meta.n_ctx.toLocaleString('en')} tokens`;
    state.vision = !!m.meta.vision;
    $('attach').hidden = !state.vision;
    document.title = `${m.id} · glm5.cpp`;
    return;
  }
}

function addMessage(msg) {
  const el = document.createElement('div');
  el.className = `msg ${msg.role}`;
  const who = document.createElement('div');
  who.className = 'who';
  who.textContent = msg.role === 'user' ? 'You' : 'Model';
  el.append(who);
  for (const url of msg.images || []) {
    const img = document.createElement('img');
    img.className = 'attached';
    img.src = url;
    img.alt = 'attached image';
    el.append(img);
  }
  const details = document.createElement('details');
  details.hidden = true;
  const summary = document.createElement('summary');
  summary.textContent = 'Reasoning';
  const reasoning = document.createElement('div');
  reasoning.className = 'reasoning';
  details.append(summary, reasoning);
  const body = document.createElement('div');
  body.className = 'body';
  el.append(details, body);
  $('log').append(el);
  msg.el = el;
  draw(msg);
  return el;
}

function draw(msg) {
  const el = msg.el;
  const details = el.querySelector('details');
  details.hidden = !msg.reasoning;
  el.querySelector('.reasoning').textContent = msg.reasoning || '';
  const body = el.querySelector('.body');
  if (msg.role === 'user') body.textContent = msg.content;
  else body.innerHTML = renderMarkdown(msg.content || '');
  if (msg.error) {
    const e = document.createElement('div');
    e.className = 'error';
    e.textContent = msg.error;
    body.append(e);
  }
  $('log').scrollTop = $('log').scrollHeight;
}

// While a reply streams it is drawn at most once a frame: drawing the whole text at
// every event would take the page's time quadratically in a long reply.
let pendingDraw = null;
function scheduleDraw(msg) {
  if (pendingDraw) return;
  pendingDraw = requestAnimationFrame(() => {
    pendingDraw = null;
    draw(msg);
  });
}
function drawNow(msg) {
  if (pendingDraw) cancelAnimationFrame(pendingDraw);
  pendingDraw = null;
  draw(msg);
}

function apiMessages() {
  return state.messages.filter((m) => !m.error || m.content).map((m) => {
    if (m.role === 'user' && m.images && m.images.length) {
      return { role: 'user', content: [{ type: 'text', text: m.content },
        ...m.images.map((url) => ({ type: 'image_url', image_url: { url } }))] };
    }
    return { role: m.role, content: m.content };
  });
}

function busy(on) {
  $('send').disabled = on;
  $('stop').hidden = !on;
  for (const b of document.querySelectorAll('.regenerate')) b.disabled = on;
}

async function generate() {
  const history = apiMessages();
  const msg = { role: 'assistant', content: '', reasoning: '' };
  state.messages.push(msg);
  const el = addMessage(msg);
  el.dataset.state = 'streaming';
  state.controller = new AbortController();
  busy(true);
  try {
    const res = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: headers(),
      signal: state.controller.signal,
      body: JSON.stringify({ messages: history, stream: true, think: $('think').checked }),
    });
    if (!res.ok) {
      const j = await res.json().catch(() => ({}));
      throw new Error(j.error?.message || `the server answered ${res.status}`);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, at);
        buf = buf.slice(at + 2);
        for (const line of event.split('\n')) {
          if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
          const j = JSON.parse(line.slice(6));
          if (j.error) throw new Error(j.error.message);
          const d = j.choices?.[0]?.delta || {};
          if (d.reasoning_content) msg.reasoning += d.reasoning_content;
          if (d.content) msg.content += d.content;
        }
        scheduleDraw(msg);
      }
    }
    drawNow(msg);
    el.dataset.state = 'done';
  } catch (e) {
    if (e.name === 'AbortError') {
      el.dataset.state = 'stopped';
    } else {
      el.dataset.state = 'error';
      msg.error = String(e.message || e);
    }
    drawNow(msg);
  } finally {
    state.controller = null;
    busy(false);
    showRegenerate();
  }
}

function showRegenerate() {
  for (const b of document.querySelectorAll('.actions')) b.remove();
  const last = state.messages[state.messages.length - 1];
  if (!last || last.role !== 'assistant') return;
  const actions = document.createElement('div');
  actions.className = 'actions';
  const b = document.createElement('button');
  b.type = 'button';
  b.className = 'regenerate';
  b.textContent = 'Regenerate';
  b.onclick = () => {
    const old = state.messages.pop();
    old.el.remove();
    generate();
  };
  actions.append(b);
  last.el.append(actions);
}

function send() {
  const text = $('input').value;
  if ((!text.trim() && !state.pending.length) || state.controller) return;
  const msg = { role: 'user', content: text, images: state.pending };
  state.pending = [];
  $('attachments').replaceChildren();
  state.messages.push(msg);
  addMessage(msg);
  $('input').value = '';
  generate();
}

$('composer').addEventListener('submit', (e) => {
  e.preventDefault();
  send();
});
$('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    send();
  }
});
$('stop').addEventListener('click', () => state.controller?.abort());
$('new').addEventListener('click', () => {
  state.controller?.abort();
  state.messages = [];
  $('log').replaceChildren();
});
$('attach').addEventListener('click', () => $('image').click());
$('image').addEventListener('change', () => {
  for (const f of $('image').files) {
    const r = new FileReader();
    r.onload = () => {
      state.pending.push(r.result);
      const img = document.createElement('img');
      img.src = r.result;
      img.alt = f.name;
      $('attachments').append(img);
    };
    r.readAsDataURL(f);
  }
  $('image').value = '';
});

loadModel().catch((e) => {
  $('model').textContent = `cannot reach the server: ${e.message}`;
});
