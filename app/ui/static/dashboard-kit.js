// What the dashboard's pages are made with (app/ui/static/dashboard.js): elements
// built as text nodes only, the flash line, the REST API called with the signed-in
// cookie, the formats of ages and times, a refresh loop and the sparklines.

const flashBox = document.getElementById('flash');

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else if (name === 'text') el.textContent = value;
    else el.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export const present = (...nodes) => nodes.filter((node) => node !== null && node !== undefined);

export function flash(text, isError) {
  flashBox.textContent = text;
  flashBox.className = isError ? 'error' : '';
  flashBox.hidden = false;
}

export async function api(method, path, body) {
  const init = {
    method, credentials: 'same-origin', headers: { 'x-leaseq-dashboard': '1' },
  };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!response.ok) {
    const error = new Error((data && (data.detail || data.title)) || response.statusText);
    error.status = response.status;
    error.code = data && data.code;
    throw error;
  }
  return data;
}

export const q = (name) => encodeURIComponent(name);

export function age(seconds) {
  if (!seconds) return '–';
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${(seconds / 60).toFixed(1)} min`;
  if (seconds < 86400) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : '–';
}

export function every(ms, step) {
  let running = false;
  const run = async () => {
    if (running) return;
    running = true;
    try { await step(); } catch (error) { flash(error.message, true); }
    running = false;
  };
  run();
  return setInterval(run, ms);
}

// The window's newest point at the right edge: a line that grows leftwards
// while the window fills, then scrolls.
export function sparkline(sent, deleted, interval, windowSeconds) {
  const ns = 'http://www.w3.org/2000/svg';
  const width = 120;
  const height = 24;
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('width', width);
  svg.setAttribute('height', height);
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  const top = Math.max(1, ...sent, ...deleted);
  const step = width / Math.max(1, windowSeconds / interval - 1);
  const line = (values, cls) => {
    if (values.length === 0) return;
    const y = (v) => (height - 1 - (v / top) * (height - 2)).toFixed(1);
    const points = values.map((v, i) => `${(width - (values.length - 1 - i) * step).toFixed(1)},${y(v)}`);
    if (values.length === 1) points.unshift(`${(width - 2).toFixed(1)},${y(values[0])}`);
    const poly = document.createElementNS(ns, 'polyline');
    poly.setAttribute('class', cls);
    poly.setAttribute('points', points.join(' '));
    svg.append(poly);
  };
  line(sent, 'sent');
  line(deleted, 'deleted');
  const last = (values) => (values.length ? values[values.length - 1] : 0);
  const title = document.createElementNS(ns, 'title');
  title.textContent = `last ${interval}s: ${last(sent).toFixed(1)} sent/s, ${last(deleted).toFixed(1)} acknowledged/s`;
  svg.append(title);
  svg.dataset.points = String(deleted.length);
  svg.dataset.lastDeleted = String(last(deleted));
  svg.dataset.lastSent = String(last(sent));
  return svg;
}
