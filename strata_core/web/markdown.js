// Markdown to DOM nodes. Text only ever reaches the page through text nodes, so nothing a
// model writes becomes markup. Blocks: fenced code, headings, lists, quotes, rules,
// paragraphs; inline: code, bold, italics, links (http and https only).

export function el(tag, ...children) {
  const node = document.createElement(tag);
  node.append(...children);
  return node;
}

const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)/;
const HEADING = /^(#{1,6})\s+(.*)/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^\s*>/;
const ITEM = /^\s*(?:[-*+]|(\d+)[.)])\s+/;

function startsBlock(line) {
  return [FENCE, HEADING, RULE, QUOTE, ITEM].some((re) => re.test(line));
}

export function markdown(text) {
  const out = document.createDocumentFragment();
  const lines = text.split('\n');
  for (let i = 0; i < lines.length;) {
    const line = lines[i];
    let m;
    if ((m = line.match(FENCE))) {
      const body = [];
      for (i++; i < lines.length && !lines[i].trimStart().startsWith(m[1]); i++) body.push(lines[i]);
      i++;  // the closing fence (absent while a reply streams: the block runs to the end)
      out.append(codeBlock(body.join('\n'), m[2]));
    } else if (!line.trim()) {
      i++;
    } else if ((m = line.match(HEADING))) {
      out.append(el(`h${Math.min(m[1].length + 2, 6)}`, ...inline(m[2])));
      i++;
    } else if (RULE.test(line)) {
      out.append(el('hr'));
      i++;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      for (; i < lines.length && QUOTE.test(lines[i]); i++) quoted.push(lines[i].replace(/^\s*> ?/, ''));
      out.append(el('blockquote', markdown(quoted.join('\n'))));
    } else if ((m = line.match(ITEM))) {
      const list = el(m[1] ? 'ol' : 'ul');
      for (; i < lines.length && ITEM.test(lines[i]); i++) list.append(el('li', ...inline(lines[i].replace(ITEM, ''))));
      out.append(list);
    } else {
      const para = [line];
      for (i++; i < lines.length && lines[i].trim() && !startsBlock(lines[i]); i++) para.push(lines[i]);
      out.append(el('p', ...inline(para.join('\n'))));
    }
  }
  return out;
}

function codeBlock(code, lang) {
  const copy = el('button', 'copy');
  copy.type = 'button';
  copy.className = 'copy';
  copy.onclick = () => navigator.clipboard?.writeText(code);
  const block = el('div', el('div', el('span', lang || 'code'), copy), el('pre', el('code', code)));
  block.className = 'code';
  block.firstChild.className = 'code-head';
  return block;
}

const INLINE = /(`+)([\s\S]*?)\1|\*\*([\s\S]+?)\*\*|\*([^*\n]+)\*|(?<!\w)_([^_\n]+)_(?!\w)|\[([^\]\n]+)\]\(([^)\s]+)\)|\n/g;

/** The nodes of one run of inline Markdown. */
function inline(text) {
  const nodes = [];
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) nodes.push(text.slice(last, m.index));
    const [all, ticks, code, bold, em, em2, label, href] = m;
    if (ticks) nodes.push(el('code', code));
    else if (bold) nodes.push(el('strong', ...inline(bold)));
    else if (em || em2) nodes.push(el('em', ...inline(em || em2)));
    else if (label) nodes.push(link(label, href));
    else if (all === '\n') nodes.push(el('br'));
    last = m.index + all.length;
  }
  if (last < text.length) nodes.push(text.slice(last));
  return nodes;
}

function link(label, href) {
  if (!/^https?:\/\//i.test(href)) return `[${label}](${href})`;  // no javascript:, data: ...
  const a = el('a', ...inline(label));
  a.href = href;
  a.target = '_blank';
  a.rel = 'noopener noreferrer';
  return a;
}
