// @ts-check
// One claim's lease and the heartbeat that keeps it: measured on the monotonic clock
// from when the receive was sent (never from the server's lease_expires_at), so a
// wall-clock jump or a skewed server cannot make the worker believe it holds a claim
// it has lost.

import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';

import { HandlerCancelled, LeaseqError, LOST } from './errors.js';
import { log } from './log.js';

export class Lease {
  constructor(handle, seconds, sentAt, periodSeconds) {
    this.handle = handle;
    this.seconds = seconds;
    this.periodMs = (periodSeconds && periodSeconds < seconds ? periodSeconds : seconds / 3) * 1000;
    this.renewedFrom = sentAt;
    this.deadline = sentAt + seconds * 1000;
    this.nextBeat = sentAt + this.periodMs;
    this.watchdog = new AbortController(); // aborted: the handler must stop
    this.stopBeats = new AbortController(); // aborted: the handler is done
    this.reason = null;
    this.closed = false;
  }

  get signal() {
    return this.watchdog.signal;
  }

  remaining() {
    return this.deadline - performance.now();
  }

  get cancelled() {
    if (!this.watchdog.signal.aborted && this.remaining() <= 0) this.cancel('lease_expired');
    return this.watchdog.signal.aborted;
  }

  cancel(reason) {
    if (this.closed || this.watchdog.signal.aborted) return false;
    this.reason = reason;
    this.watchdog.abort(new HandlerCancelled(reason));
    return true;
  }

  renewed(sentAt, granted) {
    if (sentAt < this.renewedFrom) return; // an older answer arriving late
    this.renewedFrom = sentAt;
    this.deadline = sentAt + granted * 1000;
    this.nextBeat = sentAt + this.periodMs * Math.min(1, granted / this.seconds);
  }

  close() {
    this.closed = true;
    this.stopBeats.abort();
  }
}

/**
 * Extends the lease by its full length every period until the handler is done or
 * the watchdog fired; a lost claim fires the watchdog.
 * @param {import('./client.js').Client} client
 * @param {string} queue
 * @param {Lease} lease
 */
export async function heartbeat(client, queue, lease) {
  while (!lease.closed && !lease.cancelled) {
    const now = performance.now();
    const due = Math.min(lease.nextBeat, lease.deadline);
    if (now < due) {
      try {
        await sleep(due - now, undefined, { signal: lease.stopBeats.signal });
      } catch {
        return; // the handler is done
      }
      continue;
    }
    const sent = performance.now();
    try {
      // never past the deadline: a beat still in flight then is abandoned
      const granted = await client.extend(queue, lease.handle, lease.seconds, {
        timeoutMs: Math.max(1, lease.deadline - sent),
        signal: lease.stopBeats.signal,
      });
      lease.renewed(sent, granted.lease_seconds);
    } catch (err) {
      if (lease.closed) return;
      if (err instanceof LeaseqError && LOST.has(err.code)) {
        log(`heartbeat for ...${lease.handle.slice(-12)}: ${err.message}`);
        lease.cancel('lease_lost');
        return;
      }
      log(`heartbeat for ...${lease.handle.slice(-12)} failed: ${err.message}`);
      lease.nextBeat = Math.max(lease.nextBeat, sent + Math.max(lease.periodMs / 2, 50));
    }
  }
}
