// The create/edit form. Every save of an existing key carries the version it was read at as
// the Dapr `etag`, so a concurrent change is never overwritten: the service answers 409 and
// the form shows the other client's value, keeping the user's edit.

import * as api from './api.js';
import { describe, render } from './value.js';

const $ = (id) => document.getElementById(id);

/**
 * `ctx`: `store()`, `writing(key, done)` around a save (`done` false when it failed),
 * `saved(key)` after a save, `openKey(key)` to show a key,
 * `auth(retry)` when the token is missing or wrong, `closed()` when the form closes.
 */
export function createEditor(ctx) {
  const form = $('editor');
  const keyInput = $('e-key');
  const valueInput = $('e-value');
  const ttlInput = $('e-ttl');
  const fencingInput = $('e-fencing');
  const errorBox = $('editor-error');
  const conflictBox = $('conflict');
  const saveBtn = $('save-btn');
  let current = null; // {mode: 'new'|'edit', key, etag}
  let theirs = null; // what a conflict found: {etag} or null when the key was deleted

  function kind() {
    return form.querySelector('input[name="e-kind"]:checked').value;
  }

  function setKind(k) {
    form.querySelector(`input[name="e-kind"][value="${k}"]`).checked = true;
  }

  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = !message;
  }

  function reset() {
    showError('');
    conflictBox.hidden = true;
    theirs = null;
    saveBtn.disabled = false;
    $('conflict-mine').disabled = false;
  }

  function openNew() {
    reset();
    current = { mode: 'new', key: '', etag: '' };
    $('editor-h').textContent = 'New key';
    keyInput.readOnly = false;
    keyInput.value = '';
    setKind('json');
    valueInput.value = '';
    ttlInput.value = '';
    fencingInput.value = '';
    $('editor-hint').textContent = 'Creates the key only if it does not exist yet.';
    form.hidden = false;
    keyInput.focus();
  }

  /** `open`: `{key, entry, desc}` of the key shown. */
  function openEdit(open) {
    reset();
    current = { mode: 'edit', key: open.key, etag: open.entry.etag };
    $('editor-h').textContent = 'Edit';
    keyInput.readOnly = true;
    keyInput.value = open.key;
    setKind(open.desc.kind === 'json' ? 'json' : 'string');
    valueInput.value = open.desc.text;
    const left = open.entry.expiresAt ? Math.ceil((open.entry.expiresAt - Date.now()) / 1000) : 0;
    ttlInput.value = left > 0 ? String(left) : '';
    fencingInput.value = '';
    let hint = `Saves only if the key still has version ${open.entry.etag}. ` +
      'Saving sets the TTL anew (empty: no expiry).';
    if (open.desc.kind === 'text') {
      hint += ' The stored value is not JSON: the Dapr API stores JSON, so it will be saved as a JSON string.';
    }
    if (open.entry.fencingToken) hint += ' This key is protected by a fencing token: give one at least as high.';
    $('editor-hint').textContent = hint;
    form.hidden = false;
    valueInput.focus();
  }

  function close() {
    current = null;
    form.hidden = true;
    ctx.closed();
  }

  function isOpen() {
    return current !== null;
  }

  /** Another client changed the key being edited (seen on the live feed). */
  function noteRemoteChange(key, etag, deleted) {
    if (!current || current.mode !== 'edit' || current.key !== key || etag === current.etag) return;
    if (!conflictBox.hidden) return;
    showError(deleted
      ? 'Another client deleted this key while you were editing: saving will report a conflict.'
      : `Another client changed this key (now version ${etag}) while you were editing: saving will report a conflict.`);
  }

  /** The value to send as JSON text, or throws a message for the user. */
  function valueJson() {
    const text = valueInput.value;
    if (kind() === 'string') return JSON.stringify(text);
    if (!text.trim()) throw new Error('The value is empty. Type JSON (e.g. {"n": 1} or "text"), or choose text.');
    try {
      JSON.parse(text);
    } catch (e) {
      throw new Error(`The value is not valid JSON (${e.message}). Fix it, or choose "text" to save it as a string.`);
    }
    return text;
  }

  function ttlSeconds() {
    const t = ttlInput.value.trim();
    if (!t) return 0;
    const n = Number(t);
    if (!Number.isInteger(n) || n < 1) throw new Error('TTL must be a whole number of seconds, 1 or more (or empty).');
    return n;
  }

  async function save() {
    if (!current) return;
    showError('');
    const key = keyInput.value;
    let body;
    try {
      if (!key) throw new Error('The key is empty.');
      if (key.includes('||')) throw new Error('A key cannot contain "||".');
      body = {
        key,
        valueJson: valueJson(),
        etag: current.etag,
        create: current.mode === 'new',
        ttlSeconds: ttlSeconds(),
        fencingToken: fencingInput.value.trim(),
      };
    } catch (e) {
      showError(e.message);
      return;
    }
    saveBtn.disabled = true;
    ctx.writing(key, true);
    try {
      await api.saveKey(ctx.store(), body);
      close();
      ctx.saved(key);
    } catch (e) {
      ctx.writing(key, false);
      saveBtn.disabled = false;
      if (e instanceof api.AuthError) ctx.auth(save);
      else if (api.isConflict(e) && current.mode === 'new') {
        showError(`A key named "${key}" already exists: nothing was saved. Open it to edit it.`);
      } else if (api.isConflict(e)) await showConflict(key);
      else showError(e.message);
    }
  }

  /** Reads the other client's version and shows it; the user's edit stays in the form. */
  async function showConflict(key) {
    showError('');
    let entry;
    try {
      entry = await api.getKey(ctx.store(), key);
    } catch (e) {
      if (e instanceof api.AuthError) ctx.auth(() => showConflict(key));
      else showError('Conflict: the key changed, and reading it again failed: ' + e.message);
      return;
    }
    theirs = entry ? { etag: entry.etag } : null;
    const text = $('conflict-text');
    const pre = $('conflict-value');
    if (entry) {
      text.textContent = `You edited version ${current.etag}; the key now has version ${entry.etag}. ` +
        'Their value:';
      const desc = describe(entry.bytes, entry.json);
      pre.textContent = render(desc, entry.bytes, false).text;
      pre.hidden = false;
    } else {
      text.textContent = 'Another client deleted the key after you opened it.';
      pre.textContent = '';
      pre.hidden = true;
    }
    $('conflict-mine').textContent = entry ? 'Save mine over theirs' : 'Create it again with mine';
    conflictBox.hidden = false;
    $('conflict-theirs').focus();
  }

  function saveMine() {
    if (!current) return;
    if (theirs) current.etag = theirs.etag;
    else current = { mode: 'new', key: current.key, etag: '' };
    conflictBox.hidden = true;
    save();
  }

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    save();
  });
  form.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) {
      ev.preventDefault();
      save();
    }
  });
  $('cancel-btn').addEventListener('click', close);
  $('conflict-theirs').addEventListener('click', () => {
    const key = current && current.key;
    close();
    if (key) ctx.openKey(key);
  });
  $('conflict-mine').addEventListener('click', saveMine);

  return { openNew, openEdit, close, isOpen, noteRemoteChange };
}
