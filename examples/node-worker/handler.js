// An example handler for the Node worker (clients/node):
//   node clients/node/bin/leaseq-worker.js --queue emails examples/node-worker/handler.js
//
// It gets the received message (the API's JSON: body, attributes, receive_count,
// fencing_token, checkpoint, ...) and a context. Pass `ctx.signal` to everything
// that can wait (fetch, timers): it aborts the moment the lease is lost. Pass
// `ctx.fencingToken` to downstream writes so that they can refuse a stale worker.

import { setTimeout as sleep } from 'node:timers/promises';

export async function handle(message, ctx) {
  const job = JSON.parse(message.body);
  const start = message.checkpoint?.next ?? 0; // resume where a previous attempt stopped
  for (let unit = start; unit < (job.units ?? 3); unit++) {
    await sleep(100, undefined, { signal: ctx.signal }); // one unit of work
    await ctx.checkpoint({ next: unit + 1 }); // progress survives a crash; renews the lease
  }
  console.log(`done with ${message.message_id} (fencing token ${ctx.fencingToken})`);
}
