// @ts-check
// Acknowledgements, by the cheapest route that is safe: riding on the next receive
// (no request of their own), else a batch of their own after ACK_RIDE_MS, else alone.
// A batch whose request failed may or may not have been applied, so its
// acknowledgements are sent again one by one, where each answer is unambiguous.

import { LeaseqError } from './errors.js';
import { log } from './log.js';

// How long a finished message's acknowledgement waits for the next receive to
// carry it before it is sent on its own (a receive waiting in a long poll takes none).
const ACK_RIDE_MS = 50;
// Most acknowledgements one request carries: the service's default batch limit.
const ACK_BATCH = 10;

/**
 * 'acknowledged', 'rejected' (the claim was lost: someone else holds the message), or
 * null with the error: unknown, the message comes again when its lease ends.
 * @typedef {{ outcome: 'acknowledged' | 'rejected' | null, error?: any }} Acknowledged
 */

export class Acks {
  /**
   * @param {import('./client.js').Client} client
   * @param {string} queue
   */
  constructor(client, queue) {
    this.client = client;
    this.queue = queue;
    /** Acknowledgements waiting for the next receive to carry them. @type {{ handle: string, resolve: (r: any) => void, reject: (e: unknown) => void }[]} */
    this.pending = [];
    this.carry = true; // false against a service without POST .../receive
  }

  // The next receive should carry acknowledgements.
  get riding() {
    return this.pending.length > 0 && this.carry;
  }

  /**
   * One request: up to ACK_BATCH queued acknowledgements, then a receive that does
   * not wait (their results would wait with it).
   * @param {{ max: number, visibilityTimeout?: number, signal: AbortSignal }} receive
   */
  async receiveCarrying({ max, visibilityTimeout, signal }) {
    const acks = this.pending.splice(0, ACK_BATCH);
    try {
      const settled = await this.client.receiveSettling(this.queue, {
        delete: acks.map((a) => a.handle), max, visibilityTimeout, wait: 0, signal,
      });
      acks.forEach((a, i) => a.resolve(settled.deleted[i]));
      return settled.messages;
    } catch (err) {
      if (err instanceof LeaseqError && (err.status === 405 || err.status === 422)) {
        // no such route (405), or a batch limit below ACK_BATCH (422)
        log(`the service does not take acknowledgements on a receive (${err.code}); sending them on their own`);
        this.carry = false;
        return [];
      }
      throw err;
    } finally {
      for (const a of acks) a.reject(new Error('the request carrying it failed')); // no-op once resolved
    }
  }

  /** The queued acknowledgements, in batches of their own. */
  async sendBatches() {
    while (this.pending.length > 0) {
      const acks = this.pending.splice(0, ACK_BATCH);
      try {
        const { results } = await this.client.deleteBatch(this.queue, acks.map((a) => a.handle));
        acks.forEach((a, i) => a.resolve(results[i]));
      } catch {
        // unknown whether applied: each is sent alone (see alone)
      } finally {
        for (const a of acks) a.reject(new Error('the request carrying it failed'));
      }
    }
  }

  /**
   * Queued for the next receive to carry, or sent in a batch of its own after
   * ACK_RIDE_MS (at once when `urgent`); sent alone if that request failed.
   * `queued` runs once it is queued: the handler's slot is free from then on.
   * @param {string} handle
   * @param {{ urgent: boolean, queued: () => void }} how
   * @returns {Promise<Acknowledged>}
   */
  async acknowledge(handle, { urgent, queued }) {
    let result;
    try {
      result = await new Promise((resolve, reject) => {
        const entry = { handle, resolve, reject };
        this.pending.push(entry);
        queued();
        if (urgent) {
          this.sendBatches();
        } else {
          // Only if no receive has taken it meanwhile.
          setTimeout(() => { if (this.pending.includes(entry)) this.sendBatches(); }, ACK_RIDE_MS);
        }
      });
    } catch {
      result = null;
    }
    if (result?.ok) return { outcome: 'acknowledged' };
    if (result?.code === 'lease_lost') return { outcome: 'rejected' };
    return this.alone(handle);
  }

  /**
   * @param {string} handle
   * @returns {Promise<Acknowledged>}
   */
  async alone(handle) {
    try {
      await this.client.delete(this.queue, handle);
      return { outcome: 'acknowledged' };
    } catch (err) {
      if (err instanceof LeaseqError && err.code === 'lease_lost') return { outcome: 'rejected' };
      return { outcome: null, error: err };
    }
  }
}
