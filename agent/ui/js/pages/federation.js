// Federation: the peer regions whose aggregates feed tier 2 of the views, with each one's
// age and staleness, and every link to their members. Polled every 2 s.

import { poll, request } from '../api.js';
import { duration, errorSlot, fill, h, heading, json, table } from '../dom.js';

export function mount(root, { signal }) {
  const head = heading('Federation', 'A peer region is fresh while any link to its members speaks; a stale one keeps its entries, marked stale. Losing replication degrades cross-region resolution and nothing else.');
  const error = errorSlot();
  const body = h('div', {});
  root.append(head.el, error.el, body);
  poll(async () => {
    const { body: f } = await request('/v1/federation/status', { signal });
    fill(body, (f.enabled ? enabled(f) : [h('p', { class: 'empty', dataset: { test: 'federation-off' } },
      `Federation is not enabled on this member of region ${f.region}: it runs no federation endpoint, so no peer region feeds its views.`)]));
    error.show(null);
    head.updated('every 2 s');
  }, 2000, { signal, onError: (err) => { error.show(err); head.failed(); } });
}

function enabled(f) {
  const versions = (v) => Object.entries(v ?? {}).map(([s, n]) => `${s}@${n}`).join(', ') || '–';
  const age = (ms) => (ms === null || ms === undefined ? 'never heard' : duration(ms));
  const stale = (x) => h('span', { class: x ? 'warn' : 'ok' }, x ? 'stale' : 'fresh');
  return [
    h('p', { class: 'facts' }, `region ${f.region} · endpoint ${f.endpoint} · serving ${versions(f.local_versions)}`),
    h('h2', {}, 'Peer regions'),
    (f.regions ?? []).length
      ? table(['Region', 'Links up', 'Age', 'State', 'Versions held'], f.regions.map((r) => h('tr', { dataset: { region: r.region, stale: String(r.stale) } },
        h('td', {}, r.region), h('td', { class: 'num links' }, `${r.links_up}/${r.links}`),
        h('td', { class: 'age', dataset: { ageMs: r.age_ms === null || r.age_ms === undefined ? '' : String(r.age_ms) } }, age(r.age_ms)),
        h('td', {}, stale(r.stale)), h('td', { class: 'mono versions' }, versions(r.versions)))), { class: 'regions' })
      : h('p', { class: 'empty' }, 'No peer region is configured.'),
    h('h2', {}, 'Links'),
    (f.links ?? []).length
      ? table(['Region', 'Member', 'Address', 'Role', 'Connected', 'Age', 'State', 'Last error'], f.links.map((l) => [
        l.region, l.member, l.addr, l.role, l.connected ? 'yes' : 'no', age(l.age_ms), stale(l.stale), l.last_error ?? '–']))
      : h('p', { class: 'empty' }, 'No link.'),
    // `null` without region routing; an empty map when no peer's front door is probed.
    f.front_doors ? [h('h2', {}, 'Front doors'), Object.keys(f.front_doors).length
      ? table(['Region', 'Signal'], Object.entries(f.front_doors).map(([r, d]) => [r, json(d, 'signal')]))
      : h('p', { class: 'empty' }, 'No peer region\u2019s front door is probed.')] : null,
  ];
}
