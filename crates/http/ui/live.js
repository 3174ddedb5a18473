// The live change feed of a store (server-sent events), kept connected.
//
// Without an api token the browser's own EventSource is used, with its built-in reconnect.
// EventSource cannot send headers, so with a token a fetch()-based reader sends the token as
// the `dapr-api-token` header (never in the URL) and reconnects by itself.
// Both send the last event id back as Last-Event-ID on reconnect, and the service resumes from
// it: the changes made while disconnected arrive first, none twice. When the service no longer
// has them (a long disconnection, or it restarted) it sends `reset` and the current value of
// every key (`snapshot: true`), then `synced`: the console then marks the gap and reloads.

import { authHeaders, token } from './api.js';

const MAX_BACKOFF_MS = 10000;

const TYPES = ['set', 'delete', 'overflow', 'reset', 'synced'];

/**
 * `onEvent({type: 'set'|'delete'|'overflow'|'reset'|'synced', key, data, etag, reason, base64,
 * snapshot})`; `onState(state, detail)` with state `connecting`, `live`, `reconnecting`,
 * `unauthorized` or `closed`. After a reconnection the feed resumes where it left off (or a
 * `reset` says it could not).
 */
export class LiveFeed {
  constructor(store, { onEvent, onState }) {
    this.url = `/v1.0-alpha1/state/${encodeURIComponent(store)}/subscribe`;
    this.onEvent = onEvent;
    this.onState = onState;
    this.stopped = false;
    this.failures = 0;
    this.timer = null;
    this.source = null;
    this.abort = null;
    this.lastId = ''; // Sent back as Last-Event-ID on reconnect, as EventSource does.
  }

  start() {
    this.stopped = false;
    this.onState('connecting');
    if (token()) this.readWithFetch();
    else this.readWithEventSource();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.source) this.source.close();
    if (this.abort) this.abort.abort();
    this.source = null;
    this.abort = null;
    this.onState('closed');
  }

  connected() {
    this.failures = 0;
    this.onState('live');
  }

  dispatch(type, data) {
    if (!TYPES.includes(type)) return;
    let body = {};
    try {
      body = data ? JSON.parse(data) : {};
    } catch (_) {
      return;
    }
    const base64 = !!(body.metadata && body.metadata.contentEncoding === 'base64');
    this.onEvent({
      type, key: body.key, data: body.data, etag: body.etag, reason: body.reason, base64,
      snapshot: body.snapshot === true,
    });
  }

  /** Reconnects after a growing pause (0.5 s, 1 s, 2 s ... 10 s). */
  retryLater(why) {
    if (this.stopped) return;
    this.failures++;
    const delay = Math.min(MAX_BACKOFF_MS, 250 * 2 ** Math.min(this.failures, 6));
    this.onState('reconnecting', why);
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      if (this.stopped) return;
      if (token()) this.readWithFetch();
      else this.readWithEventSource();
    }, delay);
  }

  readWithEventSource() {
    // A new EventSource starts without the last id (only its own reconnects send it), so a
    // feed that had to start over names its position in the URL.
    const url = this.lastId ? `${this.url}?since=${encodeURIComponent(this.lastId)}` : this.url;
    const es = new EventSource(url);
    this.source = es;
    es.onopen = () => this.connected();
    for (const type of TYPES) {
      es.addEventListener(type, (ev) => {
        this.lastId = ev.lastEventId;
        this.dispatch(type, ev.data);
      });
    }
    es.onerror = () => {
      if (this.stopped || this.source !== es) return;
      if (es.readyState === EventSource.CONNECTING) {
        // The browser reconnects by itself.
        this.onState('reconnecting', 'connection lost');
        return;
      }
      // Closed for good (an error status, such as 401 when a token became required).
      es.close();
      this.source = null;
      this.probe();
    };
  }

  /** After EventSource gave up: find out whether a token is needed, else retry. */
  async probe() {
    try {
      const res = await fetch(this.url, { headers: authHeaders(), cache: 'no-store', credentials: 'omit' });
      if (res.body) res.body.cancel().catch(() => {});
      if (res.status === 401) {
        this.onState('unauthorized');
        return;
      }
    } catch (_) {
      // Not reachable yet: retry below.
    }
    this.retryLater('connection refused');
  }

  async readWithFetch() {
    const abort = new AbortController();
    this.abort = abort;
    let res;
    try {
      const headers = authHeaders({ accept: 'text/event-stream' });
      if (this.lastId) headers.set('last-event-id', this.lastId);
      res = await fetch(this.url, {
        headers,
        cache: 'no-store',
        credentials: 'omit',
        signal: abort.signal,
      });
    } catch (e) {
      if (!abort.signal.aborted) this.retryLater('connection refused');
      return;
    }
    if (res.status === 401) {
      this.onState('unauthorized');
      return;
    }
    if (!res.ok || !res.body) {
      this.retryLater('HTTP ' + res.status);
      return;
    }
    this.connected();
    try {
      await this.parse(res.body, abort.signal);
    } catch (_) {
      // A dropped connection ends up here, as does stop().
    }
    if (!abort.signal.aborted) this.retryLater('connection lost');
  }

  /** Parses a text/event-stream body (https://html.spec.whatwg.org/#event-stream-interpretation). */
  async parse(body, signal) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    let type = '';
    let data = [];
    // The id in effect, committed when an event is dispatched, as EventSource does: an event
    // cut short by a dropped connection does not move it.
    let id = this.lastId;
    for (;;) {
      const { value, done } = await reader.read();
      if (done || signal.aborted) return;
      buffer += value;
      let nl;
      while ((nl = buffer.search(/\r\n|\r|\n/)) >= 0) {
        // A lone CR at the end may be the first half of CRLF: wait for the next chunk.
        if (buffer[nl] === '\r' && nl === buffer.length - 1) break;
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + (buffer.startsWith('\r\n', nl) ? 2 : 1));
        if (line === '') {
          this.lastId = id;
          if (data.length) this.dispatch(type || 'message', data.join('\n'));
          type = '';
          data = [];
          continue;
        }
        if (line.startsWith(':')) continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? '' : line.slice(colon + 1);
        if (val.startsWith(' ')) val = val.slice(1);
        if (field === 'event') type = val;
        else if (field === 'data') data.push(val);
        else if (field === 'id' && !val.includes('\0')) id = val;
      }
    }
  }
}
