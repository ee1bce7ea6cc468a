// A lease on the monotonic clock: its heartbeat period, renewals, the watchdog.
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { test } from 'node:test';

import { HandlerCancelled, Lease } from '../src/index.js';

test('beats every third of the lease unless told otherwise', () => {
  const sent = performance.now();
  assert.equal(new Lease('h', 30, sent).periodMs, 10_000);
  assert.equal(new Lease('h', 30, sent, 5).periodMs, 5_000);
  assert.equal(new Lease('h', 30, sent, 45).periodMs, 10_000); // never longer than the lease
});

test('a renewal counts from when its request was sent, and a late answer is ignored', () => {
  const sent = performance.now() - 1000;
  const lease = new Lease('h', 30, sent);
  lease.renewed(sent + 500, 30);
  assert.equal(lease.deadline, sent + 500 + 30_000);
  lease.renewed(sent + 100, 60); // older than the last renewal: ignored
  assert.equal(lease.deadline, sent + 500 + 30_000);
  lease.renewed(sent + 600, 15); // the service granted less: beat sooner
  assert.equal(lease.nextBeat, sent + 600 + 5_000);
});

test('a lease past its deadline cancels itself: the watchdog aborts the signal', () => {
  const lease = new Lease('h', 1, performance.now() - 2000);
  assert.equal(lease.signal.aborted, false);
  assert.equal(lease.cancelled, true);
  assert.equal(lease.reason, 'lease_expired');
  assert.ok(lease.signal.reason instanceof HandlerCancelled);
});

test('a closed lease is never cancelled, and a reason is kept once', () => {
  const lease = new Lease('h', 30, performance.now());
  assert.equal(lease.cancel('lease_lost'), true);
  assert.equal(lease.cancel('shutdown'), false);
  assert.equal(lease.reason, 'lease_lost');
  const done = new Lease('h', 30, performance.now());
  done.close();
  assert.equal(done.cancel('lease_lost'), false);
  assert.equal(done.signal.aborted, false);
});
