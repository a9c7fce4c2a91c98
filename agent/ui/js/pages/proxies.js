// Proxy status, as `waymark proxy-status` shows it: the node agents this member's xDS tier
// serves, with versions sent and acknowledged per type, and under each node the sidecars
// its agent reported, each linking to what it holds (pages/proxy.js). Polled every 2 s.

import { poll, request } from '../api.js';
import { duration, errorSlot, fill, h, heading, table } from '../dom.js';

export function mount(root, { signal }) {
  const head = heading('Proxies', 'SYNCED: every type acknowledged at the version sent; STALE: a version sent and not yet acknowledged; NACK: the last one refused.');
  const error = errorSlot();
  const agents = h('div', {});
  const sidecars = h('div', {});
  root.append(head.el, error.el, h('h2', {}, 'Node agents served by this member'), agents, h('h2', {}, 'Sidecars, as their node agents report them'), sidecars);
  poll(async () => {
    const [{ body: clients }, { body: reports }] = await Promise.all([
      request('/v1/proxy-status', { signal }),
      request('/v1/proxy-status/sidecars', { signal }),
    ]);
    fill(agents, clients.length
      ? table(['Node', 'Zone', 'Protocol', 'Identity', 'Connected for', 'State', 'Types'], clients.map((c) => h('tr', { dataset: { node: c.node } },
        h('td', {}, c.node), h('td', {}, c.zone), h('td', {}, c.protocol), h('td', { class: 'mono' }, c.identity ?? '–'),
        h('td', {}, duration(c.connected_for_ms)),
        h('td', {}, c.standby ? h('span', { class: 'muted' }, 'STANDBY') : state(c.types)),
        h('td', {}, types(c.types)))), { class: 'agents' })
      : h('p', { class: 'empty' }, 'No node agent streams from this member.'));
    fill(sidecars, (reports.nodes ?? []).map((n) => h('section', { class: 'node', dataset: { node: n.node } },
      h('h3', {}, n.node, ' ', h('span', { class: n.session_open ? 'ok' : 'warn' }, n.session_open ? 'session open' : 'session closed'),
        h('span', { class: 'muted' }, ` · reported ${duration(n.reported_ms_ago)} ago · view age ${duration(n.view_age_ms)}`),
        n.clients_left_out ? h('span', { class: 'warn' }, ` · ${n.clients_left_out} clients left out`) : ''),
      (n.sidecars ?? []).length
        ? table(['Client', 'Cluster', 'Zone', 'Protocol', 'State', 'Connected for', 'Types'], n.sidecars.map((c) => h('tr', { dataset: { client: c.client } },
          h('td', {}, h('a', { href: `#/proxies/${encodeURIComponent(n.node)}/${encodeURIComponent(c.client)}`, title: 'what it holds' }, c.client)),
          h('td', {}, c.cluster ?? '–'), h('td', {}, c.zone ?? '–'), h('td', {}, c.protocol ?? '–'),
          h('td', {}, h('span', { class: `sync s-${String(c.state).toLowerCase()}` }, c.state ?? '–')),
          h('td', {}, duration(c.connected_for_ms)), h('td', {}, types(c.types)))))
        : h('p', { class: 'empty' }, 'No sidecar connected to this agent.'))));
    if (!(reports.nodes ?? []).length) fill(sidecars, h('p', { class: 'empty' }, 'No node agent has reported yet.'));
    error.show(null);
    head.updated('every 2 s');
  }, 2000, { signal, onError: (err) => { error.show(err); head.failed(); } });
}

function state(types) {
  const all = Object.values(types ?? {});
  const s = all.some((t) => t.last_nack) ? 'NACK' : all.every((t) => t.in_sync) ? 'SYNCED' : 'STALE';
  return h('span', { class: `sync s-${s.toLowerCase()}` }, s);
}

function types(t) {
  return h('ul', { class: 'types' }, Object.entries(t ?? {}).map(([name, v]) => h('li', {},
    h('strong', {}, name), ` sent ${v.sent ?? '–'} · acked ${v.acked ?? '–'}`,
    v.resources !== undefined ? ` · ${v.resources} resources` : '',
    v.nacks ? h('span', { class: 'warn' }, ` · ${v.nacks} NACKs${v.last_nack ? `: ${typeof v.last_nack === 'string' ? v.last_nack : JSON.stringify(v.last_nack)}` : ''}`) : '')));
}
