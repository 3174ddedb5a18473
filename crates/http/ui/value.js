// Showing values and matching keys: JSON pretty-printed without re-parsing numbers, text,
// hex for binary; glob patterns as the service understands them.

/** Characters of a value shown before "show all". */
export const PREVIEW_CHARS = 20000;
/** Bytes of a binary value shown as hex before "show all". */
export const PREVIEW_BYTES = 4096;

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Describes stored bytes: `{kind: 'json'|'text'|'binary', text, size}`; `text` is what the
 * editor starts from (pretty JSON, the text itself, or null for binary).
 */
export function describe(bytes, isJson) {
  let text = null;
  try {
    text = strictUtf8.decode(bytes);
  } catch (_) {
    return { kind: 'binary', text: null, size: bytes.length };
  }
  if (isJson) {
    const pretty = prettyJson(text);
    if (pretty !== null) return { kind: 'json', text: pretty, size: bytes.length };
  }
  return { kind: 'text', text, size: bytes.length };
}

/**
 * Re-indents JSON text token by token, so numbers, escapes and key order stay exactly as
 * stored (JSON.parse would round big integers). Returns null if the text is not JSON.
 */
export function prettyJson(text) {
  try {
    JSON.parse(text);
  } catch (_) {
    return null;
  }
  let out = '';
  let depth = 0;
  let i = 0;
  const pad = () => '\n' + '  '.repeat(depth);
  while (i < text.length) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (j < text.length && text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j + 1;
      continue;
    }
    if (c === ' ' || c === '\n' || c === '\r' || c === '\t') {
      i++;
      continue;
    }
    if (c === '{' || c === '[') {
      // An empty object or array stays on one line.
      let j = i + 1;
      while (j < text.length && ' \n\r\t'.includes(text[j])) j++;
      if (text[j] === (c === '{' ? '}' : ']')) {
        out += c + text[j];
        i = j + 1;
        continue;
      }
      depth++;
      out += c + pad();
    } else if (c === '}' || c === ']') {
      depth--;
      out += pad() + c;
    } else if (c === ',') {
      out += ',' + pad();
    } else if (c === ':') {
      out += ': ';
    } else {
      out += c;
    }
    i++;
  }
  return out;
}

/** A hex dump: offset, 16 bytes in hex, the printable ASCII. */
export function hexDump(bytes, limit) {
  const n = Math.min(bytes.length, limit);
  const lines = [];
  for (let off = 0; off < n; off += 16) {
    const row = bytes.subarray(off, Math.min(off + 16, n));
    let hex = '';
    let ascii = '';
    for (let k = 0; k < 16; k++) {
      if (k < row.length) {
        hex += row[k].toString(16).padStart(2, '0') + (k === 7 ? '  ' : ' ');
        ascii += row[k] >= 0x20 && row[k] < 0x7f ? String.fromCharCode(row[k]) : '.';
      } else {
        hex += k === 7 ? '    ' : '   ';
      }
    }
    lines.push(off.toString(16).padStart(8, '0') + '  ' + hex + ' ' + ascii);
  }
  return lines.join('\n');
}

/**
 * What the value pane shows: `{text, truncated, total}` with at most the preview size unless
 * `all` is set.
 */
export function render(desc, bytes, all) {
  if (desc.kind === 'binary') {
    const limit = all ? bytes.length : PREVIEW_BYTES;
    return { text: hexDump(bytes, limit), truncated: bytes.length > limit, total: bytes.length + ' bytes' };
  }
  const limit = all ? desc.text.length : PREVIEW_CHARS;
  return {
    text: desc.text.length > limit ? desc.text.slice(0, limit) + '\n…' : desc.text,
    truncated: desc.text.length > limit,
    total: desc.text.length.toLocaleString('en') + ' characters',
  };
}

/** A one-line preview of a value carried in a change event. */
export function previewOf(data, base64) {
  if (data === undefined) return '';
  if (base64) return '(binary, ' + Math.floor((String(data).length * 3) / 4) + ' bytes)';
  const s = JSON.stringify(data);
  return s.length > 120 ? s.slice(0, 119) + '…' : s;
}

/** Whether the text has glob syntax; plain text filters by "contains". */
export function isGlob(text) {
  return /[*?[]/.test(text);
}

/** The server-side pattern for what the user typed in a filter ('' = every key). */
export function patternOf(text) {
  const t = text.trim();
  if (!t) return '';
  if (isGlob(t)) return t;
  return '*' + t.replace(/[\]\\]/g, (c) => '[' + c + ']') + '*';
}

/** A glob (`*`, `?`, `[a-z]`, `[!x]`) as a RegExp over the whole key. */
export function globRegExp(glob) {
  let re = '^';
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i];
    if (c === '*') re += '[\\s\\S]*';
    else if (c === '?') re += '[\\s\\S]';
    else if (c === '[') {
      const negate = glob[i + 1] === '!';
      const start = i + (negate ? 2 : 1);
      // A `]` right after `[` or `[!` is part of the set.
      const end = glob.indexOf(']', start + 1);
      if (end < 0) {
        re += '\\[';
        continue;
      }
      const body = glob.slice(start, end);
      re += '[' + (negate ? '^' : '') + body.replace(/[\\^\]]/g, '\\$&') + ']';
      i = end;
    } else re += c.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  }
  return new RegExp(re + '$');
}

/** A predicate over keys for what the user typed (client-side filtering of live changes). */
export function keyMatcher(text) {
  const t = text.trim();
  if (!t) return () => true;
  if (!isGlob(t)) return (key) => key.includes(t);
  let re;
  try {
    re = globRegExp(t);
  } catch (_) {
    return (key) => key.includes(t);
  }
  return (key) => re.test(key);
}

/** "3 d 4 h", "5 min 2 s", "12 s". */
export function duration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const r = s % 60;
  if (d) return `${d} d ${h} h`;
  if (h) return `${h} h ${m} min`;
  if (m) return `${m} min ${r} s`;
  return `${r} s`;
}

/** "512 B", "4.2 KB", "1.1 MB". */
export function bytesText(n) {
  if (n < 1024) return n + ' B';
  if (n < 1024 * 1024) return (n / 1024).toFixed(1) + ' KB';
  return (n / 1024 / 1024).toFixed(1) + ' MB';
}
