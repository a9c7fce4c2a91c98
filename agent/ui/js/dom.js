// Building the page: elements from data, never HTML from strings (the policy forbids inline
// script, and text from the API is always set as text).

/** An element: `h('a', {href: '#/x', class: 'c'}, 'text', child, [more])`. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG = 'http://www.w3.org/2000/svg';

/** An SVG element, as `h` builds HTML ones. */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'value' && 'value' in el) el.value = v;
    else if (k === 'checked' && 'checked' in el) el.checked = Boolean(v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
}

/** Replaces `el`'s children, skipping the absent ones (`null`, `false`) as `h` does. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
}

/** A duration in milliseconds, for people: `850 ms`, `12.3 s`, `4 min 5 s`, `2 h 3 min`. */
export function duration(ms) {
  if (ms === null || ms === undefined) return '–';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.floor(s % 60)} s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours} h ${m % 60} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

/** A Unix time in milliseconds as local date and time. */
export function when(ms) {
  if (!ms) return '–';
  const d = new Date(ms);
  return `${d.toLocaleDateString()} ${d.toLocaleTimeString()}`;
}

/** A Unix time in milliseconds as local time of day. */
export function clock(ms) {
  return new Date(ms).toLocaleTimeString();
}

/** The verdicts, in the order the pages list them. */
export const VERDICTS = ['eligible', 'degraded', 'unknown', 'ineligible', 'quarantined', 'draining', 'withdrawn'];

/** A verdict as a coloured label. */
export function verdict(v) {
  return h('span', { class: `verdict v-${v ?? 'none'}`, dataset: { verdict: v ?? '' } }, v ?? '–');
}

/** A rule as the evaluator names it, with its details: `hard_failure (class probe)`. */
export function rule(r) {
  if (!r) return '–';
  if (typeof r === 'string') return r;
  const { rule: name, ...rest } = r;
  const more = Object.entries(rest).map(([k, v]) => `${k} ${typeof v === 'object' ? JSON.stringify(v) : v}`);
  return more.length ? `${name} (${more.join(', ')})` : name;
}

/** A table: `columns` are header texts, `rows` arrays of cells (or `<tr>`s). */
export function table(columns, rows, attrs = {}) {
  return h('table', attrs,
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', {}, c)))),
    h('tbody', {}, rows.map((r) => (r instanceof Node ? r : h('tr', {}, r.map((c) => h('td', {}, c)))))));
}

/** A refusal as the API gave it: status, reason, field, message, and what else it said. */
export function refusal(err) {
  const box = h('div', { class: 'refusal', role: 'alert', dataset: { reason: err.reason ?? '', status: String(err.status ?? '') } },
    h('strong', {}, err.status ? `${err.status} ` : '', h('code', {}, err.reason ?? 'error')),
    err.field ? h('span', { class: 'field' }, ` (field ${err.field})`) : null,
    h('p', { class: 'message' }, err.message ?? String(err)));
  const body = err.body;
  if (body?.budget) box.append(h('p', {}, 'budget: ', h('code', {}, body.budget)));
  if (body?.approval) {
    const a = body.approval;
    box.append(h('p', { class: 'approval', dataset: { seq: String(a.seq) } },
      `Recorded as audit #${a.seq}, awaiting approval: ${a.by} may approve it within ${duration(a.window_s * 1000)} (${a.approve}).`));
  }
  return box;
}

/** A `<details>` holding a value as indented JSON. */
export function json(value, label = 'JSON') {
  return h('details', { class: 'json' }, h('summary', {}, label), h('pre', {}, JSON.stringify(value, null, 2)));
}

/** A page heading with a live marker the pages update as their data arrives. */
export function heading(title, hint) {
  const live = h('span', { class: 'live', title: 'when the data last arrived' }, 'loading…');
  return {
    el: h('div', { class: 'heading' }, h('h1', {}, title), live, hint ? h('p', { class: 'hint' }, hint) : null),
    updated: (how) => { live.textContent = `${how} · ${new Date().toLocaleTimeString()}`; live.classList.remove('stale'); },
    failed: () => { live.classList.add('stale'); },
  };
}

/** A place for one error at a time: `show(err)` replaces it, `show(null)` clears it. */
export function errorSlot() {
  const el = h('div', { class: 'error-slot' });
  return { el, show: (err) => fill(el, err ? refusal(err) : null) };
}
