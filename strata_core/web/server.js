// The server view: what each model's engine is doing, read once a second from
// GET /v1/strata/status (the figures /metrics exports, and their last minutes).

import { call } from './api.js';
import { el } from './markdown.js';

const $ = (id) => document.getElementById(id);
const SVG = 'http://www.w3.org/2000/svg';
let timer = null;

export function watch(on) {
  clearTimeout(timer);
  timer = null;
  if (on) poll();
}

async function poll() {
  try {
    const status = await (await call('/v1/strata/status')).json();
    $('server-error').hidden = true;
    $('models').replaceChildren(...status.models.map(card));
  } catch (e) {
    $('server-error').textContent = `The status could not be read: ${e.message}`;
    $('server-error').hidden = false;
  }
  timer = setTimeout(poll, 1000);
}

function card(m) {
  const head = el('h2', m.name, ' ', small(`${m.backend} \u00b7 ${m.state}`));
  const box = el('article', head);
  box.className = 'model';
  box.dataset.model = m.name;
  if (m.state !== 'ready') {
    if (m.restarts) box.append(el('p', `engine restarts: ${m.restarts}`));
    return box;
  }
  const busy = el('span', `${m.busy} / ${m.slots.length}`);
  busy.className = 'slots-busy';
  const slots = el('div', ...m.slots.map(slot));
  slots.className = 'slots';
  const hist = m.history;
  const plots = el('div', plot('tokens/s', hist.map((p) => p.tokens_per_s), (v) => v.toFixed(1)),
                   plot('time to first token', hist.map((p) => p.ttft_s), (v) => `${(v * 1000).toFixed(0)} ms`));
  plots.className = 'plots';
  box.append(el('h3', 'Slots busy ', busy, small(` \u00b7 queue ${m.queue}`)), slots, plots, figures(m));
  return box;
}

function slot(s) {
  const text = s.busy ? `${s.generated} tok \u00b7 ${s.seconds.toFixed(1)} s` : 'idle';
  const node = el('div', el('b', `#${s.slot}`), ' ', text);
  node.className = s.busy ? 'slot busy' : 'slot';
  node.title = s.busy ? `prompt ${s.prompt_tokens} tokens, ${s.generated} generated` : 'idle';
  return node;
}

function figures(m) {
  const pct = (x) => (x == null ? '\u2013' : `${(x * 100).toFixed(1)} %`);
  const kv = m.kv_cache;
  const mib = kv.bytes_per_slot ? `, ${(kv.bytes_per_slot / 2 ** 20).toFixed(1)} MiB a slot` : '';
  const pc = m.prompt_cache;
  const sp = m.speculation;
  const r = m.requests;
  const rows = [
    ['KV cache held', meter(kv.usage), `${pct(kv.usage)} of ${m.slots.length} \u00d7 ${m.n_ctx} (${kv.type_k}/${kv.type_v}${mib})`],
    ['prompt cache', meter(pc.hit_rate || 0), `${pct(pc.hit_rate)} of ${pc.prompt_tokens} prompt tokens reused (host ${pc.host_mib} MiB)`],
    ['speculation', meter(sp.acceptance || 0), `${sp.mode}: ${pct(sp.acceptance)} of ${sp.drafted} drafts accepted`],
    ['requests', '', `${r.total} \u00b7 errors ${r.errors} \u00b7 cancelled ${r.cancelled} \u00b7 refused ${r.refused}`],
    ['engine restarts', '', String(m.restarts)],
  ];
  const table = el('table', ...rows.map(([name, bar, text]) => el('tr', el('th', name), el('td', bar), el('td', text))));
  table.className = 'figures';
  return table;
}

function meter(fraction) {
  const bar = el('meter');
  bar.value = fraction;
  return bar;
}

function small(text) {
  return el('small', text);
}

/** A small line plot of the history (null values leave gaps), with its latest value. */
function plot(title, values, format) {
  const w = 240, h = 56;
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  const top = Math.max(0, ...values.filter((v) => v != null)) || 1;
  let d = '';
  let gap = true;
  values.forEach((v, i) => {
    if (v == null) { gap = true; return; }
    const x = values.length > 1 ? (i / (values.length - 1)) * w : w;
    const y = (h - 2 - (v / top) * (h - 4)).toFixed(1);
    d += gap ? `M${x.toFixed(1)},${y}l0.1,0` : `L${x.toFixed(1)},${y}`;  // a lone point shows as a dot
    gap = false;
  });
  const path = document.createElementNS(SVG, 'path');
  path.setAttribute('d', d);
  svg.append(path);
  const last = [...values].reverse().find((v) => v != null);
  const fig = el('figure', el('figcaption', title, ' ', el('b', last == null ? '\u2013' : format(last)),
                                 small(` max ${format(top)}`)), svg);
  fig.className = 'plot';
  return fig;
}
