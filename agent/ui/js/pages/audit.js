// The audit log, newest first, filtered by kind, service, actor and instance (the filters
// are the page's address: `#/audit?kind=override&actor=token/dev`). New records are asked
// for every 2 s after the last one seen.

import { poll, request, withQuery } from '../api.js';
import { errorSlot, fill, h, heading, json, table, when } from '../dom.js';

const KINDS = ['transition', 'override', 'denial', 'policy', 'existence', 'alarm', 'reconciliation', 'acl'];
const FILTERS = ['kind', 'service', 'actor', 'instance'];
/** Records per request (the API's ceiling is 10,000). */
const PAGE = 5000;
/** Records shown, the newest. */
const SHOWN = 500;

export function mount(root, { signal, query }) {
  const head = heading('Audit log', 'Every transition, override (granted or refused), policy change, existence change, alarm and access-control change, as replicated.');
  const error = errorSlot();
  const filters = Object.fromEntries(FILTERS.map((f) => [f, query.get(f) ?? '']));
  const inputs = {
    kind: h('select', { id: 'audit-kind', name: 'kind' }, h('option', { value: '' }, 'any kind'),
      KINDS.map((k) => h('option', { value: k }, k))),
    service: h('input', { id: 'audit-service', name: 'service', type: 'text', placeholder: 'any service' }),
    actor: h('input', { id: 'audit-actor', name: 'actor', type: 'text', placeholder: 'any actor (token/dev, waymark, …)' }),
    instance: h('input', { id: 'audit-instance', name: 'instance', type: 'text', placeholder: 'any instance' }),
  };
  for (const f of FILTERS) inputs[f].value = filters[f];
  const form = h('form', { class: 'filters', method: 'post', onsubmit: apply },
    FILTERS.map((f) => [h('label', { for: `audit-${f}` }, f), inputs[f]]),
    h('button', { type: 'submit' }, 'Filter'),
    h('button', { type: 'button', class: 'link', onclick: () => { location.hash = '#/audit'; } }, 'Clear'));
  const count = h('p', { class: 'muted' });
  const body = h('div', {});
  root.append(head.el, form, error.el, count, body);

  function apply(event) {
    event.preventDefault();
    const q = new URLSearchParams();
    for (const f of FILTERS) if (inputs[f].value.trim()) q.set(f, inputs[f].value.trim());
    const s = q.toString();
    location.hash = s ? `#/audit?${s}` : '#/audit';
  }

  let records = [];
  let matched = 0;
  let since = 0;
  poll(async () => {
    let fresh = 0;
    for (;;) {
      const { body: page } = await request(withQuery('/v1/audit', { ...filters, since_seq: since || undefined, limit: PAGE }), { signal });
      for (const r of page) since = Math.max(since, r.seq);
      records = records.concat(page).slice(-SHOWN);
      matched += page.length;
      fresh += page.length;
      if (page.length < PAGE) break;
    }
    if (fresh || !body.firstChild) {
      count.textContent = `${matched} record${matched === 1 ? '' : 's'} match${matched > SHOWN ? `; the newest ${SHOWN} shown` : ''}.`;
      fill(body, records.length
        ? table(['#', 'When', 'Kind', 'Actor', 'Service', 'Instance', 'Outcome', 'Detail'], [...records].reverse().map(row), { class: 'audit' })
        : h('p', { class: 'empty' }, 'No record matches.'));
    }
    error.show(null);
    head.updated('every 2 s');
  }, 2000, { signal, onError: (err) => { error.show(err); head.failed(); } });
}

function row(r) {
  return h('tr', { dataset: { seq: String(r.seq), kind: r.kind, outcome: r.outcome ?? '' } },
    h('td', { class: 'num' }, String(r.seq)),
    h('td', {}, when(r.at_ms)),
    h('td', {}, r.kind),
    h('td', {}, r.actor),
    h('td', {}, r.service ? h('a', { href: `#/services/${encodeURIComponent(r.service)}` }, r.service) : '–'),
    h('td', {}, r.instance ? h('a', { href: `#/instances/${encodeURIComponent(r.instance)}` }, r.instance) : '–'),
    h('td', {}, h('span', { class: `outcome o-${r.outcome}` }, r.outcome ?? '–')),
    h('td', { class: 'detail' }, headline(r), json(r.detail)));
}

/** The detail's gist: a justification, a reason, a rule. */
function headline(r) {
  const d = r.detail ?? {};
  const parts = [];
  if (d.justification) parts.push(`“${d.justification}”`);
  if (d.reason) parts.push(typeof d.reason === 'string' ? d.reason : JSON.stringify(d.reason));
  if (d.rule?.rule) parts.push(d.rule.rule);
  if (d.budget) parts.push(`budget ${d.budget}`);
  return parts.length ? h('span', { class: 'gist' }, parts.join(' · '), ' ') : null;
}
