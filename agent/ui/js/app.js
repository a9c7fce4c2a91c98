// The pages' frame: sign-in state, navigation by the URL's fragment (`#/services/web`), and
// one page mounted at a time, whose requests stop when another replaces it.

import { onUnauthorized, poll, request, session } from './api.js';
import { h } from './dom.js';
import * as signin from './pages/signin.js';
import * as services from './pages/services.js';
import * as service from './pages/service.js';
import * as instance from './pages/instance.js';
import * as zones from './pages/zones.js';
import * as alarms from './pages/alarms.js';
import * as audit from './pages/audit.js';
import * as federation from './pages/federation.js';
import * as proxies from './pages/proxies.js';
import * as proxy from './pages/proxy.js';

/** `[pattern, page, nav entry]`: the fragment's path (without its query) picks the page. */
const ROUTES = [
  [/^\/signin$/, signin, null],
  [/^\/services$/, services, 'services'],
  [/^\/services\/([^/]+)$/, service, 'services'],
  [/^\/instances\/([^/]+)$/, instance, 'services'],
  [/^\/zones$/, zones, 'zones'],
  [/^\/alarms$/, alarms, 'alarms'],
  [/^\/audit$/, audit, 'audit'],
  [/^\/federation$/, federation, 'federation'],
  [/^\/proxies$/, proxies, 'proxies'],
  [/^\/proxies\/([^/]+)\/([^/]+)$/, proxy, 'proxies'],
];

const main = document.getElementById('main');
const nav = document.getElementById('nav');
let current = null; // the mounted page's AbortController
let frame = null; // the frame's own polling (region and leader)
/** The refusal that sent the person back to sign-in, shown there once. */
let refused = null;

onUnauthorized((err) => {
  session.signOut();
  refused = err;
  if (location.hash !== '#/signin') location.hash = '#/signin';
  else route();
});

function route() {
  current?.abort();
  current = new AbortController();
  const [path, query = ''] = location.hash.replace(/^#/, '').split('?');
  const signedIn = Boolean(session.token());
  if (!signedIn && path !== '/signin') {
    location.replace('#/signin');
    return;
  }
  const found = ROUTES.map(([re, page, entry]) => [path.match(re), page, entry]).find(([m]) => m);
  if (!found) {
    location.replace(signedIn ? '#/services' : '#/signin');
    return;
  }
  const [match, page, entry] = found;
  showFrame(signedIn && page !== signin, entry);
  main.replaceChildren();
  const context = {
    signal: current.signal,
    params: match.slice(1).map(decodeURIComponent),
    query: new URLSearchParams(query),
    refused: page === signin ? takeRefused() : null,
  };
  page.mount(main, context);
}

function takeRefused() {
  const r = refused;
  refused = null;
  return r;
}

function showFrame(signedIn, entry) {
  nav.hidden = !signedIn;
  for (const a of nav.querySelectorAll('a')) a.classList.toggle('here', a.dataset.page === entry);
  const who = document.getElementById('who');
  const region = document.getElementById('region');
  if (!signedIn) {
    frame?.abort();
    frame = null;
    who.replaceChildren();
    region.replaceChildren();
    return;
  }
  who.replaceChildren(
    h('span', { class: 'principal', title: 'the principal every request and audit record names' }, session.principal() ?? ''),
    h('button', { type: 'button', class: 'link', onclick: signOut }, 'Sign out'));
  if (!frame) {
    frame = new AbortController();
    poll(async () => {
      const { body } = await request('/v1/status', { signal: frame.signal });
      const leader = body.leader ? `leader ${body.leader.id} at ${body.leader.api}` : 'no leader known';
      region.replaceChildren(
        h('span', {}, `region ${body.region}`),
        h('span', { class: body.is_leader ? 'role leader' : 'role' }, body.is_leader ? 'this member leads' : leader));
    }, 10_000, { signal: frame.signal });
  }
}

function signOut() {
  session.signOut();
  location.hash = '#/signin';
}

window.addEventListener('hashchange', route);
route();
