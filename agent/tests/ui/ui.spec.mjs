// The authority's web UI in a real headless Chromium, driven by playwright-core, against a
// running dev region. Run by agent/tests/ui.rs, which starts the region (with a real Envoy on
// its node agent and a federated peer region beside it) and answers this script's questions
// on stdin (what the CLI sees, minting a token, switching a demo backend's mode, what Envoy's
// admin API says it holds, stopping the peer region): a line `@ask {json}` on stdout, one
// JSON line back.
//
// Environment (set by ui.rs):
//   WAYMARK_UI_URL        https://127.0.0.1:<port> — the authority API (and UI) of the region
//   WAYMARK_UI_TOKEN      the dev operator's token
//   WAYMARK_UI_SPKI       base64 SHA-256 of the served certificate's SubjectPublicKeyInfo:
//                         Chromium trusts exactly that certificate, and no other
//   WAYMARK_UI_INSTANCES  {"web-az1-1": "web-r1", …}: the demo backends' instance ids
//   WAYMARK_UI_SIDECAR    the xDS node id of the Envoy on the dev node agent
//   WAYMARK_UI_PEER       the region federated with the dev region
//   WAYMARK_UI_PEER_STALE_MS  how long this region lets the peer be silent before it is stale
//   WAYMARK_UI_SHOTS      where the screenshots go
//   CHROMIUM_BIN          the browser (default /usr/bin/chromium)
//   WAYMARK_UI_MODULES    the directory whose node_modules holds playwright-core (default: here)
//
// Every page must load without a console error; the only ones allowed are the browser's own
// "Failed to load resource" lines for the refusals a check provokes on purpose.

import { createRequire } from 'node:module';
import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const modules = process.env.WAYMARK_UI_MODULES || here;
const { chromium } = createRequire(join(modules, 'package.json'))('playwright-core');

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (agent/tests/ui.rs sets it)`);
  return v;
};
const BASE = env('WAYMARK_UI_URL');
const TOKEN = env('WAYMARK_UI_TOKEN');
const SPKI = env('WAYMARK_UI_SPKI');
const IDS = JSON.parse(env('WAYMARK_UI_INSTANCES'));
const SIDECAR = env('WAYMARK_UI_SIDECAR');
const PEER = env('WAYMARK_UI_PEER');
const PEER_STALE_MS = Number(env('WAYMARK_UI_PEER_STALE_MS'));
const SHOTS = env('WAYMARK_UI_SHOTS');
const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
/** How long one state may take to show (evaluation, publication, a blocking query's answer). */
const WAIT = 30_000;

// --- the questions to ui.rs ---------------------------------------------------------------
const answers = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function ask(question) {
  process.stdout.write(`@ask ${JSON.stringify(question)}\n`);
  const { value, done } = await answers.next();
  if (done) throw new Error('ui.rs closed stdin');
  return JSON.parse(value);
}

// --- the browser ----------------------------------------------------------------------------
mkdirSync(SHOTS, { recursive: true });
rmSync(join(SHOTS, 'failure.png'), { force: true });
const profile = mkdtempSync(join(tmpdir(), 'waymark-ui-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: CHROMIUM,
  headless: true,
  viewport: { width: 1280, height: 900 },
  // Never ignoreHTTPSErrors: the one certificate this run trusts is named by its key below.
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    `--ignore-certificate-errors-spki-list=${SPKI}`,
  ],
});
const page = context.pages()[0] ?? (await context.newPage());

let step = '(start)';
let allowed = [];
const problems = [];
const urls = [];
page.on('console', (m) => {
  if (m.type() !== 'error') return;
  const text = m.text();
  const refusal = text.match(/Failed to load resource: the server responded with a status of (\d+)/);
  if (refusal && allowed.includes(Number(refusal[1]))) return;
  problems.push(`${step}: console error: ${text}`);
});
page.on('pageerror', (e) => problems.push(`${step}: uncaught: ${e.message}`));
page.on('request', (r) => urls.push(r.url()));

let passed = 0;
async function check(name, { allow = [] } = {}, body) {
  step = name;
  allowed = allow;
  const before = problems.length;
  try {
    await body();
    if (problems.length > before) throw new Error(problems.slice(before).join('\n'));
    passed += 1;
    console.log(`ok - ${name}`);
  } catch (e) {
    console.log(`not ok - ${name}\n${e.stack ?? e}`);
    await page.screenshot({ path: join(SHOTS, 'failure.png'), fullPage: true }).catch(() => {});
    console.log(`(the page as it was: ${join(SHOTS, 'failure.png')})`);
    await finish(1);
  } finally {
    allowed = [];
  }
}

async function finish(code) {
  await context.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
  process.exit(code);
}

const shot = (name) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
const go = (fragment) => page.goto(`${BASE}/ui/#/${fragment}`);
function expect(cond, what) {
  if (!cond) throw new Error(what);
}
const text = (selector) => page.locator(selector).first().innerText({ timeout: WAIT });
const visible = (selector) => page.locator(selector).first().waitFor({ state: 'visible', timeout: WAIT });
/** Waits until `selector` matches exactly `n` elements. */
async function count(selector, n) {
  await page.waitForFunction(([s, want]) => document.querySelectorAll(s).length === want, [selector, n], { timeout: WAIT });
}
/** Signs out through the page, then in with `token` as `principal`. */
async function signInAs(token, principal) {
  await page.click('.who button');
  await page.waitForURL(/#\/signin$/, { timeout: WAIT });
  expect(await page.evaluate(() => sessionStorage.length) === 0, 'signing out left the token in sessionStorage');
  await page.fill('#token', token);
  await page.click('form.signin button[type=submit]');
  await page.waitForURL(/#\/services$/, { timeout: WAIT });
  await page.waitForFunction((p) => document.querySelector('.who .principal')?.textContent === p, principal, { timeout: WAIT });
}

// --- the checks ---------------------------------------------------------------------------
await check('the pages come with a strict content security policy and no framing', {}, async () => {
  const r = await page.goto(`${BASE}/ui/`);
  expect(r.ok(), `GET /ui/ answered ${r.status()}`);
  const h = r.headers();
  const csp = h['content-security-policy'] ?? '';
  for (const directive of ["script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "default-src 'none'"]) {
    expect(csp.includes(directive), `CSP lacks ${directive}: ${csp}`);
  }
  expect(!csp.includes('unsafe'), `CSP allows something unsafe: ${csp}`);
  expect(h['x-frame-options'] === 'DENY', `X-Frame-Options: ${h['x-frame-options']}`);
  expect(h['x-content-type-options'] === 'nosniff', 'nosniff');
  expect(h['referrer-policy'] === 'no-referrer', 'Referrer-Policy');
  await page.waitForURL(/#\/signin$/, { timeout: WAIT });
});

await check('sign-in refuses a wrong token with the API\u2019s reason', { allow: [401] }, async () => {
  await page.fill('#token', 'wmt.nobody.not-a-secret');
  await page.click('form.signin button[type=submit]');
  await visible('.refusal[data-reason="bad_token"]');
  const said = await text('.refusal');
  expect(said.includes('401') && said.includes('bad_token'), `the refusal shown: ${said}`);
  expect(await page.evaluate(() => sessionStorage.length) === 0, 'a refused token was kept');
  await shot('signin-refused');
});

await check('sign-in with the operator token shows the three demo services, all eligible', {}, async () => {
  await page.fill('#token', TOKEN);
  await page.click('form.signin button[type=submit]');
  await page.waitForURL(/#\/services$/, { timeout: WAIT });
  for (const [service, n] of [['web', 6], ['checkout', 3], ['inventory', 3]]) {
    await visible(`tr[data-service="${service}"] [data-verdict="eligible"][data-count="${n}"]`);
    await count(`tr[data-service="${service}"] .zone`, 3);
  }
  expect(await page.locator('tr[data-service]').count() === 3, 'three services listed');
  expect((await text('.who .principal')) === 'token/dev', 'the principal shown');
  expect(!page.url().includes(TOKEN), 'the token is in the address');
  expect(await page.evaluate(() => localStorage.length) === 0, 'something was kept in localStorage');
  await shot('services');
});

await check('the proxies page lists the Envoy behind the dev node agent, in sync', {}, async () => {
  await go('proxies');
  await visible('table.agents tr[data-node="dev-node"] .s-synced');
  expect((await text('table.agents tr[data-node="dev-node"]')).includes('delta'), 'the protocol');
  await visible('section.node[data-node="dev-node"] h3 .ok');
  const row = `section.node[data-node="dev-node"] tr[data-client="${SIDECAR}"]`;
  await visible(`${row} .s-synced`);
  const cells = await page.locator(`${row} > td`).allInnerTexts();
  expect(cells[0] === SIDECAR && cells[1] === 'web-client' && cells[2] === 'az1' && cells[3] === 'delta', `the sidecar's row: ${cells}`);
  expect(/ClusterLoadAssignment sent \S+ · acked \S+/.test(cells[6]), `its EDS versions: ${cells[6]}`);
  await shot('proxies');
});

await check('a sidecar\u2019s page lists the clusters and endpoints its Envoy holds', {}, async () => {
  // Nothing moves the demo instances before the overrides below: what Envoy holds now is
  // what its node agent must say it holds.
  const held = await ask({ what: 'envoy_holds' });
  const clusters = Object.keys(held.clusters).sort();
  expect(held.clusters.web?.length === 6 && clusters.includes('checkout'), `Envoy holds: ${JSON.stringify(held)}`);
  await page.click(`section.node[data-node="dev-node"] tr[data-client="${SIDECAR}"] a`);
  await page.waitForURL(new RegExp(`#/proxies/dev-node/${SIDECAR}$`), { timeout: WAIT });
  await visible('[data-test="state"] .s-synced');
  await page.waitForFunction((want) => {
    const listed = [...document.querySelectorAll('table.clusters tr[data-cluster]')];
    const names = listed.map((r) => r.dataset.cluster).sort();
    return JSON.stringify(names) === JSON.stringify(want) && listed.every((r) => r.dataset.current === 'true');
  }, clusters, { timeout: WAIT });
  await page.waitForFunction((want) => Object.entries(want).every(([cluster, addrs]) => {
    const section = document.querySelector(`section.assignment[data-cluster="${cluster}"][data-current="true"]`);
    if (!section) return false;
    const shown = [...section.querySelectorAll('tr[data-address]')].map((r) => r.dataset.address).sort();
    return JSON.stringify(shown) === JSON.stringify(addrs);
  }), held.clusters, { timeout: WAIT }).catch(async (e) => {
    const shown = await page.locator('section.assignment').evaluateAll((sections) => Object.fromEntries(sections.map((s) =>
      [s.dataset.cluster, [...s.querySelectorAll('tr[data-address]')].map((r) => r.dataset.address).sort()])));
    throw new Error(`the page lists ${JSON.stringify(shown)}; Envoy holds ${JSON.stringify(held.clusters)} (${e.message})`);
  });
  await count('section.assignment[data-cluster="web"] tr[data-health="HEALTHY"]', 6);
  const first = await text('section.assignment[data-cluster="web"] tr[data-address]');
  expect(/web-\S+\s+az\d/.test(first) && first.includes('eligible'), `an endpoint's instance, zone and verdict: ${first}`);
  await shot('proxy-config');
});

await check('a service\u2019s page lists its instances with verdict, weight, capability and reason', {}, async () => {
  await go('services/web');
  await count('tr[data-instance]', 6);
  await count('tr[data-instance][data-verdict="eligible"]', 6);
  for (const backend of ['web-az1-1', 'web-az2-1', 'web-az3-2']) {
    const row = `tr[data-instance="${IDS[backend]}"]`;
    await page.waitForFunction((s) => document.querySelector(`${s} td.reason`)?.textContent.includes('passing'), row, { timeout: WAIT });
    const cells = await text(row);
    // The evidence mode moves (single_class until the first self-report, then probe_primary).
    expect(/verified · (probe_primary|single_class|passive_primary) · probe, self_report, passive/.test(cells), `capability: ${cells}`);
    expect(cells.includes(backend), `its tag: ${cells}`);
  }
  await count('section.zone-section', 3);
  await shot('service-web');
});

const first = IDS['web-az1-1'];
const second = IDS['web-az1-2'];
/** The audit number of the override the budget refused, which a second principal approves. */
let refused = 0;

await check('an instance\u2019s page explains it and draws its transitions', {}, async () => {
  await go(`instances/${first}`);
  await visible('[data-test="verdict"] [data-verdict="eligible"]');
  for (const cls of ['probe', 'self_report', 'passive']) await visible(`table.evidence tr[data-class="${cls}"]`);
  const probe = await text('table.evidence tr[data-class="probe"]');
  expect(probe.includes('Pass') && probe.includes('node/dev-node'), `the probe's evidence: ${probe}`);
  await visible('svg.timeline rect.band[data-verdict="eligible"]');
  await visible('svg.timeline rect.band[data-verdict="unknown"]');
  expect((await text('pre.explain')).includes(`instance ${first} of web`), 'the CLI\u2019s explanation');
  await shot('instance');
});

await check('an override without a justification is refused with the API\u2019s reason', { allow: [422] }, async () => {
  await page.selectOption('#override-action', 'maintenance_on');
  await page.fill('#override-justification', '');
  await page.click('#override-submit');
  await visible('#override-result .refusal[data-reason="no_justification"]');
  expect((await text('#override-result .refusal')).includes('justification'), 'the message');
});

await check('an override made in the page changes the verdict the CLI sees', {}, async () => {
  await page.fill('#override-justification', 'browser test: disk failing');
  await page.click('#override-submit');
  await visible('#override-result .granted[data-applied="1"]');
  const seen = await ask({ what: 'cli_verdict', instance: first, want: 'draining' });
  expect(seen.verdict === 'draining', `the CLI sees ${JSON.stringify(seen)}`);
  await visible('[data-test="verdict"] [data-verdict="draining"]');
  await visible('svg.timeline rect.band[data-verdict="draining"]');
  await shot('instance-overridden');
});

await check('an override beyond the disruption budget is refused with its reason and audit number', { allow: [409] }, async () => {
  await go(`instances/${second}`);
  await visible('[data-test="verdict"] [data-verdict="eligible"]');
  await page.selectOption('#override-action', 'maintenance_on');
  await page.fill('#override-justification', 'browser test: one too many');
  await page.click('#override-submit');
  await visible('#override-result .refusal[data-reason="disruption_budget"]');
  const said = await text('#override-result .refusal');
  expect(said.includes('409') && said.includes('budget'), `the refusal: ${said}`);
  refused = Number(await page.locator('#override-result .approval').getAttribute('data-seq'));
  expect(refused > 0, `the audit number: ${refused}`);
  const seen = await ask({ what: 'cli_verdict', instance: second, want: 'eligible' });
  expect(seen.verdict === 'eligible', `the refused override changed ${second}: ${JSON.stringify(seen)}`);
  await shot('override-refused');
});

await check('approving one\u2019s own refused override is refused with the API\u2019s reason', { allow: [409] }, async () => {
  await page.fill('#approve-seq', String(refused));
  await page.fill('#approve-justification', 'browser test: I asked, I approve');
  await page.click('#approve-submit');
  await visible('#approve-result .refusal[data-reason="same_principal"]');
  const said = await text('#approve-result .refusal');
  expect(said.includes('409') && said.includes(`override ${refused} must be approved by a principal other than token/dev`), `the refusal: ${said}`);
  const seen = await ask({ what: 'cli_verdict', instance: second, want: 'eligible' });
  expect(seen.verdict === 'eligible', `a refused approval changed ${second}: ${JSON.stringify(seen)}`);
  await shot('approve-refused');
});

await check('a second principal approves the refused override in the page and the CLI sees it drained', {}, async () => {
  const { token } = await ask({ what: 'mint_token', name: 'approver', grants: ['read', 'override:web'] });
  await signInAs(token, 'token/approver');
  await go(`instances/${second}`);
  await visible('[data-test="verdict"] [data-verdict="eligible"]');
  await page.fill('#approve-seq', String(refused));
  await page.fill('#approve-justification', 'browser test: second pair of eyes');
  await page.click('#approve-submit');
  await visible(`#approve-result .granted[data-approved="${refused}"][data-applied="1"]`);
  const seen = await ask({ what: 'cli_verdict', instance: second, want: 'draining' });
  expect(seen.verdict === 'draining', `the CLI sees ${JSON.stringify(seen)}`);
  await visible('[data-test="verdict"] [data-verdict="draining"]');
  await shot('approved');
});

await check('an approval is spent once: approving it again is refused', { allow: [409] }, async () => {
  await page.fill('#approve-justification', 'browser test: twice');
  await page.click('#approve-submit');
  await visible('#approve-result .refusal[data-reason="already_approved"]');
});

await check('the approver puts the instance back, and the operator signs in again', {}, async () => {
  await page.selectOption('#override-action', 'maintenance_off');
  await page.fill('#override-justification', 'browser test: approved work done');
  await page.click('#override-submit');
  await visible('#override-result .granted[data-applied="1"]');
  const seen = await ask({ what: 'cli_verdict', instance: second, want: 'eligible' });
  expect(seen.verdict === 'eligible', `the CLI sees ${JSON.stringify(seen)}`);
  await signInAs(TOKEN, 'token/dev');
});

await check('the override is put back from the page', {}, async () => {
  await go(`instances/${first}`);
  await visible('[data-test="verdict"] [data-verdict="draining"]');
  await page.selectOption('#override-action', 'maintenance_off');
  await page.fill('#override-justification', 'browser test: disk replaced');
  await page.click('#override-submit');
  await visible('#override-result .granted[data-applied="1"]');
  await page.waitForFunction(() => !document.querySelector('[data-test="verdict"] [data-verdict="draining"]'), null, { timeout: WAIT });
});

await check('the audit log filters by kind, service and actor', {}, async () => {
  await go('audit');
  await visible('table.audit tr[data-kind="transition"]');
  await page.selectOption('#audit-kind', 'override');
  await page.fill('#audit-service', 'web');
  await page.fill('#audit-actor', 'token/dev');
  await page.click('form.filters button[type=submit]');
  await page.waitForURL(/#\/audit\?kind=override&service=web&actor=token%2Fdev$/, { timeout: WAIT });
  await visible('table.audit tr[data-outcome="awaiting_approval"]');
  const kinds = await page.locator('table.audit tr[data-kind]').evaluateAll((rows) => rows.map((r) => r.dataset.kind));
  expect(kinds.length >= 3 && kinds.every((k) => k === 'override'), `kinds: ${kinds}`);
  const outcomes = await page.locator('table.audit tr[data-outcome]').evaluateAll((rows) => rows.map((r) => r.dataset.outcome));
  expect(outcomes.filter((o) => o === 'granted').length >= 2, `outcomes: ${outcomes}`);
  expect((await text('table.audit')).includes('browser test: one too many'), 'the justification shown');
  await shot('audit');
  // The approval is the approver's record, naming the request and who asked.
  await page.fill('#audit-actor', 'token/approver');
  await page.click('form.filters button[type=submit]');
  await page.waitForURL(/actor=token%2Fapprover$/, { timeout: WAIT });
  const approval = 'table.audit tr[data-kind="override"][data-outcome="approved"]';
  await visible(approval);
  const detail = JSON.parse(await page.locator(`${approval} details.json pre`).first().textContent());
  expect(detail.approves === refused && detail.requested_by === 'token/dev', `the approval's detail: ${JSON.stringify(detail)}`);
});

await check('live: a backend switched to fail-hard shows as ineligible without a reload', {}, async () => {
  await go('services/web');
  const failed = IDS['web-az2-1'];
  await visible(`tr[data-instance="${failed}"][data-verdict="eligible"]`);
  await page.evaluate(() => { window.waymarkTestMarker = 'not reloaded'; });
  await ask({ what: 'set_mode', backend: 'web-az2-1', mode: 'fail-hard' });
  await visible(`tr[data-instance="${failed}"][data-verdict="ineligible"]`);
  expect(await page.evaluate(() => window.waymarkTestMarker) === 'not reloaded', 'the page was reloaded');
  await shot('service-web-ineligible');
});

await check('live: the services page follows a zone losing its last eligible web instance', {}, async () => {
  await go('services');
  // The summary counts what the views route: a hard-failed instance has left them.
  await visible('tr[data-service="web"] [data-verdict="withdrawn"][data-count="1"]');
  await page.evaluate(() => { window.waymarkTestMarker = 'not reloaded'; });
  await ask({ what: 'set_mode', backend: 'web-az2-2', mode: 'fail-hard' });
  await visible('tr[data-service="web"] [data-verdict="withdrawn"][data-count="2"]');
  await visible('tr[data-service="web"] [data-verdict="eligible"][data-count="4"]');
  await visible('tr[data-service="web"] .zone[data-zone="az2"][data-guard="engaged"]');
  expect(await page.evaluate(() => window.waymarkTestMarker) === 'not reloaded', 'the page was reloaded');
  await shot('services-guard');
});

await check('the alarms page shows the fraction guard engaged in az2', {}, async () => {
  await go('alarms');
  await visible('tr[data-service="web"][data-alarm="fraction_guard"][data-zone="az2"]');
  await shot('alarms');
});

await check('zones: evacuate and shift back, and a refusal as the API gives it', { allow: [409] }, async () => {
  await go('zones');
  await count('tr[data-zone]', 3);
  await page.click('tr[data-zone="az3"] button[data-action="evacuate"]');
  await visible('#zone-result .granted[data-zone="az3"][data-action="evacuate"]');
  await visible('tr[data-zone="az3"][data-evacuation="evacuating"]');
  await shot('zones');
  await page.click('tr[data-zone="az1"] button[data-action="complete_shift_back"]');
  await visible('#zone-result .refusal[data-reason="evacuation"]');
  expect((await text('#zone-result .refusal')).includes('not evacuated'), 'the refusal\u2019s message');
  await page.click('tr[data-zone="az3"] button[data-action="shift_back"]');
  await visible('#zone-result .granted[data-zone="az3"][data-action="shift_back"]');
});

await check('the federation page lists the peer region, fresh, with its age', {}, async () => {
  await go('federation');
  const row = `table.regions tr[data-region="${PEER}"]`;
  await page.waitForFunction((r) => document.querySelector(`${r}[data-stale="false"] td.links`)?.textContent === '1/1', row, { timeout: WAIT });
  // Fresh means heard within stale_after; the peer's digests go every 200 ms.
  const age = await page.locator(`${row} td.age`).getAttribute('data-age-ms');
  expect(age !== '' && Number(age) <= PEER_STALE_MS, `its age: ${age} ms`);
  const shown = await text(`${row} td.age`);
  expect(/^\d+(\.\d)? m?s$/.test(shown), `its age as shown: ${shown}`);
  const facts = await text('p.facts');
  expect(facts.includes('region dev') && /serving .*web@\d+/.test(facts), `this region: ${facts}`);
  // Entries flowed, not only a handshake: this member holds the peer region's aggregates.
  await page.waitForFunction((s) => /\S+@\d+/.test(document.querySelector(s)?.textContent ?? ''), `${row} td.versions`, { timeout: WAIT });
  await shot('federation');
});

await check('a peer region gone silent shows as stale, its entry kept', {}, async () => {
  await ask({ what: 'stop_peer' });
  const row = `table.regions tr[data-region="${PEER}"]`;
  await visible(`${row}[data-stale="true"]`);
  const age = await page.locator(`${row} td.age`).getAttribute('data-age-ms');
  expect(Number(age) > PEER_STALE_MS, `stale at an age of ${age} ms`);
  expect((await text(`${row}`)).includes('stale'), 'the state shown');
  const kept = await text(`${row} td.versions`);
  expect(/\S+@\d+/.test(kept), `its entries kept: ${kept}`);
  await shot('federation-stale');
});

await check('a token the API stops accepting returns the page to sign-in with the refusal', { allow: [401] }, async () => {
  await page.evaluate(() => sessionStorage.setItem('waymark.token', 'wmt.dev.revoked-or-expired'));
  await go('alarms');
  await page.waitForURL(/#\/signin$/, { timeout: WAIT });
  await visible('.refusal[data-reason="bad_token"]');
  expect(await page.evaluate(() => sessionStorage.getItem('waymark.token')) === null, 'the refused token was kept');
});

await check('no request carried the token in its address', {}, async () => {
  const leaked = urls.filter((u) => u.includes(TOKEN) || u.includes(encodeURIComponent(TOKEN)));
  expect(leaked.length === 0, `in: ${leaked}`);
  expect(urls.some((u) => u.includes('/v1/services')), 'the requests were recorded');
});

console.log(`ui: all ${passed} checks passed; screenshots in ${SHOTS}`);
await finish(0);
