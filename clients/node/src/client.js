// @ts-check
// The REST API of leaseq over the built-in fetch: every route. Answers are the
// API's JSON (their shapes are in index.d.ts); a problem answer throws a
// LeaseqError with its status and stable `code`.

import { LeaseqError } from './errors.js';

const q = encodeURIComponent;

/**
 * @typedef {{ body?: unknown, timeoutMs?: number, signal?: AbortSignal }} CallOptions
 * @typedef {{ body: string, attributes?: Record<string, string>, delay?: number,
 *             not_before?: string, group?: string, deduplication_id?: string }} OutgoingMessage
 *   On a FIFO queue `group` is required, and `deduplication_id` too unless the queue
 *   has content_based_deduplication; `delay` and `not_before` are refused there.
 *   On a standard queue `group` names the message's tenant (fair queues).
 */

export class Client {
  /**
   * @param {string} [url] the service (default LEASEQ_URL, then http://127.0.0.1:8000)
   * @param {{ apiKey?: string, timeoutMs?: number }} [options] apiKey: `<key id>.<secret>`
   *   when the service requires keys (default LEASEQ_API_KEY)
   */
  constructor(url, { apiKey = process.env.LEASEQ_API_KEY, timeoutMs = 30_000 } = {}) {
    this.url = (url || process.env.LEASEQ_URL || 'http://127.0.0.1:8000').replace(/\/+$/, '');
    /** @type {Record<string, string>} */
    this.auth = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
    this.timeoutMs = timeoutMs;
  }

  /**
   * One request; the answer's JSON (null for 204).
   * @param {string} method
   * @param {string} route
   * @param {CallOptions} [options]
   * @returns {Promise<any>}
   */
  async call(method, route, { body, timeoutMs = this.timeoutMs, signal } = {}) {
    const signals = [AbortSignal.timeout(Math.max(1, Math.ceil(timeoutMs)))];
    if (signal) signals.push(signal);
    const response = await fetch(this.url + route, {
      method,
      headers: body === undefined ? this.auth : { ...this.auth, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.any(signals),
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

  /** @param {string} queue @param {string} handle */
  static message(queue, handle) {
    return `/v1/queues/${q(queue)}/messages/${q(handle)}`;
  }

  // -- queues ------------------------------------------------------------------------

  /**
   * Creates a queue (or finds it, when it exists with the same attributes).
   * @param {string} name
   * @param {Record<string, unknown>} [attributes] visibility_timeout, message_retention,
   *   delay, receive_wait, max_message_bytes, dead_letter_queue, max_receive_count,
   *   retry_backoff; a FIFO queue (its name ends in ".fifo"): fifo: true, and
   *   content_based_deduplication, deduplication_scope ('queue' | 'message_group'),
   *   fifo_throughput_limit ('per_queue' | 'per_message_group_id')
   */
  createQueue(name, attributes = {}) {
    return this.call('POST', '/v1/queues', { body: { name, ...attributes } });
  }

  /** @param {{ prefix?: string, after?: string, limit?: number }} [options] */
  listQueues({ prefix, after, limit } = {}) {
    const params = new URLSearchParams();
    if (prefix !== undefined) params.set('prefix', prefix);
    if (after !== undefined) params.set('after', after);
    if (limit !== undefined) params.set('limit', String(limit));
    return this.call('GET', `/v1/queues?${params}`);
  }

  /** Attributes and live stats. @param {string} name */
  getQueue(name) {
    return this.call('GET', `/v1/queues/${q(name)}`);
  }

  /** @param {string} name @param {Record<string, unknown>} changes */
  updateQueue(name, changes) {
    return this.call('PATCH', `/v1/queues/${q(name)}`, { body: changes });
  }

  /** @param {string} name */
  deleteQueue(name) {
    return this.call('DELETE', `/v1/queues/${q(name)}`);
  }

  /** @param {string} name */
  purge(name) {
    return this.call('POST', `/v1/queues/${q(name)}/purge`);
  }

  // -- messages -----------------------------------------------------------------------

  /**
   * Sends one message; answered once it is committed (with its `sequence_number`
   * on a FIFO queue, where `group` and `deduplication_id` go in the options).
   * @param {string} queue
   * @param {string} body
   * @param {Omit<OutgoingMessage, 'body'>} [options]
   */
  send(queue, body, options = {}) {
    return this.call('POST', `/v1/queues/${q(queue)}/messages`, { body: { body, ...options } });
  }

  /**
   * One result per entry, in order (FIFO: each with its `sequence_number`).
   * @param {string} queue @param {OutgoingMessage[]} messages
   */
  sendBatch(queue, messages) {
    return this.call('POST', `/v1/queues/${q(queue)}/messages`, { body: { messages } });
  }

  /**
   * Claims up to `max` messages, waiting up to `wait` seconds for one.
   * FIFO queues: a receive retried with the same `attemptId` within five minutes
   * answers the same messages while they are in flight (standard queues ignore it).
   * @param {string} queue
   * @param {{ max?: number, visibilityTimeout?: number, wait?: number, attemptId?: string,
   *   signal?: AbortSignal }} [options]
   */
  receive(queue, { max = 1, visibilityTimeout, wait = 20, attemptId, signal } = {}) {
    const params = new URLSearchParams({ max: String(max), wait: String(wait) });
    if (visibilityTimeout !== undefined) params.set('visibility_timeout', String(visibilityTimeout));
    if (attemptId !== undefined) params.set('attempt_id', attemptId);
    return this.call('GET', `/v1/queues/${q(queue)}/receive?${params}`, {
      timeoutMs: (wait + 10) * 1000,
      signal,
    });
  }

  /**
   * Acknowledges `delete` and extends `extend`, then claims as `receive` does: one
   * request. Answers `{ messages, deleted, extended }`, one result per entry.
   * @param {string} queue
   * @param {{ delete?: string[], extend?: { receipt_handle: string, timeout: number }[],
   *   max?: number, visibilityTimeout?: number, wait?: number, attemptId?: string,
   *   signal?: AbortSignal }} [options]
   */
  receiveSettling(queue, { delete: handles = [], extend = [], max = 1, visibilityTimeout, wait = 20, attemptId, signal } = {}) {
    /** @type {Record<string, unknown>} */
    const body = { max, wait, delete: handles, extend };
    if (visibilityTimeout !== undefined) body.visibility_timeout = visibilityTimeout;
    if (attemptId !== undefined) body.attempt_id = attemptId;
    return this.call('POST', `/v1/queues/${q(queue)}/receive`, {
      body,
      timeoutMs: (wait + 10) * 1000,
      signal,
    });
  }

  /**
   * Heartbeat: the lease ends `timeout` seconds from now (0 releases at once).
   * @param {string} queue @param {string} handle @param {number} timeout
   * @param {CallOptions} [options]
   */
  extend(queue, handle, timeout, options = {}) {
    return this.call('PATCH', `${Client.message(queue, handle)}/visibility`, { body: { timeout }, ...options });
  }

  /**
   * @param {string} queue
   * @param {{ receipt_handle: string, timeout: number }[]} entries
   */
  extendBatch(queue, entries) {
    return this.call('POST', `/v1/queues/${q(queue)}/messages/visibility`, { body: { entries } });
  }

  /**
   * A failed attempt: visible again after `delay` seconds; without one the queue's
   * retry ladder decides (at once without a ladder).
   * @param {string} queue @param {string} handle @param {number} [delay]
   */
  release(queue, handle, delay) {
    const body = delay === undefined ? {} : { delay };
    return this.call('POST', `${Client.message(queue, handle)}/release`, { body });
  }

  /** Acknowledge. @param {string} queue @param {string} handle */
  delete(queue, handle) {
    return this.call('DELETE', Client.message(queue, handle));
  }

  /** @param {string} queue @param {string[]} handles */
  deleteBatch(queue, handles) {
    return this.call('POST', `/v1/queues/${q(queue)}/messages/delete`, { body: { receipt_handles: handles } });
  }

  /**
   * Records a cursor and renews the lease by `timeout` seconds (default: the
   * queue's visibility_timeout).
   * @param {string} queue @param {string} handle @param {unknown} cursor
   * @param {CallOptions & { timeout?: number }} [options]
   */
  checkpoint(queue, handle, cursor, { timeout, ...options } = {}) {
    const body = timeout === undefined ? { cursor } : { cursor, timeout };
    return this.call('PUT', `${Client.message(queue, handle)}/checkpoint`, { body, ...options });
  }

  /**
   * Messages without claiming them (operators).
   * @param {string} queue
   * @param {{ state?: 'visible' | 'in_flight' | 'delayed', limit?: number, after?: string,
   *           bodyChars?: number }} [options]
   */
  peek(queue, { state, limit, after, bodyChars } = {}) {
    const params = new URLSearchParams();
    if (state !== undefined) params.set('state', state);
    if (limit !== undefined) params.set('limit', String(limit));
    if (after !== undefined) params.set('after', after);
    if (bodyChars !== undefined) params.set('body_chars', String(bodyChars));
    return this.call('GET', `/v1/queues/${q(queue)}/messages?${params}`);
  }

  // -- dead-letter queues ----------------------------------------------------------------

  /** @param {string} queue */
  deadLetterSources(queue) {
    return this.call('GET', `/v1/queues/${q(queue)}/dead-letter-sources`);
  }

  /**
   * Moves a dead-letter queue's messages back.
   * @param {string} deadLetterQueue
   * @param {{ destination?: string, maxPerSecond?: number }} [options]
   */
  startRedrive(deadLetterQueue, { destination, maxPerSecond } = {}) {
    /** @type {Record<string, unknown>} */
    const body = {};
    if (destination !== undefined) body.destination = destination;
    if (maxPerSecond !== undefined) body.max_per_second = maxPerSecond;
    return this.call('POST', `/v1/queues/${q(deadLetterQueue)}/redrive`, { body });
  }

  /** @param {string} deadLetterQueue */
  listRedrives(deadLetterQueue) {
    return this.call('GET', `/v1/queues/${q(deadLetterQueue)}/redrive`);
  }

  /** @param {string} taskId */
  getRedrive(taskId) {
    return this.call('GET', `/v1/redrive-tasks/${q(taskId)}`);
  }

  /** @param {string} taskId */
  cancelRedrive(taskId) {
    return this.call('DELETE', `/v1/redrive-tasks/${q(taskId)}`);
  }
}
