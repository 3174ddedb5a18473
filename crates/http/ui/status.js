// The status dialog: version, uptime, storage, key count, doors, MQTT clients. Refreshed
// every 5 s while open.

import * as api from './api.js';
import { duration } from './value.js';

const $ = (id) => document.getElementById(id);

/** `auth(retry)` is called when the token is missing or wrong. */
export function createStatus({ auth }) {
  const dlg = $('status-dlg');
  let timer = null;

  async function show() {
    if (!dlg.open) dlg.showModal();
    await refresh();
    clearInterval(timer);
    timer = setInterval(() => (dlg.open ? refresh() : clearInterval(timer)), 5000);
  }

  async function refresh() {
    let s;
    try {
      s = await api.status();
    } catch (e) {
      if (e instanceof api.AuthError) {
        dlg.close();
        auth(show);
      } else {
        $('status-error').textContent = e.message;
        $('status-error').hidden = false;
      }
      return;
    }
    $('status-error').hidden = true;
    const storage = s.storage.kind === 'durable'
      ? `durable (${s.storage.dataDir}, fsync ${s.storage.fsync})`
      : 'memory (lost when the service stops)';
    const clients = s.mqttConnectedClients === null || s.mqttConnectedClients === undefined
      ? `unknown (the ${s.mqttBroker} broker cannot tell)`
      : `${s.mqttConnectedClients} (${s.mqttBroker} broker)`;
    const rows = [
      ['version', s.version],
      ['node id', s.nodeId],
      ['uptime', `${duration(s.uptimeSeconds)} (since ${s.startedAt})`],
      ['storage', storage],
      ['keys', `${s.keys.toLocaleString('en')} (every store)`],
      ['MQTT clients', clients],
    ];
    $('status-body').replaceChildren(...rows.flatMap(([k, v]) => {
      const dt = document.createElement('dt');
      dt.textContent = k;
      const dd = document.createElement('dd');
      dd.textContent = v;
      dd.dataset.field = k;
      return [dt, dd];
    }));
    $('status-doors').replaceChildren(...s.doors.map((d) => {
      const tr = document.createElement('tr');
      tr.dataset.door = d.name;
      for (const v of [d.name, d.address, d.detail]) {
        const td = document.createElement('td');
        td.textContent = v;
        tr.append(td);
      }
      return tr;
    }));
  }

  dlg.addEventListener('close', () => clearInterval(timer));
  $('status-btn').addEventListener('click', show);
  return { show };
}
