// The JavaScript Dapr SDK (@dapr/dapr, HTTP protocol) against a real daprd whose `statestore`
// is stategate (tests/it/daprd/peers.rs runs it).
//
// Environment: DAPR_HTTP_PORT (daprd's HTTP port on 127.0.0.1), DAPR_SDK_DIR (the folder whose
// node_modules holds @dapr/dapr: the test installs it into ~/.cache, never into the clone).
//
// Exercises save, get, delete, bulk get, transactions, ETags (stale and invalid ones refused,
// the current one accepted), first-write, TTL metadata (`ttlInSeconds`) and query, asserting
// every result. On the first failure prints `FAIL: <what>` to stderr and exits 1. Otherwise
// the last line of stdout is `RESULT <json>`: the keys left in the store with the ETag and
// value the SDK last saw (`kept`), the keys the script removed or never wrote (`gone`) and the
// key with a TTL and its `ttlExpireTime` (`ttl`), so the test can find them in stategate.

import { createRequire } from 'node:module';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';

function fail(what) {
  process.stderr.write(`FAIL: ${what}\n`);
  process.exit(1);
}

function check(cond, what) {
  if (!cond) fail(what);
}

function env(name) {
  const v = process.env[name];
  if (!v) fail(`${name} is not set`);
  return v;
}

// Values compare as JSON: a query answers objects with their keys in another order.
const same = (a, b) => isDeepStrictEqual(a, b);
const show = (v) => JSON.stringify(v);

// @dapr/dapr is CommonJS, resolved from the cache folder rather than from beside this file.
const require = createRequire(join(env('DAPR_SDK_DIR'), 'node_modules') + '/');
const { DaprClient, CommunicationProtocolEnum, LogLevel, StateConcurrencyEnum } = require('@dapr/dapr');

const STORE = 'statestore';
const run = randomBytes(4).toString('hex');
const k = (name) => `js-${run}-${name}`;

// The HTTP client reports a refused call as an Error whose message is JSON holding the status.
function statusOf(err) {
  try {
    return JSON.parse(err.message).status;
  } catch {
    return undefined;
  }
}

// `save` and `delete` answer `{ error }` instead of throwing; `transaction` throws.
async function refused(status, what, call) {
  let err;
  try {
    err = (await call())?.error;
  } catch (e) {
    err = e;
  }
  check(err, `${what}: expected HTTP ${status}, the call succeeded`);
  check(statusOf(err) === status, `${what}: expected HTTP ${status}, got ${err}`);
}

async function ok(what, call) {
  const r = await call();
  check(!r?.error, `${what}: ${r?.error}`);
}

const toStderr = (...args) => console.error('[sdk]', ...args);
const sdkLog = { error: toStderr, warn: toStderr, info() {}, verbose() {}, debug() {} };

async function main() {
  const client = new DaprClient({
    daprHost: '127.0.0.1',
    daprPort: env('DAPR_HTTP_PORT'),
    communicationProtocol: CommunicationProtocolEnum.HTTP,
    // The SDK logs each refused save or delete, which are expected here: to stderr, kept
    // for a failure's message but apart from the result on stdout.
    logger: { level: LogLevel.Warn, service: sdkLog },
  });
  const state = client.state;
  const get = (key) => state.get(STORE, key);
  // The SDK's `get` returns the value only: ETags and metadata come from the bulk get.
  const item = async (key) => (await state.getBulk(STORE, [key]))[0];

  // save/get; every write changes the ETag.
  await ok('save a', () => state.save(STORE, [{ key: k('a'), value: { n: 1 } }]));
  check(same(await get(k('a')), { n: 1 }), `get a: ${show(await get(k('a')))}`);
  const e1 = (await item(k('a'))).etag;
  check(typeof e1 === 'string' && e1 !== '', `a saved key has an etag, got ${show(e1)}`);
  await ok('save a with its current etag', () => state.save(STORE, [{ key: k('a'), value: { n: 2 }, etag: e1 }]));
  const e2 = (await item(k('a'))).etag;
  check(e2 && e2 !== e1, `the etag changes on a write: ${e1} then ${e2}`);

  // A stale ETag is a conflict (409), a malformed one a bad request (400); neither writes.
  await refused(409, 'save with a stale etag', () =>
    state.save(STORE, [{ key: k('a'), value: { n: 3 }, etag: e1 }]),
  );
  await refused(400, 'save with an invalid etag', () =>
    state.save(STORE, [{ key: k('a'), value: { n: 3 }, etag: 'nope' }]),
  );
  check(same(await get(k('a')), { n: 2 }), 'refused saves change nothing');

  // first-write: a save without an ETag fails once the key exists.
  const firstWrite = { concurrency: StateConcurrencyEnum.CONCURRENCY_FIRST_WRITE };
  await ok('first-write save', () => state.save(STORE, [{ key: k('fw'), value: 'first', options: firstWrite }]));
  await refused(409, 'first-write save on an existing key', () =>
    state.save(STORE, [{ key: k('fw'), value: 'again', options: firstWrite }]),
  );

  // Delete: a stale ETag conflicts, the current one deletes, a missing key is no error.
  await refused(409, 'delete with a stale etag', () => state.delete(STORE, k('a'), { etag: e1 }));
  await ok('delete with the current etag', () => state.delete(STORE, k('a'), { etag: e2 }));
  check((await get(k('a'))) === '', `a deleted key reads empty, got ${show(await get(k('a')))}`);
  await ok('delete a missing key', () => state.delete(STORE, k('a')));

  // Bulk get keeps the request order; a missing key has neither data nor etag.
  await ok('save b and c', () =>
    state.save(STORE, [
      { key: k('b'), value: 'bee' },
      { key: k('c'), value: { c: true } },
    ]),
  );
  const bulk = await state.getBulk(STORE, [k('b'), k('missing'), k('c')]);
  check(same(bulk.map((i) => i.key), [k('b'), k('missing'), k('c')]), `bulk order: ${show(bulk)}`);
  check(bulk[0].data === 'bee' && bulk[0].etag, `bulk item b: ${show(bulk[0])}`);
  check(bulk[1].data === undefined && bulk[1].etag === undefined, `bulk item of a missing key: ${show(bulk[1])}`);
  check(same(bulk[2].data, { c: true }) && bulk[2].etag, `bulk item c: ${show(bulk[2])}`);

  // Transactions apply in order; one stale ETag applies nothing.
  await ok('save t1', () => state.save(STORE, [{ key: k('t1'), value: 1 }]));
  await state.transaction(STORE, [
    { operation: 'delete', request: { key: k('t1') } },
    { operation: 'upsert', request: { key: k('t2'), value: 2 } },
    { operation: 'upsert', request: { key: k('t3'), value: { t: 3 } } },
  ]);
  check((await get(k('t1'))) === '', 'tx: t1 deleted');
  check((await get(k('t2'))) === 2, 'tx: t2 upserted');
  const t3 = await item(k('t3'));
  check(same(t3.data, { t: 3 }), `tx: t3 upserted, got ${show(t3)}`);
  await refused(500, 'a transaction with a stale etag', () =>
    state.transaction(STORE, [
      { operation: 'upsert', request: { key: k('t4'), value: 4 } },
      { operation: 'upsert', request: { key: k('t3'), value: { t: 33 }, etag: e1 } },
    ]),
  );
  check((await get(k('t4'))) === '', 'a failed transaction writes nothing');
  check((await item(k('t3'))).etag === t3.etag, 'a failed transaction changes nothing');
  await state.transaction(STORE, [
    { operation: 'upsert', request: { key: k('t3'), value: { t: 33 }, etag: t3.etag } },
  ]);
  check(same(await get(k('t3')), { t: 33 }), 'a transaction with the current etag applies');

  // TTL: daprd passes `ttlInSeconds` through and reports `ttlExpireTime`.
  const before = Date.now();
  await ok('save with ttlInSeconds', () =>
    state.save(STORE, [{ key: k('ttl'), value: 'soon gone', metadata: { ttlInSeconds: '120' } }]),
  );
  const ttl = await item(k('ttl'));
  const expire = ttl.metadata?.ttlExpireTime;
  check(typeof expire === 'string' && expire.endsWith('Z'), `ttlExpireTime is reported: ${show(ttl)}`);
  const left = (Date.parse(expire) - before) / 1000;
  check(left > 110 && left <= 121, `ttlExpireTime is about 120 s ahead, got ${left} s`);
  await refused(500, 'a non-integer ttlInSeconds', () =>
    state.save(STORE, [{ key: k('ttl-bad'), value: 'x', metadata: { ttlInSeconds: 'soon' } }]),
  );
  check((await get(k('ttl-bad'))) === '', 'a refused TTL save writes nothing');

  // Query (alpha): JSON values, filter, sort, paging.
  const docs = [0, 1, 2, 3, 4].map((i) => ({
    key: k(`q${i}`),
    value: { run, id: i, state: i % 2 === 0 ? 'WA' : 'CA' },
  }));
  await ok('save the documents', () => state.save(STORE, docs));
  const query = {
    filter: { AND: [{ EQ: { run } }, { EQ: { state: 'WA' } }] },
    sort: [{ key: 'id', order: 'DESC' }],
    page: { limit: 2 },
  };
  let page = await state.query(STORE, query);
  check(same(page.results.map((r) => r.key), [k('q4'), k('q2')]), `query page 1: ${show(page)}`);
  check(same(page.results[0].data, docs[4].value), `query returns the value: ${show(page.results[0])}`);
  check(page.results.every((r) => r.etag), 'query results carry etags');
  check(page.token, `a first page of a longer result has a token: ${show(page)}`);
  page = await state.query(STORE, { ...query, page: { limit: 2, token: page.token } });
  check(same(page.results.map((r) => r.key), [k('q0')]), `query page 2: ${show(page)}`);
  check(!page.token, 'the last page has no token');

  // What is left, with the ETags the SDK sees now, for the test to find in stategate.
  const keptKeys = ['b', 'c', 'fw', 't2', 't3', 'ttl', 'q0', 'q1', 'q2', 'q3', 'q4'].map(k);
  const kept = await state.getBulk(STORE, keptKeys);
  for (const i of kept) check(i.etag && i.data !== undefined, `kept key ${i.key}: ${show(i)}`);
  const gone = ['a', 't1', 't4', 'ttl-bad', 'missing'].map(k);
  console.log('all JavaScript Dapr SDK checks passed');
  console.log(
    'RESULT ' +
      JSON.stringify({
        kept: kept.map((i) => ({ key: i.key, etag: i.etag, value: i.data })),
        gone,
        ttl: { key: k('ttl'), etag: ttl.etag, expire },
      }),
  );
}

main().then(
  () => process.exit(0),
  (e) => fail(`unexpected ${e?.name}: ${e?.message ?? e}`),
);
