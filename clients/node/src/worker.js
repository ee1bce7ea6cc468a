// @ts-check
// The worker: receives, runs a handler per message with a heartbeat and a
// watchdog, acknowledges or releases. The rules are the Python worker's
// (docs/workers.md), FIFO queues included: each group's messages one at a time,
// in the order received, once the one before is settled; a group whose message
// was not acknowledged has the messages received with it (or before) given back
// unhandled, so that the service redelivers the group in order.
//
// Split as the Python worker is, so that each part can change alone: receiver.js
// claims, acks.js acknowledges, runner.js takes one message from handler to
// outcome (lease.js keeps its claim alive), fifo-order.js holds a group's messages
// to their order. This class counts the slots and owns start and shutdown.

import { setTimeout as sleep } from 'node:timers/promises';

import { Acks } from './acks.js';
import { Client } from './client.js';
import { FifoOrder } from './fifo-order.js';
import { log } from './log.js';
import { Receiver } from './receiver.js';
import { Runner } from './runner.js';

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
    /** In flight, until settled and their handlers returned. @type {Map<Promise<void>, import('./runner.js').Job>} */
    this.jobs = new Map();
    this.stopping = false;
    this.hurry = new AbortController();
    this.order = new FifoOrder(queue, concurrency);
    this.acks = new Acks(this.client, queue);
    this.runner = new Runner(handler, this.client, {
      queue, heartbeatPeriod, retry: this.retry, acks: this.acks, order: this.order,
      slotFreed: () => this.receiver.wake(),
    });
    this.receiver = new Receiver(this.client, this.acks, {
      queue, concurrency, visibilityTimeout: this.visibilityTimeout, wait,
      busy: () => this.busy(),
      start: (message, sentAt, batch) => this.start(message, sentAt, batch),
    });
  }

  /** True once a received message had a `group` (a FIFO queue). */
  get fifo() {
    return this.order.active;
  }

  stop() {
    if (this.stopping) this.hurry.abort();
    this.stopping = true;
    this.receiver.stop();
  }

  async run() {
    const retries = this.retry ? `from ${this.retry.initial}s` : "by the queue's ladder";
    log(`worker on ${this.url} queue '${this.queue}': concurrency ${this.concurrency}, visibility timeout ${this.visibilityTimeout ? this.visibilityTimeout + 's' : 'of the queue'}, retries ${retries}`);
    const refused = await this.receiver.run();
    await this.drain();
    if (refused) throw refused;
  }

  // Slots in use: a standard queue's message until its acknowledgement is queued;
  // on a FIFO queue a group, until its last held message's is.
  busy() {
    let busy = 0;
    for (const job of this.jobs.values()) if (job.group === null && !job.freed) busy += 1;
    return busy + this.order.busy();
  }

  start(message, sentAt, batch = 0) {
    const job = this.runner.job(message, sentAt, batch);
    if (job.group !== null) this.order.hold(job);
    const done = this.runner.process(job).finally(() => {
      this.jobs.delete(done);
      if (job.group !== null) this.order.leave(job);
      this.receiver.wake();
    });
    this.jobs.set(done, job);
  }

  // Handlers get `grace` seconds to finish (a second stop() ends it at once), then
  // are cancelled; those that still have not returned 5 s later have their messages
  // released, so that they come back now rather than when their leases end.
  async drain() {
    if (this.jobs.size === 0) return;
    this.order.giveBackWaiting();
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
    for (const job of this.jobs.values()) await this.runner.releaseUnsettled(job);
  }
}
