// One instance: `explain` (the verdict, the rule, evidence per class with the check's own
// output), its transitions over time from the audit log, and the override (maintenance by
// hand, justified, within the disruption budget) with the API's answer as it gives it.

import { poll, request, seg, withQuery } from '../api.js';
import { timeline } from '../chart.js';
import { duration, errorSlot, fill, h, heading, json, refusal, rule, table, verdict } from '../dom.js';

/** Transition records fetched per request. */
const PAGE = 1000;
/** Explain answers kept for the chart (an hour at one every 2 s). */
const OBSERVED_MAX = 1800;

export function mount(root, { signal, params: [id] }) {
  const head = heading(`Instance ${id}`, 'Why it has its verdict, asked of the leader\u2019s evaluator every 2 s.');
  const error = errorSlot();
  const crumbs = h('p', { class: 'crumbs' }, h('a', { href: '#/services' }, 'Services'), ' / …');
  const summary = h('div', { class: 'summary' });
  const classes = h('div', {});
  const chart = h('div', { class: 'chart' });
  const text = h('div', {});
  root.append(crumbs, head.el, error.el, summary, classes,
    h('h2', {}, 'Transitions'), chart,
    h('h2', {}, 'Override'), overrideForm(id, signal, () => refresh()),
    h('h2', {}, 'Approve a refused override'), approveForm(signal, () => refresh()),
    text);

  let explained = null;
  // Weights between transitions (slow start's steps are not audited), as seen on this page.
  const observed = [];
  const refresh = async () => {
    const { body } = await request(`/v1/instances/${seg(id)}/explain`, { signal });
    explained = body;
    observed.push({ at_ms: Date.now(), verdict: body.verdict, weight: body.eligibility?.weight ?? 0, rule: rule(body.rule) });
    if (observed.length > OBSERVED_MAX) observed.shift();
    error.show(null);
    head.updated('every 2 s');
    render();
  };
  const render = () => {
    const e = explained;
    fill(crumbs, h('a', { href: '#/services' }, 'Services'), ' / ',
      h('a', { href: `#/services/${encodeURIComponent(e.service)}` }, e.service), ' / ', id);
    fill(summary, h('dl', { class: 'facts' },
      h('dt', {}, 'verdict'), h('dd', { dataset: { test: 'verdict' } }, verdict(e.verdict)),
      h('dt', {}, 'for'), h('dd', {}, duration(e.for_ms)),
      h('dt', {}, 'rule'), h('dd', { dataset: { test: 'rule' } }, rule(e.rule)),
      h('dt', {}, 'weight'), h('dd', {}, e.eligibility?.weight !== undefined ? String(e.eligibility.weight) : '–'),
      e.eligibility?.drain_cause ? [h('dt', {}, 'drained by'), h('dd', {}, e.eligibility.drain_cause)] : null,
      h('dt', {}, 'evidence'), h('dd', {}, e.evidence ?? '–'),
      h('dt', {}, 'capability'), h('dd', {}, (e.capability?.classes ?? []).join(', ') || 'none', ' · ',
        e.capability?.verified ? 'verified now' : 'not verified now'),
      h('dt', {}, 'flap window'), h('dd', {}, `${e.flap_transitions} transitions; quarantine level ${e.quarantine_level}`)));
    fill(classes, 
      h('h2', {}, 'Evidence per class'),
      table(['Class', 'Provided', 'Score', 'Last sample', 'From', 'Age'], (e.classes ?? []).map((c) => h('tr', { dataset: { class: c.class } },
        h('td', {}, c.class),
        h('td', {}, c.provided ? 'yes' : 'no'),
        h('td', { class: 'num' }, c.silent ? h('span', { class: 'muted' }, 'silent') : `${(c.score / 10).toFixed(1)}%`),
        h('td', { class: 'check' }, c.last ?? '–'),
        h('td', {}, c.reporter ?? '–'),
        h('td', { class: 'num' }, c.age_ms === null ? '–' : duration(c.age_ms)))), { class: 'evidence' }),
      e.dependencies?.length ? [h('h2', {}, 'Dependencies'), json(e.dependencies, `${e.dependencies.length} declared`)] : null);
    fill(text, h('h2', {}, 'As the CLI explains it'), h('pre', { class: 'explain' }, e.text ?? ''));
  };

  poll(refresh, 2000, { signal, onError: (err) => { error.show(err); head.failed(); } });
  followTransitions(id, chart, signal, observed);
}

/**
 * The transition records of `id` from the audit log, drawn again as new ones arrive, with
 * the weights `observed` since the page opened.
 */
async function followTransitions(id, chart, signal, observed) {
  const points = [];
  let since = 0;
  await poll(async () => {
    for (;;) {
      const { body } = await request(withQuery('/v1/audit', { kind: 'transition', instance: id, since_seq: since || undefined, limit: PAGE }), { signal });
      for (const r of body) {
        since = Math.max(since, r.seq);
        points.push({
          at_ms: r.at_ms,
          verdict: r.outcome,
          weight: r.detail?.eligibility?.weight ?? 0,
          rule: rule(r.detail?.rule),
        });
      }
      if (body.length < PAGE) break;
    }
    const drawn = [...points, ...observed.filter((o) => !points.length || o.at_ms > points[0].at_ms)].sort((a, b) => a.at_ms - b.at_ms);
    fill(chart, timeline(drawn, Date.now()),
      h('p', { class: 'legend' }, 'Band: the verdict (hover for when and why). Line: the weight. From the audit log\u2019s transition records, and the weights seen here since the page opened; ',
        h('a', { href: `#/audit?kind=transition&instance=${encodeURIComponent(id)}` }, 'the records'), '.'));
  }, 2000, { signal, onError: (err) => fill(chart, refusal(err)) });
}

function overrideForm(id, signal, changed) {
  const action = h('select', { name: 'action', id: 'override-action' },
    h('option', { value: 'maintenance_on' }, 'maintenance on (take it out of rotation)'),
    h('option', { value: 'maintenance_off' }, 'maintenance off (put it back)'));
  const justification = h('input', { name: 'justification', id: 'override-justification', type: 'text', maxlength: '1024', placeholder: 'why (required, audited)' });
  const button = h('button', { type: 'submit', id: 'override-submit' }, 'Override');
  const result = h('div', { class: 'result', id: 'override-result' });
  return h('form', { class: 'action', method: 'post', onsubmit: submit },
    h('p', { class: 'hint' }, 'Needs override:<service>. Justified, rate-limited, audited granted or refused, and checked against the disruption budget.'),
    h('label', { for: 'override-action' }, 'Action'), action,
    h('label', { for: 'override-justification' }, 'Justification'), justification,
    button, result);

  async function submit(event) {
    event.preventDefault();
    button.disabled = true;
    try {
      const { body } = await request('/v1/overrides', {
        method: 'POST',
        signal,
        body: { instance: id, action: action.value, justification: justification.value },
      });
      fill(result, h('p', { class: 'granted', dataset: { applied: String(body.applied) } },
        `Granted: ${body.applied} instance${body.applied === 1 ? '' : 's'} changed (${action.value}).`));
      changed();
    } catch (err) {
      if (!signal.aborted) fill(result, refusal(err));
    } finally {
      button.disabled = false;
    }
  }
}

function approveForm(signal, changed) {
  const seq = h('input', { name: 'seq', id: 'approve-seq', type: 'number', min: '1', placeholder: 'audit #' });
  const justification = h('input', { name: 'justification', id: 'approve-justification', type: 'text', maxlength: '1024', placeholder: 'why (required, audited)' });
  const button = h('button', { type: 'submit', id: 'approve-submit' }, 'Approve');
  const result = h('div', { class: 'result', id: 'approve-result' });
  return h('form', { class: 'action', method: 'post', onsubmit: submit },
    h('p', { class: 'hint' }, 'Break-glass: a different principal, authorised for the same services, approves exactly one override the budget refused, within ten minutes.'),
    h('label', { for: 'approve-seq' }, 'Audit #'), seq,
    h('label', { for: 'approve-justification' }, 'Justification'), justification,
    button, result);

  async function submit(event) {
    event.preventDefault();
    button.disabled = true;
    try {
      const { body } = await request(`/v1/overrides/${seg(seq.value.trim())}/approve`, {
        method: 'POST',
        signal,
        body: { justification: justification.value },
      });
      fill(result, h('p', { class: 'granted', dataset: { approved: String(body.approved), applied: String(body.applied) } },
        `Approved #${body.approved}: ${body.applied} instance${body.applied === 1 ? '' : 's'} changed.`));
      changed();
    } catch (err) {
      if (!signal.aborted) fill(result, refusal(err));
    } finally {
      button.disabled = false;
    }
  }
}
