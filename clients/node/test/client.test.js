// The client's requests and its reading of answers, against a local HTTP server
// that records what it is sent (the real service is exercised by the project's
// Python suite: tests/client/test_node_worker.py).
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer } from 'node:http';
import { after, before, test } from 'node:test';

import { Client, LeaseqError } from '../src/index.js';

const seen = [];
let answer = { status: 200, body: {} };
let server;
let url;

before(async () => {
  server = createServer(async (req, res) => {
    let body = '';
    for await (const chunk of req) body += chunk;
    seen.push({ method: req.method, url: req.url, headers: req.headers, body: body ? JSON.parse(body) : undefined });
    const { status, body: out, type = 'application/json' } = answer;
    res.writeHead(status, out === null ? {} : { 'content-type': type });
    res.end(out === null ? undefined : JSON.stringify(out));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  url = `http://127.0.0.1:${server.address().port}/`;
});

after(() => server.close());

function last() {
  return seen[seen.length - 1];
}

test('a key goes in a bearer header, a body as JSON', async () => {
  answer = { status: 201, body: { name: 'orders' } };
  const client = new Client(url, { apiKey: 'LQABC.secret' });
  assert.equal(client.url, url.slice(0, -1));
  assert.deepEqual(await client.createQueue('orders', { visibility_timeout: 30 }), { name: 'orders' });
  const request = last();
  assert.equal(request.method, 'POST');
  assert.equal(request.url, '/v1/queues');
  assert.equal(request.headers.authorization, 'Bearer LQABC.secret');
  assert.equal(request.headers['content-type'], 'application/json');
  assert.deepEqual(request.body, { name: 'orders', visibility_timeout: 30 });
});

test('without a key no authorization header is sent', async () => {
  answer = { status: 200, body: { queues: [], next_after: null } };
  await new Client(url, { apiKey: '' }).listQueues({ prefix: 'or', limit: 5 });
  assert.equal(last().headers.authorization, undefined);
  assert.equal(last().url, '/v1/queues?prefix=or&limit=5');
});

test('every route goes where the API says', async () => {
  answer = { status: 200, body: {} };
  const client = new Client(url, { apiKey: '' });
  const calls = [
    [() => client.getQueue('a b'), 'GET', '/v1/queues/a%20b'],
    [() => client.updateQueue('q', { delay: 5 }), 'PATCH', '/v1/queues/q', { delay: 5 }],
    [() => client.purge('q'), 'POST', '/v1/queues/q/purge'],
    [() => client.send('q', 'hi', { delay: 3 }), 'POST', '/v1/queues/q/messages', { body: 'hi', delay: 3 }],
    [() => client.sendBatch('q', [{ body: 'a' }]), 'POST', '/v1/queues/q/messages', { messages: [{ body: 'a' }] }],
    [() => client.receive('q', { max: 10, wait: 0, visibilityTimeout: 60 }), 'GET',
      '/v1/queues/q/receive?max=10&wait=0&visibility_timeout=60'],
    [() => client.receive('q.fifo', { wait: 0, attemptId: 'try-1' }), 'GET',
      '/v1/queues/q.fifo/receive?max=1&wait=0&attempt_id=try-1'],
    [() => client.receiveSettling('q.fifo', { delete: ['h'], wait: 0, attemptId: 'try-2' }), 'POST',
      '/v1/queues/q.fifo/receive', { max: 1, wait: 0, delete: ['h'], extend: [], attempt_id: 'try-2' }],
    [() => client.extend('q', 'h/1', 30), 'PATCH', '/v1/queues/q/messages/h%2F1/visibility', { timeout: 30 }],
    [() => client.extendBatch('q', [{ receipt_handle: 'h', timeout: 0 }]), 'POST',
      '/v1/queues/q/messages/visibility', { entries: [{ receipt_handle: 'h', timeout: 0 }] }],
    [() => client.release('q', 'h', 5), 'POST', '/v1/queues/q/messages/h/release', { delay: 5 }],
    [() => client.release('q', 'h'), 'POST', '/v1/queues/q/messages/h/release', {}],
    [() => client.deleteBatch('q', ['a', 'b']), 'POST', '/v1/queues/q/messages/delete', { receipt_handles: ['a', 'b'] }],
    [() => client.checkpoint('q', 'h', { n: 1 }, { timeout: 60 }), 'PUT', '/v1/queues/q/messages/h/checkpoint',
      { cursor: { n: 1 }, timeout: 60 }],
    [() => client.peek('q', { state: 'in_flight', bodyChars: 10 }), 'GET', '/v1/queues/q/messages?state=in_flight&body_chars=10'],
    [() => client.deadLetterSources('dlq'), 'GET', '/v1/queues/dlq/dead-letter-sources'],
    [() => client.startRedrive('dlq', { maxPerSecond: 5 }), 'POST', '/v1/queues/dlq/redrive', { max_per_second: 5 }],
    [() => client.listRedrives('dlq'), 'GET', '/v1/queues/dlq/redrive'],
    [() => client.getRedrive('t-1'), 'GET', '/v1/redrive-tasks/t-1'],
    [() => client.cancelRedrive('t-1'), 'DELETE', '/v1/redrive-tasks/t-1'],
  ];
  for (const [call, method, path, body] of calls) {
    await call();
    assert.equal(last().method, method, path);
    assert.equal(last().url, path);
    assert.deepEqual(last().body, body, path);
  }
});

test('an acknowledgement answered 204 is null', async () => {
  answer = { status: 204, body: null };
  const client = new Client(url, { apiKey: '' });
  assert.equal(await client.delete('q', 'h'), null);
  assert.equal(last().method, 'DELETE');
  assert.equal(await client.deleteQueue('q'), null);
});

test('a problem becomes a LeaseqError with its status and code', async () => {
  answer = { status: 409, body: { code: 'lease_lost', detail: 'The lease is lost.' }, type: 'application/problem+json' };
  const client = new Client(url, { apiKey: '' });
  await assert.rejects(client.delete('q', 'h'), (err) => {
    assert.ok(err instanceof LeaseqError);
    assert.equal(err.status, 409);
    assert.equal(err.code, 'lease_lost');
    assert.equal(err.detail, 'The lease is lost.');
    return true;
  });
  answer = { status: 502, body: 'bad gateway', type: 'text/plain' };
  await assert.rejects(client.getQueue('q'), (err) => err instanceof LeaseqError && err.code === 'http_502');
});

test('FIFO fields go in the bodies and come back as the service answers them', async () => {
  const client = new Client(url, { apiKey: '' });
  answer = { status: 201, body: { message_id: 'm1', sent_at: '2024-01-01T00:00:00Z', sequence_number: '17' } };
  const sent = await client.send('orders.fifo', 'hi', { group: 'A', deduplication_id: 'd-1' });
  assert.equal(sent.sequence_number, '17');
  assert.deepEqual(last().body, { body: 'hi', group: 'A', deduplication_id: 'd-1' });
  answer = { status: 200, body: { results: [{ ok: true, message_id: 'm2', sent_at: '2024-01-01T00:00:00Z', sequence_number: '18' }], succeeded: 1, failed: 0 } };
  const batch = await client.sendBatch('orders.fifo', [{ body: 'a', group: 'A', deduplication_id: 'd-2' }]);
  assert.equal(batch.results[0].ok && batch.results[0].sequence_number, '18');
  assert.deepEqual(last().body, { messages: [{ body: 'a', group: 'A', deduplication_id: 'd-2' }] });
  answer = { status: 201, body: { name: 'orders.fifo' } };
  await client.createQueue('orders.fifo', { fifo: true, content_based_deduplication: true, deduplication_scope: 'message_group' });
  assert.deepEqual(last().body, {
    name: 'orders.fifo', fifo: true, content_based_deduplication: true, deduplication_scope: 'message_group',
  });
  await client.updateQueue('orders.fifo', { fifo_throughput_limit: 'per_message_group_id' });
  assert.deepEqual(last().body, { fifo_throughput_limit: 'per_message_group_id' });
});
