// The stategate web console: keys of a store, a key's value and metadata, edits guarded by
// the version (ETag), live changes, the service status. Plain DOM, no framework.

import * as api from './api.js';
import { createChanges } from './changes.js';
import { createEditor } from './editor.js';
import { LiveFeed } from './live.js';
import { createStatus } from './status.js';
import { bytesText, describe, duration, keyMatcher, patternOf, render } from './value.js';

const $ = (id) => document.getElementById(id);
const PAGE = 100;
/** Empty pages followed before giving up on a rare filter (each examines a bounded number of keys). */
const MAX_EMPTY_PAGES = 20;
/** Keys the list takes from live changes before it waits for a reload (r). */
const MAX_LIVE_KEYS = 2000;

const state = {
  store: '',
  keys: [],
  pageToken: null,
  active: -1,
  open: null, // {key, entry, desc, showAll}
  listGeneration: 0,
  openGeneration: 0,
  feed: null,
  pendingAuth: [],
  ownWrites: new Set(), // keys this tab is writing: their next change is ours, not news
  ttlTimer: null,
};

const editor = createEditor({
  store: () => state.store,
  writing: (key, started) => (started ? state.ownWrites.add(key) : state.ownWrites.delete(key)),
  saved: (key) => {
    addKey(key);
    openKey(key);
  },
  openKey: (key) => openKey(key),
  auth: (retry) => needToken(retry),
  closed: () => {
    if (state.open) $('detail').hidden = false;
    else $('detail-empty').hidden = false;
  },
});

let filterTimer = null;
const changes = createChanges();
const status = createStatus({ auth: (retry) => needToken(retry) });

// ---- errors and the token ----

function banner(message) {
  const b = $('banner');
  b.textContent = message || '';
  b.hidden = !message;
}

/** Reports a failed call: a missing token opens the prompt and `retry` runs once unlocked. */
function failed(e, retry) {
  if (e instanceof api.AuthError) needToken(retry);
  else if (e.name !== 'AbortError') banner(e.message);
}

function needToken(retry) {
  if (retry) state.pendingAuth.push(retry);
  const dlg = $('token-dlg');
  $('token-error').hidden = !api.token();
  $('token-error').textContent = api.token() ? 'The service refused this token.' : '';
  setConn('unauthorized');
  if (!dlg.open) {
    dlg.showModal();
    $('token-input').focus();
  }
}

async function unlock(ev) {
  ev.preventDefault();
  const value = $('token-input').value;
  if (!value) {
    $('token-error').textContent = 'Enter the token the service was started with.';
    $('token-error').hidden = false;
    return;
  }
  api.setToken(value);
  try {
    await api.metadata();
  } catch (e) {
    if (e instanceof api.AuthError) {
      api.setToken('');
      $('token-error').textContent = 'The service refused this token.';
      $('token-error').hidden = false;
      $('token-input').select();
      return;
    }
  }
  $('token-input').value = '';
  $('token-dlg').close();
  updateLock();
  const retries = state.pendingAuth.splice(0);
  if (!state.store) start();
  else {
    startLive();
    for (const r of retries) r();
  }
}

/** The header button: forget the token when one is kept, or ask for one when it is missing. */
function updateLock() {
  const btn = $('lock-btn');
  const kept = !!api.token();
  const missing = $('conn').dataset.state === 'unauthorized';
  btn.hidden = !kept && !missing;
  btn.textContent = kept ? 'Forget token' : 'Enter token';
  btn.title = kept ? 'Forget the api token kept in this tab' : 'Enter the api token';
}

function lockClicked() {
  if (!api.token()) {
    needToken();
    return;
  }
  api.setToken('');
  if (state.feed) state.feed.stop();
  location.reload();
}

// ---- stores ----

async function start() {
  let meta;
  try {
    meta = await api.metadata();
  } catch (e) {
    failed(e, start);
    return;
  }
  banner('');
  const names = (meta.components || []).map((c) => c.name);
  const select = $('store');
  select.replaceChildren(...names.map((n) => new Option(n, n)));
  const saved = localStorage.getItem('stategate.store');
  select.value = names.includes(saved) ? saved : names[0] || '';
  updateLock();
  useStore(select.value);
}

function useStore(name) {
  state.store = name;
  localStorage.setItem('stategate.store', name);
  closeDetail();
  reloadKeys();
  changes.clear();
  startLive();
}

// ---- the key list ----

async function reloadKeys() {
  clearTimeout(filterTimer); // This reload already reads the filter.
  state.keys = [];
  state.pageToken = null;
  state.active = -1;
  await loadPage(true);
}

async function loadPage(reset) {
  const generation = ++state.listGeneration;
  const pattern = patternOf($('filter').value);
  let token = reset ? null : state.pageToken;
  const found = [];
  try {
    for (let i = 0; i < MAX_EMPTY_PAGES; i++) {
      const page = await api.listKeys(state.store, pattern, PAGE, token);
      if (generation !== state.listGeneration) return;
      found.push(...page.keys);
      token = page.token || null;
      if (found.length || !token) break;
    }
  } catch (e) {
    if (generation === state.listGeneration) failed(e, () => loadPage(reset));
    return;
  }
  banner('');
  state.keys = reset ? found : state.keys.concat(found);
  state.pageToken = token;
  renderKeys();
}

function renderKeys() {
  const list = $('key-list');
  const items = state.keys.map((key, i) => {
    const li = document.createElement('li');
    li.id = 'key-' + i;
    li.setAttribute('role', 'option');
    li.dataset.key = key;
    li.textContent = key;
    li.title = key;
    li.setAttribute('aria-selected', String(i === state.active));
    if (state.open && state.open.key === key) li.classList.add('open');
    return li;
  });
  list.replaceChildren(...items);
  if (!items.length) {
    const li = document.createElement('li');
    li.className = 'muted none';
    li.textContent = $('filter').value.trim() ? 'No key matches the filter.' : 'No keys in this store.';
    list.append(li);
  }
  const more = !!state.pageToken;
  $('more-btn').hidden = !more;
  $('key-count').textContent = `${state.keys.length} key${state.keys.length === 1 ? '' : 's'}${more ? ' shown' : ''}`;
  if (state.active >= 0) list.setAttribute('aria-activedescendant', 'key-' + state.active);
  else list.removeAttribute('aria-activedescendant');
}

/** Renders the list at most once a frame, however many changes arrive. */
let renderQueued = false;
function renderKeysSoon() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    renderKeys();
  });
}

/** Puts a key that now exists into the loaded part of the list, in key order. */
function addKey(key) {
  if (state.keys.includes(key) || !listWouldShow(key) || state.keys.length >= MAX_LIVE_KEYS) return;
  state.keys = state.keys.concat(key).sort(byBytes);
  renderKeysSoon();
}

function setActive(i) {
  if (!state.keys.length) return;
  state.active = Math.max(0, Math.min(state.keys.length - 1, i));
  const list = $('key-list');
  for (const li of list.querySelectorAll('li[role="option"]')) {
    li.setAttribute('aria-selected', String(li.id === 'key-' + state.active));
  }
  list.setAttribute('aria-activedescendant', 'key-' + state.active);
  const li = $('key-' + state.active);
  if (li) li.scrollIntoView({ block: 'nearest' });
}

function listKeydown(ev) {
  const moves = { ArrowDown: 1, ArrowUp: -1, PageDown: 10, PageUp: -10 };
  if (ev.key in moves) {
    ev.preventDefault();
    setActive(state.active < 0 ? 0 : state.active + moves[ev.key]);
  } else if (ev.key === 'Home' || ev.key === 'End') {
    ev.preventDefault();
    setActive(ev.key === 'Home' ? 0 : state.keys.length - 1);
  } else if (ev.key === 'Enter' && state.active >= 0) {
    ev.preventDefault();
    openKey(state.keys[state.active]);
  }
}

// ---- one key ----

function closeDetail() {
  state.openGeneration++; // A key still loading is not shown.
  state.open = null;
  clearInterval(state.ttlTimer);
  $('detail').hidden = true;
  $('detail-empty').hidden = editor.isOpen();
  $('confirm-delete').hidden = true;
}

async function openKey(key, note) {
  const generation = ++state.openGeneration;
  let entry;
  try {
    entry = await api.getKey(state.store, key);
  } catch (e) {
    if (generation === state.openGeneration) failed(e, () => openKey(key, note));
    return;
  }
  if (generation !== state.openGeneration) return;
  if (editor.isOpen()) editor.close();
  state.open = entry ? { key, entry, desc: describe(entry.bytes, entry.json), showAll: false } : null;
  const i = state.keys.indexOf(key);
  if (i >= 0) state.active = i;
  renderKeys();
  $('detail-empty').hidden = true;
  $('detail').hidden = false;
  $('confirm-delete').hidden = true;
  $('detail-h').textContent = key;
  $('detail-h').title = key;
  if (!entry) {
    renderMissing(note);
    return;
  }
  renderDetail(note);
}

function renderMissing(note) {
  for (const id of ['m-version', 'm-ttl', 'm-fencing', 'm-type']) $(id).textContent = '—';
  $('value').textContent = '';
  $('value').hidden = true;
  $('show-all').hidden = true;
  $('edit-btn').disabled = true;
  $('delete-btn').disabled = true;
  showNote(note || 'This key does not exist (it was deleted, or it expired).');
  clearInterval(state.ttlTimer);
}

function renderDetail(note) {
  const { entry, desc } = state.open;
  $('m-version').textContent = entry.etag;
  $('m-fencing').textContent = entry.fencingToken || 'none';
  $('m-type').textContent = `${desc.kind === 'json' ? 'JSON' : desc.kind}, ${bytesText(desc.size)}`;
  $('edit-btn').disabled = desc.kind === 'binary';
  $('edit-btn').title = desc.kind === 'binary'
    ? 'Binary values cannot be edited over the Dapr HTTP API (write them over MQTT or gRPC)'
    : 'Edit (e)';
  $('delete-btn').disabled = false;
  showNote(note || '');
  renderValue();
  clearInterval(state.ttlTimer);
  tickTtl();
  if (entry.expiresAt) state.ttlTimer = setInterval(tickTtl, 1000);
}

function renderValue() {
  const { entry, desc, showAll } = state.open;
  const shown = render(desc, entry.bytes, showAll);
  const pre = $('value');
  pre.hidden = false;
  pre.textContent = shown.text;
  pre.classList.toggle('hex', desc.kind === 'binary');
  const btn = $('show-all');
  btn.hidden = !shown.truncated && !showAll;
  btn.textContent = showAll ? 'Show less' : `Show all (${shown.total})`;
}

function tickTtl() {
  if (!state.open) return;
  const at = state.open.entry.expiresAt;
  if (!at) {
    $('m-ttl').textContent = 'no expiry';
    return;
  }
  const left = (at - Date.now()) / 1000;
  $('m-ttl').textContent = left > 0 ? duration(left) : 'expired';
}

function showNote(text) {
  $('detail-note').textContent = text;
  $('detail-note').hidden = !text;
}

function editOpen() {
  if (!state.open || state.open.desc.kind === 'binary') return;
  $('detail').hidden = true;
  $('detail-empty').hidden = true;
  editor.openEdit(state.open);
}

function newKey() {
  $('detail').hidden = true;
  $('detail-empty').hidden = true;
  editor.openNew();
}

async function deleteOpen() {
  if (!state.open) return;
  const { key, entry } = state.open;
  $('confirm-delete').hidden = true;
  // The change event may arrive before the answer: it is ours.
  state.ownWrites.add(key);
  try {
    await api.deleteKey(state.store, key, entry.etag);
  } catch (e) {
    state.ownWrites.delete(key);
    if (api.isConflict(e)) {
      await openKey(key, 'Not deleted: another client changed this key after you opened it. This is its new version.');
    } else if (e instanceof api.ApiError && e.status >= 400 && e.status < 500) {
      showNote('Not deleted: ' + e.message);
    } else failed(e, deleteOpen);
    return;
  }
  state.keys = state.keys.filter((k) => k !== key);
  closeDetail();
  renderKeys();
  $('detail-empty').textContent = `Deleted "${key}". Select another key, or press n for a new one.`;
}

// ---- live changes ----

function setConn(s, detail) {
  const labels = {
    connecting: 'connecting…',
    live: 'live',
    reconnecting: 'reconnecting…',
    unauthorized: 'token required',
    closed: 'offline',
  };
  const el = $('conn');
  el.dataset.state = s;
  el.textContent = labels[s] || s;
  el.title = detail || '';
  updateLock();
}

function startLive() {
  if (state.feed) state.feed.stop();
  if (!state.store) return;
  state.feed = new LiveFeed(state.store, {
    onEvent: liveEvent,
    onState: (s, detail) => {
      setConn(s, detail);
      if (s === 'unauthorized') needToken();
    },
  });
  state.feed.start();
}

function liveEvent(ev) {
  switch (ev.type) {
    case 'overflow': // The feed reconnects; the service then resumes or resets.
    case 'synced':
      return;
    case 'reset':
      changes.gap('Reconnected after a long break: the changes made meanwhile are no longer kept, so the list was reloaded.');
      reloadKeys();
      if (state.open && !editor.isOpen()) openKey(state.open.key);
      return;
  }
  // A reset's snapshot: the current values, not changes (the reload above shows them).
  if (ev.snapshot) return;
  followChange(ev);
  changes.add(ev);
}

/** Keeps the key list and the open key in step with a change. */
function followChange(ev) {
  const deleted = ev.type === 'delete';
  if (deleted && state.keys.includes(ev.key)) {
    state.keys = state.keys.filter((k) => k !== ev.key);
    if (state.active >= state.keys.length) state.active = state.keys.length - 1;
    renderKeysSoon();
  } else if (!deleted) addKey(ev.key);
  if (state.ownWrites.delete(ev.key)) return; // Our own save: the editor reopens the key.
  if (!state.open || state.open.key !== ev.key || state.open.entry.etag === ev.etag) return;
  if (editor.isOpen()) editor.noteRemoteChange(ev.key, ev.etag, deleted);
  else openKey(ev.key, deleted ? (ev.reason === 'expired' ? 'This key expired just now.' : 'Another client deleted this key just now.')
    : 'Another client changed this key just now: this is the new version.');
}

const utf8 = new TextEncoder();

/** Key order as the service sorts keys: by UTF-8 bytes. */
function byBytes(a, b) {
  const x = utf8.encode(a);
  const y = utf8.encode(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
}

/** Whether a new key belongs in the loaded part of the list. */
function listWouldShow(key) {
  if (!keyMatcher($('filter').value)(key)) return false;
  if (!state.pageToken) return true;
  const last = state.keys[state.keys.length - 1];
  return last !== undefined && byBytes(key, last) < 0;
}

// ---- keyboard and wiring ----

function typing(el) {
  return el && (el.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(el.tagName));
}

function globalKeydown(ev) {
  if (document.querySelector('dialog[open]')) return; // Dialogs handle their own keys (Esc closes).
  if (ev.key === 'Escape') {
    if (editor.isOpen()) editor.close();
    else if (!$('confirm-delete').hidden) $('confirm-delete').hidden = true;
    else if (typing(document.activeElement)) document.activeElement.blur();
    return;
  }
  if (ev.ctrlKey || ev.metaKey || ev.altKey || typing(document.activeElement)) return;
  // While the form is open, n and e would throw the edit away.
  if (editor.isOpen() && (ev.key === 'n' || ev.key === 'e')) return;
  const actions = {
    '/': () => $('filter').focus(),
    n: newKey,
    e: editOpen,
    p: changes.togglePause,
    s: status.show,
    r: reloadKeys,
    '?': () => $('help-dlg').showModal(),
  };
  const action = actions[ev.key];
  if (action) {
    ev.preventDefault();
    action();
  }
}

function wire() {
  $('store').addEventListener('change', (ev) => useStore(ev.target.value));
  $('filter').addEventListener('input', () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(reloadKeys, 150);
  });
  $('filter').addEventListener('keydown', (ev) => {
    if (ev.key === 'ArrowDown' || ev.key === 'Enter') {
      ev.preventDefault();
      $('key-list').focus();
      setActive(state.active < 0 ? 0 : state.active);
      if (ev.key === 'Enter' && state.active >= 0) openKey(state.keys[state.active]);
    }
  });
  $('key-list').addEventListener('keydown', listKeydown);
  $('key-list').addEventListener('click', (ev) => {
    const li = ev.target.closest('li[role="option"]');
    if (li) openKey(li.dataset.key);
  });
  $('more-btn').addEventListener('click', () => loadPage(false));
  $('new-btn').addEventListener('click', newKey);
  $('edit-btn').addEventListener('click', editOpen);
  $('delete-btn').addEventListener('click', () => {
    $('confirm-delete').hidden = false;
    $('confirm-no').focus();
  });
  $('confirm-yes').addEventListener('click', deleteOpen);
  $('confirm-no').addEventListener('click', () => ($('confirm-delete').hidden = true));
  $('show-all').addEventListener('click', () => {
    state.open.showAll = !state.open.showAll;
    renderValue();
  });
  $('live-list').addEventListener('click', (ev) => {
    const btn = ev.target.closest('button.key');
    if (btn) openKey(btn.textContent);
  });
  $('help-btn').addEventListener('click', () => $('help-dlg').showModal());
  $('lock-btn').addEventListener('click', lockClicked);
  $('token-form').addEventListener('submit', unlock);
  $('token-dlg').addEventListener('close', () => {
    if (!api.token()) banner('This service needs an api token: press "Enter token" to give it.');
    updateLock();
  });
  document.addEventListener('keydown', globalKeydown);
}

wire();
start();
