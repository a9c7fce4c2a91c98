// Every service: its verdict counts, evidence mode, and each zone's fraction guard. Live:
// `/v1/services` and `/v1/instances` are followed with blocking queries.

import { follow } from '../api.js';
import { VERDICTS, errorSlot, fill, h, heading, table, verdict } from '../dom.js';

export function mount(root, { signal }) {
  const head = heading('Services', 'Instances per verdict, and per zone whether the fraction guard is engaged (the zone\u2019s full set published, health disregarded). Updated as the registry changes, without reloading.');
  const error = errorSlot();
  const body = h('div', {});
  root.append(head.el, error.el, body);
  let services = null;
  let instances = null;

  const render = () => {
    if (!services) return;
    const zones = zonesByService(instances ?? []);
    const rows = services.map((s) => h('tr', { dataset: { service: s.service } },
      h('td', {}, h('a', { href: `#/services/${encodeURIComponent(s.service)}` }, s.service)),
      h('td', {}, s.owner),
      h('td', { class: 'num' }, String(s.instances)),
      h('td', { class: 'verdicts' }, verdictCounts(s.verdicts)),
      h('td', {}, s.evidence_mode ?? '–'),
      h('td', { class: 'zones' }, guardChips(s, zones.get(s.service))),
      h('td', {}, s.no_eligible_in_region ? h('span', { class: 'alarm' }, 'no eligible instance in the region') : ''),
      h('td', { class: 'mono' }, s.version ?? '–')));
    fill(body, services.length
      ? table(['Service', 'Owner', 'Instances', 'Verdicts', 'Evidence', 'Zones (guard)', 'Alarm', 'View version'], rows, { class: 'services' })
      : h('p', { class: 'empty' }, 'No service is declared yet (waymark services apply -f …).'));
  };

  const onError = (err) => { error.show(err); head.failed(); };
  follow('/v1/services', {
    signal,
    onError,
    onData: (b) => { services = b; error.show(null); head.updated('live'); render(); },
  });
  follow('/v1/instances', {
    signal,
    onError,
    onData: (b) => { instances = b; render(); },
  });
}

/** Per service, its zones and how many instances each holds. */
function zonesByService(instances) {
  const out = new Map();
  for (const i of instances) {
    const svc = i.instance.service;
    const zone = i.instance.locality.zone;
    if (!out.has(svc)) out.set(svc, new Map());
    const zones = out.get(svc);
    zones.set(zone, (zones.get(zone) ?? 0) + 1);
  }
  return out;
}

export function verdictCounts(verdicts) {
  const known = VERDICTS.filter((v) => verdicts?.[v]);
  const others = Object.keys(verdicts ?? {}).filter((v) => !VERDICTS.includes(v));
  return [...known, ...others].map((v) => {
    const chip = verdict(v);
    chip.dataset.count = String(verdicts[v]);
    chip.append(` ${verdicts[v]}`);
    return chip;
  });
}

function guardChips(service, zones) {
  const engaged = new Set(service.health_disregarded ?? []);
  const names = new Set([...(zones?.keys() ?? []), ...engaged]);
  return [...names].sort().map((z) => h('span', {
    class: engaged.has(z) ? 'zone guard' : 'zone',
    dataset: { zone: z, guard: engaged.has(z) ? 'engaged' : 'off' },
    title: engaged.has(z) ? 'fraction guard engaged: the full set is published' : 'guard off',
  }, z, zones?.has(z) ? ` · ${zones.get(z)}` : '', engaged.has(z) ? ' · guard engaged' : ''));
}
