// @ts-check
// One message's life: its handler under a heartbeat and a watchdog, then acknowledged,
// released for a retry, or abandoned when the claim is gone (acknowledging or
// releasing a message someone else now holds would be refused anyway, and the
// handler's side effects are the new holder's to redo). `job.settled` makes that
// decision once, whether the handler's end or the shutdown reaches it first.

import { HandlerCancelled } from './errors.js';
import { handlerContext } from './context.js';
import { Lease, heartbeat } from './lease.js';
import { log } from './log.js';

/**
 * One claimed message, from its receive until it is settled.
 * @typedef {object} Job
 * @property {any} message
 * @property {Lease} lease
 * @property {boolean} settled
 * @property {string} name how the log names it
 * @property {string | null} group its FIFO group; null on a standard queue
 * @property {number} batch the receive it came in, counted from 1
 * @property {boolean} freed its acknowledgement is queued: its slot is free
 * @property {'acknowledged' | 'rejected' | 'released' | 'returned' | 'abandoned' | null} outcome
 * @property {{ promise: Promise<boolean>, resolve: (go: boolean) => void, decided: boolean } | null} turn
 *   FIFO only: whether to run it (true) or give it back (false)
 */

export class Runner {
  /**
   * @param {(message: any, ctx: any) => unknown} handler
   * @param {import('./client.js').Client} client
   * @param {{ queue: string, heartbeatPeriod?: number,
   *   retry: { initial: number, multiplier: number, max: number } | null,
   *   acks: import('./acks.js').Acks, order: import('./fifo-order.js').FifoOrder,
   *   slotFreed: () => void }} options retry null: the queue's retry ladder decides
   */
  constructor(handler, client, { queue, heartbeatPeriod, retry, acks, order, slotFreed }) {
    this.handler = handler;
    this.client = client;
    this.queue = queue;
    this.heartbeatPeriod = heartbeatPeriod;
    this.retry = retry;
    this.acks = acks;
    this.order = order;
    this.slotFreed = slotFreed;
  }

  /**
   * @param {any} message
   * @param {number} sentAt when its receive was sent: its lease starts no earlier
   * @param {number} batch
   * @returns {Job}
   */
  job(message, sentAt, batch) {
    return {
      message, lease: new Lease(message.receipt_handle, message.lease_seconds, sentAt, this.heartbeatPeriod),
      settled: false, name: `message ${message.message_id} (fencing ${message.fencing_token})`,
      group: message.group ?? null, batch, freed: false, outcome: null, turn: null,
    };
  }

  // The worker's own delay for a failed attempt, or undefined: the queue's ladder decides.
  retryDelay(receiveCount) {
    if (this.retry === null) return undefined;
    const { initial, multiplier, max } = this.retry;
    if (initial <= 0) return 0;
    return Math.min(43_200, Math.round(Math.min(max, initial * multiplier ** (receiveCount - 1))));
  }

  /** @param {Job} job */
  async process(job) {
    const { message, lease } = job;
    const beat = heartbeat(this.client, this.queue, lease);
    if (job.turn) {
      // FIFO: held (and heartbeated) until the messages before it in its group are
      // settled; given back unhandled when told so, or when its claim went meanwhile.
      const go = await job.turn.promise;
      if (!go || lease.cancelled) {
        const reason = lease.reason;
        lease.close();
        await beat;
        if (!job.settled) {
          job.settled = true;
          await this.giveBack(job, reason);
        }
        return;
      }
    }
    const ctx = handlerContext(this.client, this.queue, message, lease);
    const running = Promise.resolve().then(() => this.handler(message, ctx));
    let outcome = 'done';
    let error = null;
    try {
      // The watchdog cannot stop a promise, but the worker stops waiting for it:
      // the handler sees ctx.signal aborted and should return soon.
      await Promise.race([
        running,
        new Promise((_, reject) => {
          if (lease.signal.aborted) reject(lease.signal.reason);
          lease.signal.addEventListener('abort', () => reject(lease.signal.reason), { once: true });
        }),
      ]);
    } catch (err) {
      error = err;
      outcome = err instanceof HandlerCancelled || lease.signal.aborted ? 'cancelled' : 'failed';
    }
    const reason = lease.reason;
    lease.close();
    await beat;
    if (!job.settled) {
      job.settled = true;
      await this.settle(job, outcome, error, reason);
    }
    // a handler that ignores its signal keeps its slot until it returns
    await running.catch(() => {});
  }

  async settle(job, outcome, error, reason) {
    const { message } = job;
    if (reason === 'lease_lost' || reason === 'lease_expired') {
      job.outcome = 'abandoned';
      log(`${job.name} abandoned: the watchdog cancelled it (${reason})`);
      return;
    }
    if (outcome === 'done') {
      await this.acknowledge(job);
      return;
    }
    // a cancelled handler's message is released at once; a failed one after the retry delay
    const delay = outcome === 'failed' ? this.retryDelay(message.receive_count) : 0;
    if (outcome === 'failed') log(`${job.name} failed: ${error?.stack ?? error}; releasing it for a retry`);
    await this.release(job, delay);
  }

  /** @param {Job} job */
  async acknowledge(job) {
    const { outcome, error } = await this.acks.acknowledge(job.message.receipt_handle, {
      urgent: this.order.successorWaits(job), // the next of its FIFO group waits for it: no ride
      queued: () => {
        job.freed = true;
        this.slotFreed();
      },
    });
    if (outcome === 'acknowledged') {
      job.outcome = outcome;
      log(`${job.name} acknowledged`);
    } else if (outcome === 'rejected') {
      job.outcome = outcome;
      log(`${job.name}: acknowledgement rejected (lease lost)`);
    } else {
      log(`${job.name}: acknowledgement failed (${error.message}); it will be redelivered`);
    }
  }

  async release(job, delay) {
    try {
      const released = await this.client.release(this.queue, job.message.receipt_handle, delay);
      job.outcome = 'released';
      const seconds = Number(released.delay_seconds.toFixed(2));
      log(`${job.name} released, visible again in ${seconds}s`);
    } catch (err) {
      log(`${job.name}: release failed (${err.message}); it returns when its lease ends`);
    }
  }

  // FIFO: hand back a message that did not run (visible at once: an explicit delay
  // of 0, no failure of its own), for its group to be redelivered in order.
  async giveBack(job, reason) {
    if (reason === 'lease_lost' || reason === 'lease_expired') {
      job.outcome = 'abandoned';
      log(`${job.name} of group '${job.group}' abandoned before it ran (${reason})`);
      return;
    }
    try {
      await this.client.release(this.queue, job.message.receipt_handle, 0);
      job.outcome = 'returned';
      log(`${job.name} of group '${job.group}' given back unhandled`);
    } catch (err) {
      log(`${job.name}: giving it back failed (${err.message}); it returns when its lease ends`);
    }
  }

  /**
   * Shutdown, once the handler had its chance to return: the message goes back at
   * once rather than when its lease ends.
   * @param {Job} job
   */
  async releaseUnsettled(job) {
    if (job.settled) return;
    job.settled = true;
    job.lease.close();
    await this.release(job, 0);
  }
}
