// @ts-check
// The errors of the client and the worker.

/** A problem the service answered (its status, stable `code` and `detail`). */
export class LeaseqError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} detail
   */
  constructor(status, code, detail) {
    super(`${status} ${code}: ${detail}`);
    this.name = 'LeaseqError';
    this.status = status;
    this.code = code;
    this.detail = detail;
  }
}

/** Thrown into (or raised by) a handler whose lease is gone, or at shutdown. */
export class HandlerCancelled extends Error {
  /** @param {string} reason */
  constructor(reason) {
    super(`handler cancelled: ${reason}`);
    this.name = 'HandlerCancelled';
    this.reason = reason;
  }
}

/** Codes meaning this worker no longer holds the message. */
export const LOST = new Set(['lease_lost', 'queue_not_found', 'invalid_receipt_handle']);
