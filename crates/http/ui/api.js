// Calls to the stategate HTTP door. Every call sends the api token (when one was given) as
// the `dapr-api-token` header: the token never goes into a URL.

const TOKEN_KEY = 'stategate.apiToken';

/** The service refused the api token (or none was given and one is required). */
export class AuthError extends Error {
  constructor() {
    super('the api token is missing or wrong');
    this.name = 'AuthError';
  }
}

/** An error answer: `status` 0 means the service could not be reached. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** Request headers with the token. */
export function authHeaders(extra) {
  const h = new Headers(extra || {});
  const t = token();
  if (t) h.set('dapr-api-token', t);
  return h;
}

async function call(method, path, options = {}) {
  let res;
  try {
    res = await fetch(path, {
      method,
      headers: authHeaders(options.headers),
      body: options.body,
      cache: 'no-store',
      credentials: 'omit',
      signal: options.signal,
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'NETWORK', 'The service cannot be reached (' + e.message + ').');
  }
  if (res.status === 401) throw new AuthError();
  if (!res.ok) throw await errorOf(res);
  return res;
}

async function errorOf(res) {
  const text = await res.text().catch(() => '');
  try {
    const body = JSON.parse(text);
    if (body && typeof body.message === 'string') {
      return new ApiError(res.status, body.errorCode || '', body.message);
    }
  } catch (_) {
    // Not JSON: the text itself is the message.
  }
  return new ApiError(res.status, '', text || res.status + ' ' + res.statusText);
}

const enc = encodeURIComponent;

export async function metadata() {
  return (await call('GET', '/v1.0/metadata')).json();
}

export async function status() {
  return (await call('GET', '/v1.0-alpha1/stategate/status')).json();
}

/** One page of key names: `{keys, token}`; follow `token` for the next page. */
export async function listKeys(store, pattern, limit, pageToken, signal) {
  const q = new URLSearchParams();
  if (pattern) q.set('pattern', pattern);
  q.set('limit', String(limit));
  if (pageToken) q.set('token', pageToken);
  const res = await call('GET', `/v1.0-alpha1/state/${enc(store)}/keys?${q}`, { signal });
  return res.json();
}

/**
 * A key with its value bytes and metadata, or null when there is no such key.
 * `{bytes, json, etag, expiresAt (ms since the epoch or null), fencingToken}`.
 */
export async function getKey(store, key) {
  const res = await call('GET', `/v1.0/state/${enc(store)}/${enc(key)}`);
  if (res.status === 204) return null;
  const bytes = new Uint8Array(await res.arrayBuffer());
  const expire = res.headers.get('metadata.ttlExpireTime');
  const expiresAt = expire ? Date.parse(expire) : NaN;
  return {
    bytes,
    json: (res.headers.get('content-type') || '').startsWith('application/json'),
    etag: res.headers.get('etag') || '',
    expiresAt: Number.isNaN(expiresAt) ? null : expiresAt,
    fencingToken: res.headers.get('metadata.fencingToken') || '',
  };
}

/**
 * Saves one key. `valueJson` is JSON text, sent as written (so big numbers are not rounded
 * here) and stored as its compact JSON text, as Dapr does. `etag`: the version the key must
 * still have; `create`: fail if the key exists (first-write).
 */
export async function saveKey(store, { key, valueJson, etag, create, ttlSeconds, fencingToken }) {
  JSON.parse(valueJson); // Never send a body that is not JSON.
  let item = '{"key":' + JSON.stringify(key) + ',"value":' + valueJson;
  if (etag) item += ',"etag":' + JSON.stringify(etag);
  if (create) item += ',"options":{"concurrency":"first-write"}';
  const metadata = {};
  if (ttlSeconds) metadata.ttlInSeconds = String(ttlSeconds);
  if (fencingToken) metadata.fencingToken = fencingToken;
  if (Object.keys(metadata).length) item += ',"metadata":' + JSON.stringify(metadata);
  await call('POST', `/v1.0/state/${enc(store)}`, {
    headers: { 'content-type': 'application/json' },
    body: '[' + item + '}]',
  });
}

/** Deletes one key if it still has version `etag`. */
export async function deleteKey(store, key, etag, fencingToken) {
  const q = fencingToken ? '?metadata.fencingToken=' + enc(fencingToken) : '';
  await call('DELETE', `/v1.0/state/${enc(store)}/${enc(key)}${q}`, {
    headers: etag ? { 'if-match': etag } : {},
  });
}

/** Whether an error is an ETag conflict (someone else changed the key first). */
export function isConflict(e) {
  return e instanceof ApiError && e.status === 409 && /etag|first-write/i.test(e.message);
}
