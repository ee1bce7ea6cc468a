// @ts-check
// `leaseq-worker`: runs a handler module for the messages of a queue.

import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

import { log } from './log.js';
import { Worker } from './worker.js';

/** @param {string} spec `file.js[:export]` */
export async function loadHandler(spec) {
  const [file, exportName] = spec.split(':');
  const module = await import(pathToFileURL(path.resolve(file)).href);
  const handler = exportName ? module[exportName] : module.handle ?? module.default;
  if (typeof handler !== 'function') throw new Error(`${spec} exports no handler function`);
  return handler;
}

/**
 * The command: options as the Python `leaseq worker`'s; the exit code.
 * @param {string[]} args
 * @returns {Promise<number>}
 */
export async function main(args) {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      url: { type: 'string', default: process.env.LEASEQ_URL || 'http://127.0.0.1:8000' },
      'api-key': { type: 'string' },
      queue: { type: 'string' },
      concurrency: { type: 'string', default: '1' },
      'visibility-timeout': { type: 'string' },
      lease: { type: 'string' }, // the earlier name of --visibility-timeout
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
    console.error('usage: leaseq-worker --queue QUEUE [--url URL] [--api-key KEY] [--concurrency N] [--visibility-timeout S] handler.js[:export]');
    return 2;
  }
  if (values['retry-delay'] === undefined && (values['retry-multiplier'] ?? values['retry-max']) !== undefined) {
    console.error('leaseq worker: --retry-multiplier and --retry-max need --retry-delay');
    return 2;
  }
  const handler = await loadHandler(spec);
  const worker = new Worker(handler, {
    url: values.url,
    apiKey: values['api-key'],
    queue: values.queue,
    concurrency: Number(values.concurrency),
    visibilityTimeout: (values['visibility-timeout'] ?? values.lease) === undefined
      ? undefined : Number(values['visibility-timeout'] ?? values.lease),
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

