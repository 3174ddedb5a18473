// The live changes panel: newest first, a client-side filter, pause and resume (changes that
// arrive while paused wait, and are listed on resume).

import { keyMatcher, previewOf } from './value.js';

const $ = (id) => document.getElementById(id);
const MAX_ROWS = 300;
const MAX_PAUSED = 1000;

export function createChanges() {
  const list = $('live-list');
  let paused = false;
  let pending = [];
  let dropped = 0;
  let match = () => true;

  function row(ev, at) {
    const li = document.createElement('li');
    const kind = ev.type === 'delete' && ev.reason === 'expired' ? 'expired' : ev.type;
    li.className = 'change ' + kind;
    li.dataset.key = ev.key;
    const time = document.createElement('time');
    time.textContent = at.toLocaleTimeString('en-GB');
    const badge = document.createElement('span');
    badge.className = 'badge';
    badge.textContent = kind;
    const key = document.createElement('button');
    key.type = 'button';
    key.className = 'link key';
    key.textContent = ev.key;
    key.title = 'Open ' + ev.key;
    const preview = document.createElement('span');
    preview.className = 'preview';
    preview.textContent = ev.type === 'set' ? previewOf(ev.data, ev.base64) : '';
    const version = document.createElement('span');
    version.className = 'version mono';
    version.textContent = ev.etag || '';
    li.append(time, badge, key, preview, version);
    li.hidden = !match(ev.key);
    list.prepend(li);
    while (list.children.length > MAX_ROWS) list.lastElementChild.remove();
  }

  function showPaused() {
    const el = $('live-paused');
    const n = pending.length + dropped;
    el.hidden = !paused;
    el.textContent = `Paused: ${n} new change${n === 1 ? '' : 's'} waiting` +
      (dropped ? ` (only the last ${MAX_PAUSED} are kept)` : '') + '. Press Resume or p.';
  }

  /** Lists a change (or keeps it for later while paused). */
  function add(ev) {
    const at = new Date();
    if (!paused) {
      row(ev, at);
      return;
    }
    if (pending.length >= MAX_PAUSED) {
      pending.shift();
      dropped++;
    }
    pending.push({ ev, at });
    showPaused();
  }

  /** A marker: changes may be missing here. */
  function gap(text) {
    const li = document.createElement('li');
    li.className = 'change gap';
    li.textContent = text;
    list.prepend(li);
  }

  function togglePause() {
    paused = !paused;
    const btn = $('pause-btn');
    btn.textContent = paused ? 'Resume' : 'Pause';
    btn.setAttribute('aria-pressed', String(paused));
    if (!paused) {
      for (const p of pending) row(p.ev, p.at);
      pending = [];
      dropped = 0;
    }
    showPaused();
  }

  function filter(text) {
    match = keyMatcher(text);
    for (const li of list.children) {
      if (li.dataset.key !== undefined) li.hidden = !match(li.dataset.key);
    }
  }

  function clear() {
    list.replaceChildren();
    pending = [];
    dropped = 0;
    showPaused();
  }

  $('pause-btn').addEventListener('click', togglePause);
  $('clear-btn').addEventListener('click', clear);
  $('live-filter').addEventListener('input', (ev) => filter(ev.target.value));

  return { add, gap, togglePause, clear };
}
