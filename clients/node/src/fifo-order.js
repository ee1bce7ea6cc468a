// @ts-check
// FIFO queues: each group's messages one at a time, in the order received, once the
// one before is settled. A group whose message was not acknowledged has the messages
// received with it (or before) given back unhandled, so that the service redelivers
// the group in order rather than this worker running a later message first.
// A group takes one concurrency slot, not one per message it holds.

import { log } from './log.js';

/** @typedef {import('./runner.js').Job} Job */

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

export class FifoOrder {
  /**
   * @param {string} queue
   * @param {number} concurrency
   */
  constructor(queue, concurrency) {
    this.queue = queue;
    this.concurrency = concurrency;
    /** The held messages of each group, in the order received. @type {Map<string, Job[]>} */
    this.groups = new Map();
    this.active = false; // true once a message had a group
  }

  /**
   * Holds a message of a group: it runs when `job.turn` says so.
   * @param {Job} job
   */
  hold(job) {
    if (!this.active) {
      this.active = true;
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

  // Slots the groups use: a group until its last held message's acknowledgement is queued.
  busy() {
    let busy = 0;
    for (const jobs of this.groups.values()) if (jobs.some((job) => !job.freed)) busy += 1;
    return busy;
  }

  /**
   * A FIFO message with a later one of its group held here, waiting for it.
   * @param {Job} job
   */
  successorWaits(job) {
    return job.group !== null && (this.groups.get(job.group)?.length ?? 0) > 1;
  }

  /**
   * A FIFO message is settled: the next of its group may run, unless this one was
   * not acknowledged; then the messages of its group held since its receive (or
   * before) are given back, for the group to come again in order.
   * @param {Job} job
   */
  leave(job) {
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

  // Shutdown: messages waiting for their turn have not started, so they are given
  // back now (a group's earlier messages still held keep it blocked meanwhile).
  giveBackWaiting() {
    for (const jobs of this.groups.values()) for (const job of jobs) decide(job.turn, false);
  }
}
