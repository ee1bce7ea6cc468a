// @ts-check
// The worker: receives, runs a handler per message with a heartbeat and a
// watchdog, acknowledges or releases. The rules are the Python worker's
// (docs/workers.md), FIFO queues included: each group's messages one at a time,
// in the order received, once the one before is settled; a group whose message
// was not acknowledged has the messages received with it (or before) given back
// unhandled, so that the service redelivers the group in order.

import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';

import { Client } from './client.js';
import { HandlerCancelled, LeaseqError, LOST } from './errors.js';

const log = (/** @type {unknown[]} */ ...parts) =>
  console.error(new Date().toISOString(), 'leaseq.worker:', ...parts);

// How long a finished message's acknowledgement waits for the next receive to
// carry it before it is sent on its own (a receive waiting in a long poll takes none).
const ACK_RIDE_MS = 50;
// Most acknowledgements one request carries: the service's default batch limit.
const ACK_BATCH = 10;

// -- one claim's lease, on the monotonic clock --------------------------------------

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

async function heartbeat(client, queue, lease) {
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

// A FIFO message's turn: decided once, true (run it) or false (give it back).
function decide(turn, value) {
  if (turn && !turn.decided) {
    turn.decided = true;
    turn.resolve(value);
  }
}

// The first held message of a FIFO group may run.
function advance(jobs) {
  decide(jobs[0].turn, true);
}

function makeContext(client, queue, message, lease) {
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

// -- the worker ----------------------------------------------------------------------

export class Worker {
  /**
   * @param {(message: any, ctx: any) => unknown} handler
   * @param {import('../index.js').WorkerOptions} options retryDelay undefined: the
   *   queue's retry ladder decides the delay of a release
   */
  constructor(handler, { url, apiKey, queue, concurrency = 1, visibilityTimeout, lease, heartbeatPeriod, wait = 20, grace = 30, retryDelay, retryMultiplier = 2, retryMax = 900 }) {
    this.handler = handler;
    this.client = new Client(url, { apiKey });
    this.url = this.client.url;
    this.queue = queue;
    this.concurrency = concurrency;
    // `lease`: the option's earlier name, still accepted.
    this.visibilityTimeout = visibilityTimeout ?? lease;
    this.heartbeatPeriod = heartbeatPeriod;
    this.wait = wait;
    this.grace = grace;
    this.retry = retryDelay === undefined ? null : { initial: retryDelay, multiplier: retryMultiplier, max: retryMax };
    this.jobs = new Map(); // promise -> { message, lease, settled, group, batch, freed, outcome, turn }
    /** FIFO: the held messages of each group, in the order received. @type {Map<string, any[]>} */
    this.groups = new Map();
    this.batches = 0; // receives that brought messages
    this.fifo = false; // true once a message had a group
    this.stopping = false;
    this.hurry = new AbortController();
    this.stopPolling = new AbortController();
    this.slotFreed = null;
    /** Acknowledgements waiting for the next receive to carry them. @type {{ handle: string, resolve: (r: any) => void, reject: (e: unknown) => void }[]} */
    this.acks = [];
    this.carryAcks = true; // false against a service without POST .../receive
  }

  stop() {
    if (this.stopping) this.hurry.abort();
    this.stopping = true;
    this.stopPolling.abort();
  }

  // The worker's own delay for a failed attempt, or undefined: the queue's ladder decides.
  retryDelay(receiveCount) {
    if (this.retry === null) return undefined;
    const { initial, multiplier, max } = this.retry;
    if (initial <= 0) return 0;
    return Math.min(43_200, Math.round(Math.min(max, initial * multiplier ** (receiveCount - 1))));
  }

  async run() {
    const retries = this.retry ? `from ${this.retry.initial}s` : "by the queue's ladder";
    log(`worker on ${this.url} queue '${this.queue}': concurrency ${this.concurrency}, visibility timeout ${this.visibilityTimeout ? this.visibilityTimeout + 's' : 'of the queue'}, retries ${retries}`);
    let failures = 0;
    let fatal = null;
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
        if (this.acks.length > 0 && this.carryAcks) {
          messages = await this.receiveCarryingAcks(max);
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
          fatal = err;
          break;
        }
        failures += 1;
        const delay = Math.min(30, 0.25 * 2 ** Math.min(failures, 8));
        log(`receive failed (${err.message}); retrying in ${delay}s`);
        await sleep(delay * 1000);
        continue;
      }
      failures = 0;
      if (messages.length > 0) this.batches += 1;
      for (const message of messages) this.start(message, sentAt, this.batches);
    }
    await this.drain();
    if (fatal) throw fatal;
  }

  // Slots in use: a standard queue's message until its acknowledgement is queued;
  // on a FIFO queue a group, until its last held message's is.
  busy() {
    let busy = 0;
    for (const job of this.jobs.values()) if (job.group === null && !job.freed) busy += 1;
    for (const jobs of this.groups.values()) if (jobs.some((job) => !job.freed)) busy += 1;
    return busy;
  }

  // A FIFO message with a later one of its group held here, waiting for it.
  successorWaits(job) {
    return job.group !== null && (this.groups.get(job.group)?.length ?? 0) > 1;
  }

  // A FIFO message is settled: the next of its group may run, unless this one was
  // not acknowledged; then the messages of its group held since its receive (or
  // before) are given back, for the group to come again in order.
  leaveGroup(job) {
    const jobs = this.groups.get(job.group);
    const index = jobs ? jobs.indexOf(job) : -1;
    if (index < 0) return;
    if (job.outcome !== 'acknowledged') {
      for (const other of jobs) if (other !== job && other.batch <= job.batch) decide(other.turn, false);
    }
    jobs.splice(index, 1);
    if (jobs.length > 0) advance(jobs);
    else this.groups.delete(job.group);
  }

  /**
   * One request: up to ACK_BATCH queued acknowledgements, then a receive that does
   * not wait (their results would wait with it).
   * @param {number} max
   */
  async receiveCarryingAcks(max) {
    const acks = this.acks.splice(0, ACK_BATCH);
    try {
      const settled = await this.client.receiveSettling(this.queue, {
        delete: acks.map((a) => a.handle), max, visibilityTimeout: this.visibilityTimeout,
        wait: 0, signal: this.stopPolling.signal,
      });
      acks.forEach((a, i) => a.resolve(settled.deleted[i]));
      return settled.messages;
    } catch (err) {
      if (err instanceof LeaseqError && (err.status === 405 || err.status === 422)) {
        // no such route (405), or a batch limit below ACK_BATCH (422)
        log(`the service does not take acknowledgements on a receive (${err.code}); sending them on their own`);
        this.carryAcks = false;
        return [];
      }
      throw err;
    } finally {
      for (const a of acks) a.reject(new Error('the request carrying it failed')); // no-op once resolved
    }
  }

  /** The queued acknowledgements, in batches of their own. */
  async sendAcks() {
    while (this.acks.length > 0) {
      const acks = this.acks.splice(0, ACK_BATCH);
      try {
        const { results } = await this.client.deleteBatch(this.queue, acks.map((a) => a.handle));
        acks.forEach((a, i) => a.resolve(results[i]));
      } catch {
        // unknown whether applied: each is sent alone (acknowledgeAlone)
      } finally {
        for (const a of acks) a.reject(new Error('the request carrying it failed'));
      }
    }
  }

  /**
   * Queued for the next receive to carry, or sent in a batch of its own after
   * ACK_RIDE_MS; sent alone if that request failed.
   */
  async acknowledge(job) {
    let result;
    try {
      result = await new Promise((resolve, reject) => {
        const entry = { handle: job.message.receipt_handle, resolve, reject };
        this.acks.push(entry);
        job.freed = true;
        this.slotFreed?.();
        if (this.successorWaits(job)) {
          this.sendAcks(); // the next of its FIFO group waits for it: no ride
        } else {
          // Only if no receive has taken it meanwhile.
          setTimeout(() => { if (this.acks.includes(entry)) this.sendAcks(); }, ACK_RIDE_MS);
        }
      });
    } catch {
      result = null;
    }
    if (result?.ok) {
      job.outcome = 'acknowledged';
      log(`${job.name} acknowledged`);
    } else if (result?.code === 'lease_lost') {
      job.outcome = 'rejected';
      log(`${job.name}: acknowledgement rejected (lease lost)`);
    } else {
      await this.acknowledgeAlone(job);
    }
  }

  async acknowledgeAlone(job) {
    try {
      await this.client.delete(this.queue, job.message.receipt_handle);
      job.outcome = 'acknowledged';
      log(`${job.name} acknowledged`);
    } catch (err) {
      if (err instanceof LeaseqError && err.code === 'lease_lost') {
        job.outcome = 'rejected';
        log(`${job.name}: acknowledgement rejected (lease lost)`);
      } else {
        log(`${job.name}: acknowledgement failed (${err.message}); it will be redelivered`);
      }
    }
  }

  start(message, sentAt, batch = 0) {
    const lease = new Lease(message.receipt_handle, message.lease_seconds, sentAt, this.heartbeatPeriod);
    const job = {
      message, lease, settled: false, name: `message ${message.message_id} (fencing ${message.fencing_token})`,
      group: message.group ?? null, batch, freed: false, outcome: null, turn: null,
    };
    if (job.group !== null) {
      if (!this.fifo) {
        this.fifo = true;
        log(`queue '${this.queue}' is a FIFO queue: each group's messages are handled one at a time, in order; up to ${this.concurrency} groups at once`);
      }
      let resolve;
      const promise = new Promise((r) => (resolve = r));
      job.turn = { promise, resolve, decided: false };
      const jobs = this.groups.get(job.group) ?? [];
      this.groups.set(job.group, jobs);
      jobs.push(job);
      advance(jobs);
    }
    const done = this.process(job).finally(() => {
      this.jobs.delete(done);
      if (job.group !== null) this.leaveGroup(job);
      this.slotFreed?.();
    });
    this.jobs.set(done, job);
  }

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
    const ctx = makeContext(this.client, this.queue, message, lease);
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

  async drain() {
    if (this.jobs.size === 0) return;
    // FIFO messages waiting for their turn have not started: give them back now
    // (a group's earlier messages still held keep it blocked meanwhile).
    for (const jobs of this.groups.values()) for (const job of jobs) decide(job.turn, false);
    const all = () => Promise.allSettled([...this.jobs.keys()]);
    const hurried = new Promise((resolve) => {
      if (this.hurry.signal.aborted) resolve();
      this.hurry.signal.addEventListener('abort', resolve, { once: true });
    });
    const graceOver = sleep(this.grace * 1000, undefined, { ref: false });
    await Promise.race([all(), hurried, graceOver]);
    if (this.jobs.size === 0) return;
    log(`cancelling ${this.jobs.size} in-flight handlers`);
    for (const job of this.jobs.values()) job.lease.cancel('shutdown');
    await Promise.race([all(), sleep(5000, undefined, { ref: false })]);
    for (const job of this.jobs.values()) {
      if (!job.settled) {
        job.settled = true;
        job.lease.close();
        await this.release(job, 0);
      }
    }
  }
}

