// @ts-check
// What a handler sees of its message's lease (index.d.ts: HandlerContext). Kept apart
// from the runner because it is public: its getters read the lease at each access, so
// a handler that polls `cancelled` sees the watchdog fire without awaiting anything.

import { performance } from 'node:perf_hooks';

import { HandlerCancelled, LeaseqError, LOST } from './errors.js';

/**
 * @param {import('./client.js').Client} client
 * @param {string} queue
 * @param {any} message
 * @param {import('./lease.js').Lease} lease
 */
export function handlerContext(client, queue, message, lease) {
  return {
    message,
    get fencingToken() {
      return message.fencing_token;
    },
    get signal() {
      return lease.signal;
    },
    get cancelled() {
      return lease.cancelled;
    },
    get cancelReason() {
      return lease.cancelled ? lease.reason : null;
    },
    get leaseRemaining() {
      return lease.remaining() / 1000;
    },
    throwIfCancelled() {
      if (lease.cancelled) throw new HandlerCancelled(lease.reason);
    },
    // Record a cursor (returned as message.checkpoint on redelivery); the service
    // renews the lease with it, by the full lease (never shortening it).
    async checkpoint(cursor) {
      this.throwIfCancelled();
      const sent = performance.now();
      try {
        const granted = await client.checkpoint(queue, lease.handle, cursor, {
          timeout: lease.seconds,
          timeoutMs: 30_000,
          signal: lease.signal,
        });
        lease.renewed(sent, granted.lease_seconds);
        return granted;
      } catch (err) {
        if (err instanceof LeaseqError && LOST.has(err.code)) lease.cancel('lease_lost');
        this.throwIfCancelled();
        throw err;
      }
    },
  };
}
