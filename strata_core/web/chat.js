// The chat view: conversations kept in this browser, each with its model and sampling
// settings, sent to /v1/chat/completions and streamed back (reasoning folded apart, tool
// calls shown as calls, the seed each reply used offered for reuse).

import { ApiError, call, sseData } from './api.js';
import { el, markdown } from './markdown.js';

const STORE = 'strata.conversations';
const CURRENT = 'strata.current';
const NUMBERS = ['temperature', 'top_p', 'max_tokens', 'seed'];
const DROPPED = 'The stream was cut off before the reply finished (the connection dropped or the server stopped).';

const $ = (id) => document.getElementById(id);
let conversations = [];
let current = null;
let models = [];
let pending = [];        // images (data URLs) attached to the message being written
let running = null;      // {controller, msg, node} while a reply streams

export function init() {
  try { conversations = JSON.parse(localStorage.getItem(STORE) || '[]'); } catch { conversations = []; }
  current = conversations.find((c) => c.id === localStorage.getItem(CURRENT)) || null;
  $('new-chat').onclick = () => { current = null; show(); $('prompt').focus(); };
  $('composer').onsubmit = (e) => { e.preventDefault(); send(); };
  $('prompt').onkeydown = (e) => { if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); send(); } };
  $('stop').onclick = () => running?.controller.abort();
  $('attach').onclick = () => $('files').click();
  $('files').onchange = attach;
  $('model').onchange = () => { if (current) { current.model = $('model').value; save(); } attachable(); };
  $('settings-form').oninput = () => { if (current) { current.settings = readSettings(); save(); } };
  $('menu').onclick = () => document.body.classList.toggle('sidebar-open');
  show();
  loadModels();
}

async function loadModels() {
  try {
    models = (await (await call('/v1/models')).json()).data;
  } catch (e) {
    notice(`Could not list the models: ${e.message}`);
    return;
  }
  $('model').replaceChildren(...models.map((m) => new Option(m.id, m.id)));
  if (current && models.some((m) => m.id === current.model)) $('model').value = current.model;
  attachable();
}

function attachable() {
  const model = models.find((m) => m.id === $('model').value);
  $('attach').hidden = !(model?.inputs || []).includes('image');
}

// ---- conversations ------------------------------------------------------------------

function fresh() {
  return { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: 'New conversation',
           model: $('model').value, settings: readSettings(), messages: [] };
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(conversations));
    localStorage.setItem(CURRENT, current?.id || '');
  } catch (e) {
    notice(`This browser's storage is full; the conversation is not saved: ${e.message}`);
  }
}

function readSettings() {
  const f = $('settings-form').elements;
  const s = Object.fromEntries(NUMBERS.map((k) => [k, f[k].value]));
  return { ...s, think: f.think.checked, extra: f.extra.value };
}

function writeSettings(s) {
  const f = $('settings-form').elements;
  for (const k of NUMBERS) f[k].value = s?.[k] ?? '';
  f.think.checked = !!s?.think;
  f.extra.value = s?.extra ?? '';
}

function show() {
  if (current) {
    writeSettings(current.settings);
    if (models.some((m) => m.id === current.model)) $('model').value = current.model;
  }
  attachable();
  listConversations();
  $('messages').replaceChildren(...(current?.messages || []).map((m, i) => message(m, i)));
  scrollDown();
  localStorage.setItem(CURRENT, current?.id || '');
  document.body.classList.remove('sidebar-open');
}

function listConversations() {
  $('conversations').replaceChildren(...conversations.map((c) => {
    const open = el('button', c.title);
    open.type = 'button';
    open.className = 'open';
    open.onclick = () => { current = c; show(); };
    const drop = el('button', '\u00d7');
    drop.type = 'button';
    drop.title = 'Delete';
    drop.onclick = () => {
      conversations = conversations.filter((o) => o !== c);
      if (current === c) current = null;
      save();
      show();
    };
    const li = el('li', open, drop);
    if (c === current) li.className = 'current';
    return li;
  }));
}

// ---- messages -----------------------------------------------------------------------

function message(m, index) {
  const node = el('div');
  node.className = `msg ${m.role}`;
  fill(node, m, index);
  return node;
}

/** (Re)build a message's node from the message. */
function fill(node, m, index) {
  const parts = [];
  if (m.role === 'user') {
    parts.push(el('div', m.content));
    for (const url of m.images || []) {
      const img = el('img');
      img.src = url;
      img.alt = 'attached image';
      parts.push(img);
    }
  } else {
    if (m.reasoning) {
      const fold = el('details', el('summary', m.pending && !m.content ? 'Thinking\u2026' : 'Reasoning'),
                      el('div', m.reasoning));
      fold.className = 'reasoning';
      fold.open = node.querySelector('details.reasoning')?.open || false;
      parts.push(fold);
    }
    const content = el('div', markdown(m.content || ''));
    content.className = 'content';
    if (m.content || m.pending) parts.push(content);
    for (const tc of m.tool_calls || []) parts.push(toolCall(m, tc));
    if (m.error) parts.push(Object.assign(el('div', m.error), { className: 'error' }));
    parts.push(footer(m, index));
  }
  node.replaceChildren(...parts);
}

function toolCall(m, tc) {
  const result = el('input');
  result.placeholder = 'tool result (sent with the next message)';
  result.value = m.results?.[tc.id] ?? '';
  result.oninput = () => { m.results = { ...m.results, [tc.id]: result.value }; save(); };
  const box = el('div', el('div', 'call ', el('code', tc.function.name)), el('pre', tc.function.arguments), result);
  box.className = 'tool-call';
  return box;
}

function footer(m, index) {
  const bits = [];
  if (m.pending) bits.push('generating\u2026');
  if (m.stopped) bits.push('stopped');
  if (m.finish) bits.push(`finish: ${m.finish}`);
  if (m.usage) bits.push(`${m.usage.completion_tokens} tokens`);
  const foot = el('div', bits.join(' \u00b7 '));
  foot.className = 'meta';
  if (m.seed) {
    const use = el('button', `seed ${m.seed}`);
    use.type = 'button';
    use.title = 'Use this seed for the next replies (Settings)';
    use.onclick = () => { $('settings-form').elements.seed.value = m.seed; $('settings-form').oninput(); };
    foot.append(use);
  }
  if (!m.pending && index === current.messages.length - 1 && !running) {
    const again = el('button', 'Regenerate');
    again.type = 'button';
    again.className = 'regenerate';
    again.onclick = () => { current.messages.splice(index); show(); reply(); };
    foot.append(again);
  }
  return foot;
}

// ---- sending ------------------------------------------------------------------------

async function attach() {
  for (const file of $('files').files) {
    pending.push(await new Promise((ok, fail) => {
      const r = new FileReader();
      r.onload = () => ok(r.result);
      r.onerror = () => fail(r.error);
      r.readAsDataURL(file);
    }));
  }
  $('files').value = '';
  showAttachments();
}

function showAttachments() {
  $('attachments').replaceChildren(...pending.map((url, i) => {
    const img = el('img');
    img.src = url;
    img.alt = 'attached image';
    const drop = el('button', '\u00d7');
    drop.type = 'button';
    drop.onclick = () => { pending.splice(i, 1); showAttachments(); };
    return el('span', img, drop);
  }));
}

function send() {
  const text = $('prompt').value.trim();
  if (running || (!text && !pending.length)) return;
  if (!current) {
    current = fresh();
    conversations.unshift(current);
  }
  if (current.messages.length === 0) current.title = (text || 'image').slice(0, 48);
  current.model = $('model').value;
  current.messages.push({ role: 'user', content: text, images: pending });
  pending = [];
  showAttachments();
  $('prompt').value = '';
  save();
  show();
  reply();
}

/** The conversation's messages as the API takes them (a failed reply left out). */
function history(messages) {
  const out = [];
  for (const m of messages) {
    if (m.role === 'user') {
      const images = (m.images || []).map((url) => ({ type: 'image_url', image_url: { url } }));
      out.push({ role: 'user', content: images.length ? [{ type: 'text', text: m.content }, ...images] : m.content });
    } else if (m.content || m.tool_calls?.length) {
      const calls = m.tool_calls?.length ? { tool_calls: m.tool_calls } : {};
      out.push({ role: 'assistant', content: m.content || null, ...calls });
      for (const tc of m.tool_calls || []) out.push({ role: 'tool', tool_call_id: tc.id, content: m.results?.[tc.id] ?? '' });
    }
  }
  return out;
}

function requestBody(conv) {
  const s = conv.settings;
  const body = { model: conv.model, messages: history(conv.messages), stream: true, stream_options: { include_usage: true } };
  for (const k of NUMBERS) if (s[k] !== '' && s[k] != null) body[k] = Number(s[k]);
  if (body.seed != null && JSON.rawJSON) body.seed = JSON.rawJSON(BigInt(s.seed).toString());  // 64-bit seeds, exactly
  if (s.think) body.chat_template_kwargs = { enable_thinking: true };
  if (s.extra?.trim()) {
    try { Object.assign(body, JSON.parse(s.extra)); } catch (e) { throw new ApiError(`extra request fields are not JSON: ${e.message}`); }
  }
  return body;
}

async function reply() {
  const conv = current;
  const msg = { role: 'assistant', content: '', reasoning: '', tool_calls: [], pending: true };
  conv.settings = readSettings();
  let body;
  try { body = requestBody(conv); } catch (e) { msg.error = e.message; }
  conv.messages.push(msg);
  const node = message(msg, conv.messages.length - 1);
  $('messages').append(node);
  scrollDown();
  if (msg.error) return finish(conv, msg, node);
  running = { controller: new AbortController(), msg, node };
  $('stop').hidden = false;
  $('send').hidden = true;
  let streaming = false;
  try {
    const res = await call('/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
      signal: running.controller.signal,
    });
    msg.seed = res.headers.get('x-strata-seed');
    streaming = true;
    let done = false;
    for await (const data of sseData(res)) {
      if (data === '[DONE]') { done = true; break; }
      apply(msg, JSON.parse(data));
      redraw(conv, msg, node);
    }
    if (!done) msg.error = DROPPED;
  } catch (e) {
    if (e.name === 'AbortError') msg.stopped = true;
    else if (streaming && e instanceof TypeError) msg.error = `${DROPPED} (${e.message})`;
    else if (e instanceof TypeError) msg.error = `The server could not be reached: ${e.message}`;
    else msg.error = e.message;
  }
  finish(conv, msg, node);
}

/** One SSE chunk into the reply; an error event ends it with its message. */
function apply(msg, chunk) {
  if (chunk.error) throw new ApiError(chunk.error.message || JSON.stringify(chunk.error));
  if (chunk.usage) msg.usage = chunk.usage;
  const choice = chunk.choices?.[0];
  if (!choice) return;
  const d = choice.delta || {};
  if (d.reasoning_content) msg.reasoning += d.reasoning_content;
  if (d.content) msg.content += d.content;
  for (const t of d.tool_calls || []) {
    const tc = msg.tool_calls[t.index] ||= { id: t.id, type: 'function', function: { name: '', arguments: '' } };
    if (t.id) tc.id = t.id;
    if (t.function?.name) tc.function.name += t.function.name;
    if (t.function?.arguments) tc.function.arguments += t.function.arguments;
  }
  if (choice.finish_reason) msg.finish = choice.finish_reason;
}

let frame = 0;
function redraw(conv, msg, node) {
  if (frame) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    if (conv === current && node.isConnected) { fill(node, msg, conv.messages.indexOf(msg)); scrollDown(); }
  });
}

function finish(conv, msg, node) {
  msg.pending = false;
  running = null;
  $('stop').hidden = true;
  $('send').hidden = false;
  save();
  if (conv === current) show();
  else if (node.isConnected) fill(node, msg, conv.messages.indexOf(msg));
}

function scrollDown() {
  const box = $('messages');
  box.scrollTop = box.scrollHeight;
}

function notice(text) {
  $('notice').textContent = text;
  $('notice').hidden = !text;
}
