// @ts-check
// The receive loop: claims as many messages as there are free slots, carrying the
// queued acknowledgements when it can, and backs off while the service fails. A
// refusal (4xx) ends it: retrying cannot mend a wrong key or a missing queue.

import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';

import { LeaseqError } from './errors.js';
import { log } from './log.js';

export class Receiver {
  /**
   * @param {import('./client.js').Client} client
   * @param {import('./acks.js').Acks} acks
   * @param {{ queue: string, concurrency: number, visibilityTimeout?: number, wait: number,
   *   busy: () => number, start: (message: any, sentAt: number, batch: number) => void }} options
   *   busy: the slots in use; start: runs a received message
   */
  constructor(client, acks, { queue, concurrency, visibilityTimeout, wait, busy, start }) {
    this.client = client;
    this.acks = acks;
    this.queue = queue;
    this.concurrency = concurrency;
    this.visibilityTimeout = visibilityTimeout;
    this.wait = wait;
    this.busy = busy;
    this.start = start;
    this.batches = 0; // receives that brought messages
    this.stopping = false;
    this.stopPolling = new AbortController();
    this.slotFreed = null;
  }

  // Also ends a wait for a free slot, or a backoff, so that shutdown (the grace
  // period, then cancelling) starts while every slot is still busy.
  stop() {
    this.stopping = true;
    this.stopPolling.abort();
    this.wake();
  }

  // A slot may be free: a waiting loop looks again.
  wake() {
    this.slotFreed?.();
  }

  /**
   * Receives until stopped.
   * @returns {Promise<LeaseqError | null>} the refusal that ended it, if one did
   */
  async run() {
    let failures = 0;
    while (!this.stopping) {
      // a handler that finished frees its slot once its acknowledgement is queued
      while (this.busy() >= this.concurrency && !this.stopping) {
        await new Promise((resolve) => (this.slotFreed = resolve));
      }
      if (this.stopping) break;
      const sentAt = performance.now(); // the lease starts after this, never before
      const max = Math.min(this.concurrency - this.busy(), 10);
      let messages;
      try {
        if (this.acks.riding) {
          messages = await this.acks.receiveCarrying({
            max, visibilityTimeout: this.visibilityTimeout, signal: this.stopPolling.signal,
          });
        } else {
          ({ messages } = await this.client.receive(this.queue, {
            max,
            visibilityTimeout: this.visibilityTimeout,
            wait: this.wait,
            signal: this.stopPolling.signal,
          }));
        }
      } catch (err) {
        if (this.stopping) break;
        if (err instanceof LeaseqError && err.status < 500) {
          log(`receive from '${this.queue}' refused: ${err.message}`);
          return err;
        }
        failures += 1;
        const delay = Math.min(30, 0.25 * 2 ** Math.min(failures, 8));
        log(`receive failed (${err.message}); retrying in ${delay}s`);
        await sleep(delay * 1000, undefined, { signal: this.stopPolling.signal }).catch(() => {});
        continue;
      }
      failures = 0;
      if (messages.length > 0) this.batches += 1;
      for (const message of messages) this.start(message, sentAt, this.batches);
    }
    return null;
  }
}
