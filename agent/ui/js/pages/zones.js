// Zones: the region's zones with their evacuations in force, the controls to evacuate and
// shift back (needs `evacuate`; refused as the API refuses them), and peer regions'
// failovers. Polled every 2 s.

import { poll, request, seg } from '../api.js';
import { errorSlot, fill, h, heading, json, refusal, table } from '../dom.js';

export function mount(root, { signal }) {
  const head = heading('Zones', 'Evacuation moves a zone\u2019s traffic to the other zones in steps; shift-back brings it back. A manual evacuation (a failover) holds its shift-back for explicit completion.');
  const error = errorSlot();
  const result = h('div', { class: 'result', id: 'zone-result' });
  const body = h('div', {});
  const failovers = h('div', {});
  root.append(head.el, error.el, result, body, h('h2', {}, 'Peer region failovers'), failovers);

  const act = async (zone, intent) => {
    try {
      const { body: b } = await request(`/v1/zones/${seg(zone)}/evacuation`, { method: 'POST', signal, body: intent });
      fill(result, h('p', { class: 'granted', dataset: { zone, action: intent.action } },
        `Granted: ${intent.action.replaceAll('_', ' ')} of zone ${zone}.`), json(b.applied, 'what was applied'));
      await load();
    } catch (err) {
      if (!signal.aborted) fill(result, h('p', {}, `Zone ${zone}, ${intent.action.replaceAll('_', ' ')}:`), refusal(err));
    }
  };

  const load = async () => {
    const [{ body: z }, { body: instances }, { body: f }] = await Promise.all([
      request('/v1/zones', { signal }),
      request('/v1/instances', { signal }),
      request('/v1/federation/failovers', { signal }),
    ]);
    const counts = new Map();
    for (const i of instances) counts.set(i.instance.locality.zone, (counts.get(i.instance.locality.zone) ?? 0) + 1);
    const names = [...new Set([...counts.keys(), ...Object.keys(z.evacuations ?? {})])].sort();
    fill(body, names.length
      ? table(['Zone', 'Instances', 'Evacuation', 'Moved away', '', 'Controls'], names.map((zone) => zoneRow(zone, counts.get(zone) ?? 0, z.evacuations?.[zone], act)), { class: 'zones' })
      : h('p', { class: 'empty' }, 'No zone holds an instance yet.'));
    const entries = Object.entries(f ?? {});
    fill(failovers, entries.length
      ? table(['Region', 'Failover'], entries.map(([region, record]) => [region, json(record, summary(record))]))
      : h('p', { class: 'empty' }, 'No peer region is failed over.'));
    error.show(null);
    head.updated('every 2 s');
  };
  poll(load, 2000, { signal, onError: (err) => { error.show(err); head.failed(); } });
}

function zoneRow(zone, count, evacuation, act) {
  const manual = h('input', { type: 'checkbox', id: `manual-${zone}` });
  const state = !evacuation ? 'none'
    : evacuation.awaiting_completion ? 'awaiting completion'
      : evacuation.back ? 'shifting back' : 'evacuating';
  return h('tr', { dataset: { zone, evacuation: state } },
    h('td', {}, zone),
    h('td', { class: 'num' }, String(count)),
    h('td', {}, state, evacuation?.manual ? ' (manual)' : ''),
    h('td', { class: 'num' }, evacuation ? `${evacuation.moved / 10}%` : '–'),
    h('td', {}, evacuation ? h('progress', { max: '1000', value: String(evacuation.moved) }) : ''),
    h('td', { class: 'controls' },
      h('button', { type: 'button', dataset: { action: 'evacuate' }, onclick: () => act(zone, { action: 'evacuate', manual: manual.checked }) }, 'Evacuate'),
      h('label', { class: 'inline', for: `manual-${zone}` }, manual, ' manual'),
      h('button', { type: 'button', dataset: { action: 'shift_back' }, onclick: () => act(zone, { action: 'shift_back' }) }, 'Shift back'),
      h('button', { type: 'button', dataset: { action: 'complete_shift_back' }, onclick: () => act(zone, { action: 'complete_shift_back' }) }, 'Complete shift-back')));
}

function summary(record) {
  if (!record || typeof record !== 'object') return String(record);
  const moved = record.moved !== undefined ? `${record.moved / 10}% moved` : '';
  return [record.back ? 'shifting back' : 'failed over', moved, record.manual ? 'manual' : ''].filter(Boolean).join(', ');
}
