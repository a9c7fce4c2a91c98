// One service: per zone, its instances with verdict, weight, capability and the reason
// (the rule `explain` names). Live: the views and the registrations are followed with
// blocking queries; each instance's `explain` is asked again when they change.

import { follow, request, seg, sleep } from '../api.js';
import { duration, errorSlot, fill, h, heading, rule, table, verdict } from '../dom.js';

/** Explains asked at once, at most: the rest wait (the browser holds 6 connections). */
const EXPLAIN_AT_ONCE = 3;
/** Instances whose reason is asked, at most; the others show their verdict alone. */
const EXPLAIN_MAX = 60;

export function mount(root, { signal, params: [name] }) {
  const head = heading(`Service ${name}`, 'Each endpoint as the published views hold it, and why (the rule that fired). Updated as the views change, without reloading.');
  const error = errorSlot();
  const contract = h('div', { class: 'contract' });
  const body = h('div', {});
  root.append(h('p', { class: 'crumbs' }, h('a', { href: '#/services' }, 'Services'), ' / ', name), head.el, error.el, contract, body);

  let views = null;
  let registrations = null;
  const reasons = new Map();

  request(`/v1/services/${seg(name)}`, { signal }).then(({ body: s }) => {
    const c = s.contract ?? {};
    fill(contract, h('p', { class: 'facts' },
      `owner ${s.owner}`,
      c.probe ? ` · probe ${c.probe.kind} every ${c.probe.interval}` : ' · no probe',
      c.profile ? ` · evidence ${Object.entries(c.profile).filter(([, on]) => on).map(([k]) => k).join(', ')}` : '',
      c.min_healthy !== undefined ? ` · minimum healthy ${c.min_healthy / 10}% per zone` : ''));
  }).catch((err) => { if (!signal.aborted) error.show(err); });

  const render = () => {
    if (!views || !registrations) return;
    fill(body, zoneSections(views, registrations, reasons));
  };

  let explaining = false;
  let again = false;
  const explainAll = async () => {
    if (explaining) { again = true; return; }
    explaining = true;
    do {
      again = false;
      const ids = (registrations ?? []).map((r) => r.instance.id).slice(0, EXPLAIN_MAX);
      const queue = [...ids];
      const worker = async () => {
        while (queue.length && !signal.aborted) {
          const id = queue.shift();
          try {
            const { body: e } = await request(`/v1/instances/${seg(id)}/explain`, { signal });
            reasons.set(id, e);
          } catch (err) {
            if (signal.aborted) return;
            reasons.set(id, { error: err });
          }
        }
      };
      await Promise.all(Array.from({ length: EXPLAIN_AT_ONCE }, worker));
      render();
    } while (again && !signal.aborted);
    explaining = false;
  };

  const onError = (err) => { error.show(err); head.failed(); };
  follow(`/v1/services/${seg(name)}/view`, {
    signal,
    onError,
    onData: (b) => { views = b; error.show(null); head.updated('live'); render(); explainAll(); },
  });
  follow(`/v1/instances?service=${seg(name)}`, {
    signal,
    onError,
    onData: (b) => { registrations = b; render(); explainAll(); },
  });
  // The reason's age moves without any change to follow: refresh it now and then.
  (async () => {
    while (!signal.aborted) {
      await sleep(10_000, signal);
      if (!signal.aborted) explainAll();
    }
  })();
}

/** Each endpoint as its own zone's view holds it (any view, if its zone has none). */
function endpoints(views) {
  const out = new Map();
  for (const v of views) {
    for (const [id, e] of Object.entries(v.view.endpoints ?? {})) {
      const own = v.view.key.zone === e.zone;
      if (!out.has(id) || own) out.set(id, e);
    }
  }
  return out;
}

function zoneSections(views, registrations, reasons) {
  const byId = endpoints(views);
  const markers = views.map((v) => v.view.markers ?? {});
  const guardEngaged = new Set(markers.flatMap((m) => m.health_disregarded ?? []));
  const zones = new Map();
  for (const r of registrations) {
    const z = r.instance.locality.zone;
    if (!zones.has(z)) zones.set(z, []);
    zones.get(z).push(r);
  }
  if (!zones.size) return [h('p', { class: 'empty' }, 'No instance is registered.')];
  return [...zones.keys()].sort().map((zone) => {
    const floor = markers.find((m) => m.zone_floor?.[zone] !== undefined)?.zone_floor?.[zone];
    const evacuating = markers.find((m) => m.evacuating?.[zone] !== undefined)?.evacuating?.[zone];
    const rows = zones.get(zone).map((r) => row(r, byId.get(r.instance.id), reasons.get(r.instance.id)));
    return h('section', { class: 'zone-section', dataset: { zone } },
      h('h2', {}, `Zone ${zone}`,
        guardEngaged.has(zone)
          ? h('span', { class: 'zone guard', dataset: { guard: 'engaged' } }, 'fraction guard engaged: full set published')
          : h('span', { class: 'zone', dataset: { guard: 'off' } }, 'guard off'),
        floor !== undefined ? h('span', { class: 'zone' }, `floor ${floor}`) : null,
        evacuating !== undefined ? h('span', { class: 'zone evac' }, `evacuating: ${evacuating / 10}% moved away`) : null),
      table(['Instance', 'Address', 'Node', 'Verdict', 'Weight', 'Capability', 'Reason', 'Maintenance', 'Tags'], rows, { class: 'instances' }));
  });
}

function row(reg, endpoint, explained) {
  const i = reg.instance;
  // Withdrawn endpoints leave the views; the evaluator's verdict says why.
  const v = endpoint?.verdict ?? (explained && !explained.error ? explained.verdict : 'withdrawn');
  const cap = endpoint?.capability;
  return h('tr', { dataset: { instance: i.id, verdict: v } },
    h('td', {}, h('a', { href: `#/instances/${encodeURIComponent(i.id)}` }, i.id)),
    h('td', { class: 'mono' }, `${i.address.ip}:${i.address.port}`),
    h('td', {}, i.locality.node),
    h('td', { class: 'verdict-cell' }, verdict(v),
      endpoint && endpoint.status !== endpoint.verdict ? ` (${endpoint.status})` : '',
      endpoint ? '' : h('span', { class: 'muted' }, ' not in the views')),
    h('td', { class: 'num' }, endpoint ? String(endpoint.weight) : '–'),
    h('td', {}, cap ? capability(cap) : '–'),
    h('td', { class: 'reason' }, reason(explained)),
    h('td', {}, reg.maintenance ? maintenance(reg.maintenance) : reg.draining ? 'draining' : ''),
    h('td', {}, (i.tags ?? []).join(', ')));
}

export function capability(cap) {
  const classes = Object.entries(cap.profile ?? {}).filter(([, on]) => on).map(([k]) => k);
  return h('span', { class: 'capability' },
    h('span', { class: cap.verified ? 'ok' : 'warn' }, cap.verified ? 'verified' : 'unverified'),
    ` · ${cap.evidence ?? ''}`,
    classes.length ? ` · ${classes.join(', ')}` : '');
}

function reason(explained) {
  if (!explained) return '…';
  if (explained.error) return h('span', { class: 'warn', title: explained.error.message }, explained.error.reason);
  return [rule(explained.rule), explained.for_ms !== undefined ? h('span', { class: 'muted' }, ` for ${duration(explained.for_ms)}`) : ''];
}

/** The registry's maintenance note: the justification and who gave it. */
function maintenance(m) {
  return h('span', { class: 'maintenance' }, 'maintenance: ', typeof m === 'string' ? m : JSON.stringify(m));
}
