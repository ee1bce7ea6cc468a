// @ts-check
// leaseq's client for Node.js 20+: the REST API (Client) and a worker (Worker),
// with nothing but the built-in fetch.

export { Client } from './client.js';
export { HandlerCancelled, LeaseqError } from './errors.js';
export { Lease } from './lease.js';
export { Worker } from './worker.js';
