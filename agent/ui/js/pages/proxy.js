// One sidecar, as `waymark proxy-config` shows it: what the xDS client of a node agent holds,
// asked of that agent over its session with the leader (`/v1/proxy-config/{node}/{client}`).
// Each cluster and load assignment with the version the client was sent against the one
// served now, and the endpoints of the current ones with weight, Envoy's health and
// waymark's markers. Polled every 2 s.

import { poll, request, seg } from '../api.js';
import { duration, errorSlot, fill, h, heading, table, verdict } from '../dom.js';

export function mount(root, { signal, params: [node, client] }) {
  const head = heading(`Sidecar ${client}`, 'What this xDS client holds, as its node agent answers: a version held that is not the one served now is behind; endpoints are listed for the current load assignments.');
  const error = errorSlot();
  const crumbs = h('p', { class: 'crumbs' }, h('a', { href: '#/proxies' }, 'Proxies'), ` / ${node} / ${client}`);
  const summary = h('div', { class: 'summary' });
  const clusters = h('div', {});
  const assignments = h('div', {});
  root.append(crumbs, head.el, error.el, summary,
    h('h2', {}, 'Clusters'), clusters,
    h('h2', {}, 'Load assignments'), assignments);
  poll(async () => {
    const { body: doc } = await request(`/v1/proxy-config/${seg(node)}/${seg(client)}`, { signal });
    fill(summary, facts(doc));
    fill(clusters, doc.clusters?.length
      ? table(['Cluster', 'Held', 'Served now', 'Current'], doc.clusters.map((c) => h('tr', { dataset: { cluster: c.name, current: String(c.current) } },
        h('td', {}, c.name), h('td', { class: 'mono' }, c.version), h('td', { class: 'mono' }, c.served_version ?? 'no longer served'),
        h('td', {}, current(c.current)))), { class: 'clusters' })
      : h('p', { class: 'empty' }, doc.clusters_left_out ? `${doc.clusters_left_out} clusters left out: the answer\u2019s bound.` : 'The client holds no cluster.'));
    fill(assignments, (doc.endpoints ?? []).length
      ? [doc.endpoints.map(assignment),
        doc.endpoints_left_out ? h('p', { class: 'warn' }, `${doc.endpoints_left_out} endpoints left out: the answer\u2019s bound.`) : null]
      : h('p', { class: 'empty' }, 'The client holds no load assignment.'));
    error.show(null);
    head.updated('every 2 s');
  }, 2000, { signal, onError: (err) => { error.show(err); head.failed(); } });
}

function facts(doc) {
  return h('dl', { class: 'facts' },
    h('dt', {}, 'node agent'), h('dd', {}, doc.node),
    h('dt', {}, 'cluster'), h('dd', {}, doc.cluster ?? '–'),
    h('dt', {}, 'zone'), h('dd', {}, doc.zone ?? '–'),
    h('dt', {}, 'protocol'), h('dd', {}, doc.protocol ?? '–'),
    h('dt', {}, 'state'), h('dd', { dataset: { test: 'state' } }, h('span', { class: `sync s-${String(doc.state).toLowerCase()}` }, doc.state ?? '–')),
    h('dt', {}, 'connected for'), h('dd', {}, duration(doc.connected_for_ms)),
    h('dt', {}, 'snapshot'), h('dd', { class: 'mono' }, String(doc.snapshot_version)),
    h('dt', {}, 'view age'), h('dd', {}, duration(doc.view_age_ms)));
}

/** One load assignment: its versions, and its endpoints when the client holds the current one. */
function assignment(la) {
  const endpoints = la.endpoints ?? [];
  return h('section', { class: 'assignment', dataset: { cluster: la.cluster, current: String(la.current) } },
    h('h3', {}, la.cluster, ' ', current(la.current),
      h('span', { class: 'muted' }, ` · held ${la.version} · served ${la.served_version ?? 'no longer'}`),
      la.health_disregarded ? h('span', { class: 'zone guard' }, 'health disregarded: full set published') : ''),
    la.endpoints === null || la.endpoints === undefined
      ? h('p', { class: 'empty' }, la.endpoints_left_out ? `${la.endpoints_left_out} endpoints left out: the answer\u2019s bound.` : 'Endpoints are listed for the current version only.')
      : table(['Address', 'Instance', 'Zone', 'Priority', 'Weight', 'Health', 'Status', 'Verdict', 'Verified'], endpoints.map((e) => h('tr', { dataset: { address: e.address ?? '', health: e.health } },
        h('td', { class: 'mono' }, e.address ?? '–'),
        h('td', {}, e.instance ? h('a', { href: `#/instances/${encodeURIComponent(e.instance)}` }, String(e.instance)) : '–'),
        h('td', {}, e.zone ?? '–'),
        h('td', { class: 'num' }, String(e.priority)),
        h('td', { class: 'num' }, e.weight === null || e.weight === undefined ? '–' : String(e.weight)),
        h('td', {}, h('span', { class: e.health === 'HEALTHY' ? 'ok' : 'warn' }, e.health)),
        h('td', {}, e.status === null || e.status === undefined ? '–' : String(e.status)),
        h('td', {}, typeof e.verdict === 'string' ? verdict(e.verdict) : '–'),
        h('td', {}, e.verified === true ? 'yes' : e.verified === false ? 'no' : '–'))), { class: 'endpoints' }));
}

function current(yes) {
  return h('span', { class: yes ? 'ok' : 'warn' }, yes ? 'current' : 'behind');
}
