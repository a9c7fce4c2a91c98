// The alarms still raised: fraction guards engaged, services with no eligible instance left
// in the region. Polled every 2 s.

import { poll, request } from '../api.js';
import { duration, errorSlot, fill, h, heading, json, table, when } from '../dom.js';

export function mount(root, { signal }) {
  const head = heading('Alarms', 'Raised and cleared by the leader, each by an audit record.');
  const error = errorSlot();
  const body = h('div', {});
  root.append(head.el, error.el, body);
  poll(async () => {
    const { body: alarms } = await request('/v1/alarms', { signal });
    const now = Date.now();
    fill(body, alarms.length
      ? table(['Service', 'Alarm', 'Zone', 'Since', 'Raised by', 'Detail'], alarms.map((a) => h('tr', { dataset: { service: a.service, alarm: a.alarm, zone: a.zone ?? '' } },
        h('td', {}, h('a', { href: `#/services/${encodeURIComponent(a.service)}` }, a.service)),
        h('td', {}, h('span', { class: 'alarm' }, a.alarm.replaceAll('_', ' '))),
        h('td', {}, a.zone ?? '–'),
        h('td', {}, when(a.since_ms), h('span', { class: 'muted' }, ` (${duration(now - a.since_ms)} ago)`)),
        h('td', {}, h('a', { href: `#/audit?kind=alarm&service=${encodeURIComponent(a.service)}` }, `audit #${a.seq}`)),
        h('td', {}, json(a.detail)))), { class: 'alarms' })
      : h('p', { class: 'empty', dataset: { test: 'no-alarms' } }, 'No alarm is raised.'));
    error.show(null);
    head.updated('every 2 s');
  }, 2000, { signal, onError: (err) => { error.show(err); head.failed(); } });
}
