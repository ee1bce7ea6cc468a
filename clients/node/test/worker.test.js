// The worker on a FIFO queue, against a local HTTP server that plays the service:
// each group's messages run one at a time, in the order received, while groups
// run side by side; after a failure the rest of the group is given back
// unhandled. (The real service: tests/client/test_node_worker_fifo.py.)
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, test } from 'node:test';

import { Worker } from '../src/index.js';

const seen = []; // what the worker asked, in order: [kind, handle, body]
const events = []; // the handler's and the server's, in order
let batches = [];
let server;
let url;

function message(group, n) {
  const id = `${group}${n}`;
  return {
    message_id: id, body: id, attributes: {}, receipt_handle: `h-${id}`, receive_count: 1,
    fencing_token: 1, lease_seconds: 30, lease_expires_at: '2024-01-01T00:00:30Z',
    sent_at: '2024-01-01T00:00:00Z', first_received_at: '2024-01-01T00:00:00Z', checkpoint: null,
    group, sequence_number: String(n), deduplication_id: id,
  };
}

before(async () => {
  server = createServer(async (req, res) => {
    let text = '';
    for await (const chunk of req) text += chunk;
    const body = text ? JSON.parse(text) : undefined;
    const path = req.url.split('?')[0];
    const reply = (status, out) => {
      res.writeHead(status, out === undefined ? {} : { 'content-type': 'application/json' });
      res.end(out === undefined ? undefined : JSON.stringify(out));
    };
    if (path === '/v1/queues/q.fifo/receive') {
      const acked = body?.delete ?? [];
      for (const handle of acked) {
        seen.push(['delete', handle]);
        events.push(`deleted ${handle.slice(2)}`);
      }
      const messages = batches.shift() ?? [];
      if (messages.length === 0 && req.method === 'GET') await sleep(20); // a short long poll
      const out = { messages };
      if (req.method === 'POST') {
        out.deleted = acked.map(() => ({ ok: true }));
        out.extended = [];
      }
      return reply(200, out);
    }
    if (path === '/v1/queues/q.fifo/messages/delete') {
      for (const handle of body.receipt_handles) {
        seen.push(['delete', handle]);
        events.push(`deleted ${handle.slice(2)}`);
      }
      return reply(200, { results: body.receipt_handles.map(() => ({ ok: true })), succeeded: 1, failed: 0 });
    }
    const release = path.match(/^\/v1\/queues\/q\.fifo\/messages\/([^/]+)\/release$/);
    if (release) {
      seen.push(['release', decodeURIComponent(release[1]), body]);
      return reply(200, { delay_seconds: body.delay ?? 0, visible_at: '2024-01-01T00:00:00Z' });
    }
    const single = path.match(/^\/v1\/queues\/q\.fifo\/messages\/([^/]+)$/);
    if (single && req.method === 'DELETE') {
      seen.push(['delete', decodeURIComponent(single[1])]);
      events.push(`deleted ${decodeURIComponent(single[1]).slice(2)}`);
      return reply(204);
    }
    if (path.endsWith('/visibility')) return reply(200, { lease_seconds: 30, lease_expires_at: '2024-01-01T00:00:30Z' });
    return reply(404, { code: 'not_found', detail: path });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  url = `http://127.0.0.1:${server.address().port}`;
});

after(() => server.close());

async function until(predicate, ms = 5000) {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out: ${predicate}`);
    await sleep(5);
  }
}

test('a FIFO group runs in order, one at a time; a failure gives back the rest of its group', async () => {
  // One receive brings four of A and two of B.
  batches = [[message('A', 0), message('A', 1), message('A', 2), message('A', 3), message('B', 0), message('B', 1)]];
  const handler = async (msg) => {
    events.push(`start ${msg.body}`);
    await sleep(30);
    events.push(`end ${msg.body}`);
    if (msg.body === 'A1') throw new Error('A1 fails');
  };
  const worker = new Worker(handler, { url, queue: 'q.fifo', concurrency: 4, wait: 0 });
  const running = worker.run();
  try {
    await until(() => seen.filter(([kind]) => kind === 'release').length === 3
      && seen.filter(([kind]) => kind === 'delete').length === 3);
  } finally {
    worker.stop();
    await running;
  }

  assert.equal(worker.fifo, true);
  const starts = events.filter((e) => e.startsWith('start')).map((e) => e.slice(6));
  assert.deepEqual(starts.filter((b) => b[0] === 'A'), ['A0', 'A1']); // A2, A3 never ran
  assert.deepEqual(starts.filter((b) => b[0] === 'B'), ['B0', 'B1']);
  // one at a time, each once the one before was acknowledged
  for (const [before, next] of [['A0', 'A1'], ['B0', 'B1']]) {
    assert.ok(events.indexOf(`deleted ${before}`) < events.indexOf(`start ${next}`), events.join(', '));
  }
  // the groups ran side by side
  assert.ok(events.indexOf('start B0') < events.indexOf('end A0'), events.join(', '));
  const releases = seen.filter(([kind]) => kind === 'release');
  assert.deepEqual(releases.find(([, h]) => h === 'h-A1')[2], {}); // the failure: the queue's ladder
  assert.deepEqual(releases.filter(([, h]) => h !== 'h-A1').map(([, h, b]) => [h, b]).sort(),
    [['h-A2', { delay: 0 }], ['h-A3', { delay: 0 }]]); // given back at once
  // (an acknowledgement whose request the stop cut off is sent again alone: a set)
  assert.deepEqual([...new Set(seen.filter(([kind]) => kind === 'delete').map(([, h]) => h))].sort(),
    ['h-A0', 'h-B0', 'h-B1']);
});
