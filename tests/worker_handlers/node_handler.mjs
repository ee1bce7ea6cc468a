// The handler the Node worker runs in tests/client/test_node_worker.py. The message body
// (JSON) says what to do: {"steps": n, "step": seconds, "checkpoint": bool}. Every
// event is appended as a JSON line to the file LEASEQ_TEST_EVENTS names.

import { appendFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

function record(kind, message, detail = null) {
  const event = {
    kind,
    pid: process.pid,
    message_id: message.message_id,
    fencing: message.fencing_token,
    receive_count: message.receive_count,
    handle: message.receipt_handle,
    detail,
  };
  appendFileSync(process.env.LEASEQ_TEST_EVENTS, JSON.stringify(event) + '\n');
}

export async function handle(message, ctx) {
  const plan = JSON.parse(message.body);
  const start = message.checkpoint?.next ?? 0;
  record('started', message, { start, remaining: ctx.leaseRemaining });
  try {
    for (let unit = start; unit < plan.steps; unit++) {
      await sleep(plan.step * 1000, undefined, { signal: ctx.signal });
      if (plan.checkpoint) await ctx.checkpoint({ next: unit + 1 });
    }
  } catch (err) {
    if (ctx.signal.aborted) record('aborted', message, ctx.cancelReason);
    throw err;
  }
  if (plan.fail && message.receive_count === 1) throw new Error('first attempt fails');
  record('finished', message, { fencing: ctx.fencingToken });
}
