// Drives Debian's Chromium (headless, through playwright-core) against the stategate web
// console. Started by tests/it/console.rs, which runs the service and answers requests for
// changes made by another client:
//
//   driver -> test (stdout): `@@set {"key": k, "value": "<bytes as text>"}`  SET over MQTT
//                            `@@drop`                                        cut every open HTTP connection
//                            `@@down` / `@@up`                               cut them and refuse new ones / accept again
//                            `@@churn <n>`                                   n SETs over MQTT (more than the history kept)
//   test -> driver (stdin):  `@@ok <detail>` once done, or `@@err <message>`
//
// Environment: CONSOLE_URL (the console, through the test's proxy), SERVICE_URL (the HTTP
// door itself, for checks made as another client), MODE (`open` or `token`), API_TOKEN (token
// mode), ARTIFACTS (screenshot directory), CHROMIUM, PLAYWRIGHT_DIR (node_modules holding
// playwright-core), SCREENSHOT (optional: where to write docs/console.png).
//
// Every wait is bounded and waits for something on the page; there are no fixed sleeps. Any
// JavaScript error, CSP violation or unexpected failed request fails the run.

import { createRequire } from 'node:module';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`environment variable ${name} is not set`);
  return v;
};
const require = createRequire(join(env('PLAYWRIGHT_DIR'), 'node_modules') + '/');
const { chromium } = require('playwright-core');

const CONSOLE_URL = env('CONSOLE_URL');
const SERVICE_URL = env('SERVICE_URL');
const MODE = env('MODE', 'open');
const TOKEN = MODE === 'token' ? env('API_TOKEN') : '';
const ARTIFACTS = join(env('ARTIFACTS'), MODE);
const WAIT = 10000; // Longest wait for anything that must happen.
const LIVE_WAIT = 3000; // Longest wait for a change made elsewhere to show up live.
mkdirSync(ARTIFACTS, { recursive: true });

// ---- the test harness on the other end of stdin/stdout ----

const replies = [];
const waiters = [];
createInterface({ input: process.stdin }).on('line', (line) => {
  if (waiters.length) waiters.shift()(line);
  else replies.push(line);
});

async function ask(line) {
  process.stdout.write(line + '\n');
  const reply = replies.length ? replies.shift() : await new Promise((resolve) => waiters.push(resolve));
  if (!reply.startsWith('@@ok')) throw new Error(`the test harness could not do ${line}: ${reply}`);
  return reply.slice(4).trim();
}

/** Another client (MQTT, through the test) sets a key. */
const setElsewhere = (key, value) => ask('@@set ' + JSON.stringify({ key, value }));

/** Another client reads a key over HTTP: `{status, body}`. */
async function readElsewhere(key) {
  const res = await fetch(`${SERVICE_URL}/v1.0/state/statestore/${encodeURIComponent(key)}`, {
    headers: TOKEN ? { 'dapr-api-token': TOKEN } : {},
  });
  return { status: res.status, body: await res.text() };
}

// ---- the browser ----

const browser = await chromium.launch({
  executablePath: env('CHROMIUM', '/usr/bin/chromium'),
  headless: true,
  args: [
    '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage',
  ],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 760 }, colorScheme: 'light' });
const page = await context.newPage();
page.setDefaultTimeout(WAIT);

// What a step may see fail: HTTP statuses (401, 409) and `net` (a connection the test cut).
let allowed = new Set();
const problems = [];
const urls = [];

page.on('pageerror', (e) => problems.push('JavaScript error: ' + e.message));
page.on('dialog', (d) => problems.push('unexpected browser dialog: ' + d.message()));
page.on('console', (m) => {
  if (m.type() !== 'error' && m.type() !== 'warning') return;
  const text = m.text();
  const status = /status of (\d{3})/.exec(text);
  if (status && allowed.has(Number(status[1]))) return;
  if (/net::ERR_/.test(text) && allowed.has('net')) return;
  problems.push(`console ${m.type()}: ${text}`);
});
page.on('request', (r) => urls.push(r.url()));
page.on('response', (r) => {
  if (r.status() >= 400 && !allowed.has(r.status())) problems.push(`HTTP ${r.status()} for ${r.url()}`);
});
page.on('requestfailed', (r) => {
  const why = r.failure() ? r.failure().errorText : '';
  // Requests the console itself aborts (a feed restarted) are not failures.
  if (why === 'net::ERR_ABORTED' || allowed.has('net')) return;
  problems.push(`request failed: ${r.url()} ${why}`);
});

let shot = 0;
async function step(name, fn, allow = []) {
  const started = Date.now();
  allowed = new Set(allow);
  try {
    await fn();
  } finally {
    allowed = new Set();
    shot++;
    const file = join(ARTIFACTS, `${String(shot).padStart(2, '0')}-${name}.png`);
    await page.screenshot({ path: file }).catch(() => {});
  }
  if (problems.length) throw new Error(`step ${name}:\n  ${problems.join('\n  ')}`);
  console.log(`ok ${MODE}: ${name} (${Date.now() - started} ms)`);
}

function check(cond, message) {
  if (!cond) throw new Error(message);
}

const keyItems = () => page.locator('#key-list li[role="option"]');
const keyNames = () => keyItems().evaluateAll((lis) => lis.map((li) => li.dataset.key));
const detailTitle = () => page.locator('#detail-h');

/**
 * Waits until the key list fits `spec`: `{count, min, includes: [..], excludes: [..], every:
 * regex source}`. (A spec, not code: the page's CSP rightly forbids eval.)
 */
async function waitForKeys(spec, what) {
  await page.waitForFunction(
    (s) => {
      const keys = [...document.querySelectorAll('#key-list li[role="option"]')].map((li) => li.dataset.key);
      if (s.count !== undefined && keys.length !== s.count) return false;
      if (s.min !== undefined && keys.length < s.min) return false;
      if (s.includes && !s.includes.every((k) => keys.includes(k))) return false;
      if (s.excludes && s.excludes.some((k) => keys.includes(k))) return false;
      return !s.every || keys.every((k) => new RegExp(s.every).test(k));
    },
    spec,
    { timeout: WAIT },
  ).catch(async () => {
    throw new Error(`${what}: the key list shows ${JSON.stringify(await keyNames())}`);
  });
}

async function openViaFilter(key) {
  await page.keyboard.press('Escape');
  await page.keyboard.press('/');
  await page.fill('#filter', key);
  await waitForKeys({ count: 1, includes: [key] }, `filter for ${key}`);
  await page.keyboard.press('Enter');
  await page.locator('#detail-h', { hasText: key }).waitFor();
  await page.locator('#detail:not([hidden])').waitFor();
}

/** Waits for a change row of `key` in the live list; returns the milliseconds it took. */
async function liveRow(key, since) {
  await page.locator(`#live-list li[data-key="${key}"]`).first().waitFor({ timeout: LIVE_WAIT });
  return Date.now() - since;
}

/**
 * The service becomes unreachable (every connection cut, new ones refused), another client
 * changes two keys meanwhile, the service comes back: the feed reconnects by itself, sends the
 * last event id, and the service replays exactly the changes it missed, in order, with no gap
 * marker. A real browser's EventSource does this on its own (the fetch reader in token mode).
 */
async function resumeAfterOutage(first, second) {
  const gaps = await page.locator('#live-list li.gap').count();
  await ask('@@down');
  await page.locator('#conn[data-state="reconnecting"]').waitFor({ timeout: WAIT });
  const v1 = await setElsewhere(first, '{"while":"down","n":1}');
  const v2 = await setElsewhere(second, '{"while":"down","n":2}');
  const since = Date.now();
  await ask('@@up');
  await page.locator(`#live-list li[data-key="${second}"] .version`, { hasText: v2 }).waitFor({ timeout: WAIT });
  console.log(`changes missed during an outage replayed ${Date.now() - since} ms after it ended`);
  const rows = await page.locator('#live-list li').evaluateAll((lis) =>
    lis.slice(0, 2).map((li) => [li.dataset.key, li.querySelector('.version')?.textContent]));
  check(JSON.stringify(rows) === JSON.stringify([[second, v2], [first, v1]]),
    `the missed changes, newest first, each once: ${JSON.stringify(rows)}`);
  check(await page.locator('#live-list li.gap').count() === gaps, 'a resumed feed marks no gap');
  await page.locator('#conn[data-state="live"]').waitFor({ timeout: WAIT });
}

/**
 * An outage longer than the service's history: on reconnect the service says `reset`, and the
 * console marks the gap and reloads; live changes go on.
 */
async function resetAfterLongOutage() {
  await ask('@@down');
  await page.locator('#conn[data-state="reconnecting"]').waitFor({ timeout: WAIT });
  await ask('@@churn 80');
  await ask('@@up');
  await page.locator('#live-list li.gap', { hasText: 'long break' }).waitFor({ timeout: WAIT });
  await page.locator('#conn[data-state="live"]').waitFor({ timeout: WAIT });
  check(await page.locator('#live-list li[data-key^="churn:"]').count() === 0,
    'the snapshot after a reset is not listed as changes');
  const since = Date.now();
  await setElsewhere('order:12', '{"total":12}');
  console.log(`live change after a reset shown after ${await liveRow('order:12', since)} ms`);
}

async function editValue(text) {
  await page.locator('#editor:not([hidden])').waitFor();
  await page.fill('#e-value', text);
}

// ---- the runs ----

async function openRun() {
  await step('keys', async () => {
    await page.goto(CONSOLE_URL);
    await waitForKeys({ includes: ['user:1', 'order:1'], min: 6 }, 'initial keys');
    await page.locator('#conn[data-state="live"]').waitFor();
    check((await page.locator('#store').inputValue()) === 'statestore', 'the store picker shows statestore');
    const weight = await page.evaluate(() => {
      const own = performance.getEntriesByType('resource').filter((e) => new URL(e.name).pathname.startsWith('/ui/'));
      const nav = performance.getEntriesByType('navigation')[0];
      return {
        files: own.length + 1,
        bytes: own.reduce((n, e) => n + e.decodedBodySize, nav.decodedBodySize),
        ready: Math.round(nav.domContentLoadedEventEnd),
      };
    });
    console.log(`page weight: ${weight.bytes} bytes in ${weight.files} files; DOMContentLoaded after ${weight.ready} ms`);
  });

  await step('filter', async () => {
    await page.keyboard.press('/');
    check(await page.evaluate(() => document.activeElement.id === 'filter'), '/ focuses the filter');
    await page.keyboard.type('user:');
    await waitForKeys({ count: 3, every: '^user:' }, 'text filter user:');
    await page.fill('#filter', 'order:[0-9]');
    await waitForKeys({ min: 1, every: '^order:[0-9]$' }, 'glob filter');
    await page.fill('#filter', 'user:');
    await waitForKeys({ count: 3, every: '^user:' }, 'back to user:');
  });

  await step('stores-and-paging', async () => {
    // Another client fills a second store (keys prefixed `orders||` in the engine).
    const items = Array.from({ length: 120 }, (_, i) => ({ key: `o${String(i).padStart(3, '0')}`, value: { i } }));
    const res = await fetch(`${SERVICE_URL}/v1.0/state/orders`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(items),
    });
    check(res.status === 204, `seeding the orders store: ${res.status}`);
    await page.fill('#filter', '');
    await page.selectOption('#store', 'orders');
    await waitForKeys({ count: 100, every: '^o\\d{3}$' }, 'the first page of orders');
    await page.locator('#key-count', { hasText: '100 keys shown' }).waitFor();
    await page.click('#more-btn');
    await waitForKeys({ count: 120 }, 'both pages of orders');
    check(await page.locator('#more-btn').isHidden(), 'no third page');
    await page.selectOption('#store', 'statestore');
    await waitForKeys({ includes: ['user:1'], excludes: ['o000'] }, 'back to statestore');
    await page.locator('#conn[data-state="live"]').waitFor();
    await page.keyboard.press('/');
    await page.fill('#filter', 'user:');
    await waitForKeys({ count: 3, every: '^user:' }, 'user: again');
  });

  await step('open-key', async () => {
    await page.keyboard.press('ArrowDown'); // into the list, on user:1
    await page.keyboard.press('ArrowDown'); // user:2
    await page.keyboard.press('ArrowUp'); // user:1
    await page.keyboard.press('Enter');
    await detailTitle().filter({ hasText: 'user:1' }).waitFor();
    const version = await page.textContent('#m-version');
    check(/^\d{15}:\d{5}:stategate$/.test(version), `version shown: ${version}`);
    check((await page.textContent('#value')).includes('"name": "Ada"'), 'pretty JSON value');
    check((await page.textContent('#m-type')).startsWith('JSON'), 'type JSON');
  });

  await step('metadata', async () => {
    await openViaFilter('session');
    const ttl = await page.textContent('#m-ttl');
    check(/\d+ (min|h|s)/.test(ttl), `TTL left shown: ${ttl}`);
    await openViaFilter('lock');
    check(/^\d{15}:\d{5}:/.test(await page.textContent('#m-fencing')), 'fencing token shown');
    await openViaFilter('blob');
    check((await page.textContent('#m-type')).startsWith('binary'), 'binary type');
    check((await page.textContent('#value')).startsWith('00000000  ff 00 01'), 'hex dump of a binary value');
    check(await page.locator('#edit-btn').isDisabled(), 'binary values are not editable');
  });

  await step('large-value', async () => {
    const before = await page.locator('.live').boundingBox();
    await openViaFilter('big');
    const btn = page.locator('#show-all');
    await btn.waitFor();
    check((await btn.textContent()).startsWith('Show all'), 'a large value is truncated with "show all"');
    const pane = await page.locator('#value').boundingBox();
    check(pane.height <= 760 * 0.6, `the value pane stays bounded (${pane.height}px)`);
    await btn.click();
    await page.locator('#show-all', { hasText: 'Show less' }).waitFor();
    const after = await page.locator('.live').boundingBox();
    check(JSON.stringify(before) === JSON.stringify(after), 'no layout jump around a large value');
  });

  await step('edit', async () => {
    await openViaFilter('user:1');
    await page.keyboard.press('e');
    await editValue('{"name": "Ada", "edited": true}');
    await page.keyboard.press('Control+Enter');
    await page.locator('#value', { hasText: '"edited": true' }).waitFor();
    const stored = await readElsewhere('user:1');
    check(stored.body === '{"edited":true,"name":"Ada"}' || stored.body === '{"name":"Ada","edited":true}',
      `saved value: ${stored.body}`);
  });

  await step('conflict', async () => {
    await page.click('#edit-btn');
    await editValue('{"name": "Ada", "mine": 1}');
    await setElsewhere('user:1', '{"name":"Grace"}');
    await page.click('#save-btn');
    await page.locator('#conflict:not([hidden])').waitFor();
    check((await page.textContent('#conflict-value')).includes('"name": "Grace"'), 'the conflict shows their value');
    check((await page.inputValue('#e-value')).includes('"mine": 1'), 'my edit is kept');
    const stored = await readElsewhere('user:1');
    check(stored.body === '{"name":"Grace"}', `nothing was overwritten: ${stored.body}`);
  }, [409]);

  await step('conflict-resolved', async () => {
    await page.click('#conflict-theirs');
    await page.locator('#value', { hasText: 'Grace' }).waitFor();
  });

  await step('live', async () => {
    const since = Date.now();
    await setElsewhere('order:7', '{"total":42}');
    const ms = await liveRow('order:7', since);
    console.log(`live change shown after ${ms} ms`);
    check((await page.textContent('#live-list li[data-key="order:7"] .preview')).includes('42'), 'value preview');
  });

  await step('pause-and-filter', async () => {
    await page.keyboard.press('Escape');
    await page.keyboard.press('p');
    await page.locator('#pause-btn[aria-pressed="true"]').waitFor();
    await setElsewhere('order:8', '{"total":8}');
    await page.locator('#live-paused', { hasText: '1 new change' }).waitFor();
    check(await page.locator('#live-list li[data-key="order:8"]').count() === 0, 'paused: not listed yet');
    await page.keyboard.press('p');
    await page.locator('#live-list li[data-key="order:8"]').waitFor();
    await page.fill('#live-filter', 'order:8');
    await page.locator('#live-list li[data-key="order:7"]').waitFor({ state: 'hidden' });
    check(await page.locator('#live-list li[data-key="order:8"]').isVisible(), 'the filter keeps order:8');
    await page.fill('#live-filter', '');
  });

  await step('resume', async () => {
    await resumeAfterOutage('order:9', 'order:10');
  }, ['net']);

  await step('reset', async () => {
    await resetAfterLongOutage();
  }, ['net']);

  await step('create', async () => {
    await page.keyboard.press('Escape');
    await page.keyboard.press('n');
    await page.fill('#e-key', 'user:4');
    await editValue('{"name": "Lin"}');
    await page.fill('#e-ttl', '600');
    await page.click('#save-btn');
    await detailTitle().filter({ hasText: 'user:4' }).waitFor();
    await page.locator('#value', { hasText: 'Lin' }).waitFor();
    check(/min/.test(await page.textContent('#m-ttl')), 'the new key has a TTL');
    // Creating it again refuses, never overwrites.
    await page.keyboard.press('n');
    await page.fill('#e-key', 'user:4');
    await editValue('"again"');
    await page.click('#save-btn');
    await page.locator('#editor-error', { hasText: 'already exists' }).waitFor();
    await page.fill('#e-value', 'not json');
    await page.click('#save-btn');
    await page.locator('#editor-error', { hasText: 'not valid JSON' }).waitFor();
    await page.keyboard.press('Escape');
  }, [409]);

  await step('delete', async () => {
    await openViaFilter('user:2');
    await page.click('#delete-btn');
    await page.click('#confirm-yes');
    await page.locator('#detail-empty', { hasText: 'Deleted "user:2"' }).waitFor();
    await waitForKeys({ excludes: ['user:2'] }, 'user:2 leaves the list');
    check((await readElsewhere('user:2')).status === 204, 'user:2 is gone');
  });

  await step('status', async () => {
    await page.keyboard.press('s');
    await page.locator('#status-doors tr[data-door="grpc"]').waitFor();
    for (const door of ['mqtt', 'http']) {
      check(await page.locator(`#status-doors tr[data-door="${door}"]`).count() === 1, `door ${door} listed`);
    }
    check(/^\d+ \(embedded/.test(await page.textContent('dd[data-field="MQTT clients"]')), 'MQTT clients counted');
    check(/^memory/.test(await page.textContent('dd[data-field="storage"]')), 'storage shown');
  });

  await step('phone', async () => {
    await page.keyboard.press('Escape');
    await page.locator('#status-dlg').waitFor({ state: 'hidden' });
    await page.setViewportSize({ width: 390, height: 844 });
    await openViaFilter('user:1');
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(overflow <= 0, `no sideways scrolling on a phone (${overflow}px too wide)`);
  });

  if (process.env.SCREENSHOT) {
    await page.setViewportSize({ width: 1280, height: 680 });
    await page.fill('#filter', '');
    await waitForKeys({ min: 6, includes: ['user:1'] }, 'all keys for the screenshot');
    await page.click('#key-list li[data-key="user:1"]');
    await page.locator('#detail-h', { hasText: 'user:1' }).waitFor();
    await page.locator('#key-list li.open').waitFor();
    await page.evaluate(() => document.activeElement.blur());
    await page.screenshot({ path: process.env.SCREENSHOT });
    console.log('docs screenshot: ' + process.env.SCREENSHOT);
  }
}

async function tokenRun() {
  await step('token-prompt', async () => {
    await page.goto(CONSOLE_URL);
    await page.locator('#token-dlg[open]').waitFor();
    await page.fill('#token-input', 'wrong-' + TOKEN);
    await page.keyboard.press('Enter');
    await page.locator('#token-error', { hasText: 'refused' }).waitFor();
  }, [401]);

  await step('token-unlocked', async () => {
    await page.fill('#token-input', TOKEN);
    await page.keyboard.press('Enter');
    await page.locator('#token-dlg').waitFor({ state: 'hidden' });
    await waitForKeys({ includes: ['user:1'] }, 'keys after unlocking');
    await page.locator('#conn[data-state="live"]').waitFor();
    check(await page.evaluate(() => sessionStorage.getItem('stategate.apiToken')) !== null, 'token in sessionStorage');
    check((await page.textContent('#lock-btn')) === 'Forget token', 'the token can be forgotten');
  });

  await step('token-live', async () => {
    const since = Date.now();
    await setElsewhere('order:7', '{"total":7}');
    console.log(`live change (fetch reader) shown after ${await liveRow('order:7', since)} ms`);
  });

  await step('token-resume', async () => {
    await resumeAfterOutage('order:8', 'order:11');
  }, ['net']);

  await step('token-reset', async () => {
    await resetAfterLongOutage();
  }, ['net']);

  await step('token-edit', async () => {
    await openViaFilter('user:1');
    await page.keyboard.press('e');
    await editValue('{"name": "Ada", "by": "token"}');
    await page.keyboard.press('Control+Enter');
    await page.locator('#value', { hasText: '"by": "token"' }).waitFor();
  });

  await step('token-reload', async () => {
    // The token survives a reload of the tab (sessionStorage), and the page asks for nothing.
    await page.reload();
    await waitForKeys({ includes: ['user:1'] }, 'keys after a reload');
    await page.locator('#conn[data-state="live"]').waitFor();
    check(!(await page.locator('#token-dlg').isVisible()), 'no prompt after a reload');
  });

  const leaks = urls.filter((u) => u.includes(TOKEN));
  check(leaks.length === 0, `the token appeared in a URL: ${leaks.join(', ')}`);
  check(!page.url().includes(TOKEN), 'the token is not in the page URL');
  check(!(await page.evaluate(() => document.body.innerText)).includes(TOKEN), 'the token is not shown');
  check(!(await page.evaluate((t) => Object.values(localStorage).some((v) => v.includes(t)), TOKEN)),
    'the token is not in localStorage');
}

try {
  if (MODE === 'token') await tokenRun();
  else await openRun();
  console.log(`screenshots: ${ARTIFACTS}`);
  console.log(`@@done ${MODE}`);
} catch (e) {
  console.error(`FAILED (${MODE}): ${e.message}`);
  console.error(`screenshots: ${ARTIFACTS}`);
  process.exitCode = 1;
} finally {
  await browser.close();
  process.stdin.destroy();
}
