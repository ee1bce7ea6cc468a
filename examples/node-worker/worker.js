#!/usr/bin/env node
// A leaseq worker for Node.js 20+, with nothing but the built-in fetch.
//
//   node worker.js --url http://127.0.0.1:8000 --queue emails [--concurrency N]
//                  [--lease S] [--heartbeat-period S] [--wait S] [--grace S]
//                  [--retry-delay S [--retry-multiplier X] [--retry-max S]]
//                  handler.js[:exportName]
//
// The handler module exports `handle(message, ctx)` (or a default export, or the
// named export): an async function. `ctx` has `signal` (an AbortSignal that aborts
// when the lease is lost or runs out, or at shutdown), `cancelled`, `cancelReason`,
// `throwIfCancelled()`, `fencingToken`, `leaseRemaining` (seconds) and
// `checkpoint(cursor)`.
//
// The same rules as the Python worker (docs/workers.md):
// - the lease is measured on the monotonic clock (performance.now()) from the
//   moment the receive request is sent, never from the server's lease_expires_at;
// - a heartbeat extends it by the full lease every lease/3, from a timer of its
//   own; no beat is sent once the lease is past;
// - the watchdog aborts ctx.signal on `409 lease_lost` or when the lease runs out
//   because beats kept failing, and the message is then neither acknowledged nor
//   released;
// - success is acknowledged with a conditional DELETE; an exception releases the
//   message for another attempt (POST .../release): after the delay of the queue's
//   retry ladder (its retry_backoff), or after --retry-delay's when that is given;
// - a checkpoint renews the lease by the worker's full lease (its `timeout`), so
//   it never shortens it whatever the queue's visibility_timeout.
//
// JavaScript runs handlers and timers on one thread: a handler that blocks it
// (a long synchronous loop) blocks the heartbeat too. Keep handlers asynchronous
// and move CPU-bound work to worker_threads.

import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

const LOST = new Set(['lease_lost', 'queue_not_found', 'invalid_receipt_handle']);

export class LeaseqError extends Error {
  constructor(status, code, detail) {
    super(`${status} ${code}: ${detail}`);
    this.status = status;
    this.code = code;
    this.detail = detail;
  }
}

export class HandlerCancelled extends Error {
  constructor(reason) {
    super(`handler cancelled: ${reason}`);
    this.name = 'HandlerCancelled';
    this.reason = reason;
  }
}

const log = (...parts) => console.error(new Date().toISOString(), 'leaseq.worker:', ...parts);

// -- the REST API ----------------------------------------------------------------

export class Client {
  // apiKey: `<key id>.<secret>` when the service requires keys (default LEASEQ_API_KEY).
  constructor(url, apiKey = process.env.LEASEQ_API_KEY) {
    this.url = url.replace(/\/+$/, '');
    this.auth = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
  }

  async call(method, route, { body, timeoutMs, signal } = {}) {
    const signals = [];
    if (timeoutMs !== undefined) signals.push(AbortSignal.timeout(Math.max(1, Math.ceil(timeoutMs))));
    if (signal) signals.push(signal);
    const response = await fetch(this.url + route, {
      method,
      headers: body === undefined ? this.auth : { ...this.auth, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: signals.length ? AbortSignal.any(signals) : undefined,
    });
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      throw new LeaseqError(response.status, data?.code ?? `http_${response.status}`, data?.detail ?? text);
    }
    return data;
  }

  static message(queue, handle) {
    return `/v1/queues/${encodeURIComponent(queue)}/messages/${encodeURIComponent(handle)}`;
  }

  receive(queue, { max = 1, visibilityTimeout, wait = 20, signal } = {}) {
    const params = new URLSearchParams({ max: String(max), wait: String(wait) });
    if (visibilityTimeout !== undefined) params.set('visibility_timeout', String(visibilityTimeout));
    return this.call('GET', `/v1/queues/${encodeURIComponent(queue)}/receive?${params}`, {
      timeoutMs: (wait + 10) * 1000,
      signal,
    });
  }

  extend(queue, handle, timeout, options = {}) {
    return this.call('PATCH', `${Client.message(queue, handle)}/visibility`, { body: { timeout }, ...options });
  }

  // A failed attempt: visible again after `delay` seconds; without one the queue's
  // retry ladder decides (at once without a ladder). Answers { delay_seconds, visible_at }.
  release(queue, handle, delay) {
    const body = delay === undefined ? {} : { delay };
    return this.call('POST', `${Client.message(queue, handle)}/release`, { body, timeoutMs: 30_000 });
  }

  delete(queue, handle) {
    return this.call('DELETE', Client.message(queue, handle), { timeoutMs: 30_000 });
  }

  // Renews the lease by `timeout` seconds (default: the queue's visibility_timeout).
  checkpoint(queue, handle, cursor, { timeout, ...options } = {}) {
    const body = timeout === undefined ? { cursor } : { cursor, timeout };
    return this.call('PUT', `${Client.message(queue, handle)}/checkpoint`, { body, ...options });
  }
}

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
  // retryDelay undefined: the queue's retry ladder decides the delay of a release.
  constructor(handler, { url, queue, concurrency = 1, lease, heartbeatPeriod, wait = 20, grace = 30, retryDelay, retryMultiplier = 2, retryMax = 900 }) {
    this.handler = handler;
    this.client = new Client(url);
    this.url = url;
    this.queue = queue;
    this.concurrency = concurrency;
    this.lease = lease;
    this.heartbeatPeriod = heartbeatPeriod;
    this.wait = wait;
    this.grace = grace;
    this.retry = retryDelay === undefined ? null : { initial: retryDelay, multiplier: retryMultiplier, max: retryMax };
    this.jobs = new Map(); // promise -> { message, lease, settled }
    this.stopping = false;
    this.hurry = new AbortController();
    this.stopPolling = new AbortController();
    this.slotFreed = null;
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
    log(`worker on ${this.url} queue '${this.queue}': concurrency ${this.concurrency}, lease ${this.lease ? this.lease + 's' : 'of the queue'}, retries ${retries}`);
    let failures = 0;
    let fatal = null;
    while (!this.stopping) {
      while (this.jobs.size >= this.concurrency && !this.stopping) {
        await new Promise((resolve) => (this.slotFreed = resolve));
      }
      if (this.stopping) break;
      const sentAt = performance.now(); // the lease starts after this, never before
      let messages;
      try {
        ({ messages } = await this.client.receive(this.queue, {
          max: Math.min(this.concurrency - this.jobs.size, 10),
          visibilityTimeout: this.lease,
          wait: this.wait,
          signal: this.stopPolling.signal,
        }));
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
      for (const message of messages) this.start(message, sentAt);
    }
    await this.drain();
    if (fatal) throw fatal;
  }

  start(message, sentAt) {
    const lease = new Lease(message.receipt_handle, message.lease_seconds, sentAt, this.heartbeatPeriod);
    const job = { message, lease, settled: false, name: `message ${message.message_id} (fencing ${message.fencing_token})` };
    const done = this.process(job).finally(() => {
      this.jobs.delete(done);
      this.slotFreed?.();
    });
    this.jobs.set(done, job);
  }

  async process(job) {
    const { message, lease } = job;
    const beat = heartbeat(this.client, this.queue, lease);
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
      log(`${job.name} abandoned: the watchdog cancelled it (${reason})`);
      return;
    }
    if (outcome === 'done') {
      try {
        await this.client.delete(this.queue, message.receipt_handle);
        log(`${job.name} acknowledged`);
      } catch (err) {
        if (err instanceof LeaseqError && err.code === 'lease_lost') log(`${job.name}: acknowledgement rejected (lease lost)`);
        else log(`${job.name}: acknowledgement failed (${err.message}); it will be redelivered`);
      }
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
      const seconds = Number(released.delay_seconds.toFixed(2));
      log(`${job.name} released, visible again in ${seconds}s`);
    } catch (err) {
      log(`${job.name}: release failed (${err.message}); it returns when its lease ends`);
    }
  }

  async drain() {
    if (this.jobs.size === 0) return;
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

// -- the command ------------------------------------------------------------------------

async function loadHandler(spec) {
  const [file, exportName] = spec.split(':');
  const module = await import(pathToFileURL(path.resolve(file)).href);
  const handler = exportName ? module[exportName] : module.handle ?? module.default;
  if (typeof handler !== 'function') throw new Error(`${spec} exports no handler function`);
  return handler;
}

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      url: { type: 'string', default: process.env.LEASEQ_URL || 'http://127.0.0.1:8000' },
      queue: { type: 'string' },
      concurrency: { type: 'string', default: '1' },
      lease: { type: 'string' },
      'heartbeat-period': { type: 'string' },
      wait: { type: 'string', default: '20' },
      grace: { type: 'string', default: '30' },
      'retry-delay': { type: 'string' },
      'retry-multiplier': { type: 'string' },
      'retry-max': { type: 'string' },
      handler: { type: 'string' },
    },
  });
  const spec = values.handler ?? positionals[0];
  if (!values.queue || !spec) {
    console.error('usage: node worker.js --queue QUEUE [--url URL] [--concurrency N] [--lease S] handler.js[:export]');
    return 2;
  }
  if (values['retry-delay'] === undefined && (values['retry-multiplier'] ?? values['retry-max']) !== undefined) {
    console.error('leaseq worker: --retry-multiplier and --retry-max need --retry-delay');
    return 2;
  }
  const handler = await loadHandler(spec);
  const worker = new Worker(handler, {
    url: values.url,
    queue: values.queue,
    concurrency: Number(values.concurrency),
    lease: values.lease === undefined ? undefined : Number(values.lease),
    heartbeatPeriod: values['heartbeat-period'] === undefined ? undefined : Number(values['heartbeat-period']),
    wait: Number(values.wait),
    grace: Number(values.grace),
    retryDelay: values['retry-delay'] === undefined ? undefined : Number(values['retry-delay']),
    retryMultiplier: values['retry-multiplier'] === undefined ? undefined : Number(values['retry-multiplier']),
    retryMax: values['retry-max'] === undefined ? undefined : Number(values['retry-max']),
  });
  for (const signal of ['SIGTERM', 'SIGINT']) {
    process.on(signal, () => {
      log(`${signal}: ${worker.stopping ? 'cancelling in-flight handlers now' : 'no more receives'}`);
      worker.stop();
    });
  }
  try {
    await worker.run();
  } catch (err) {
    console.error(`leaseq worker: ${err.message}`);
    return 1;
  }
  log('worker stopped');
  return 0;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.exitCode = await main();
}
