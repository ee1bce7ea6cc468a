// Run by tests/client/test_node_worker.py: the Node client's every call against the real
// service (its URL is argv[2]); prints what came back as one JSON object.

import { Client, LeaseqError } from '../../clients/node/src/index.js';
const client = new Client(process.argv[2]);
const out = {};
out.created = (await client.createQueue('node-api', { visibility_timeout: 30 })).name;
out.sent = (await client.send('node-api', 'one', { attributes: { k: 'v' } })).message_id;
out.batch = (await client.sendBatch('node-api', [{ body: 'two' }, { body: 'three' }])).succeeded;
out.visible = (await client.getQueue('node-api')).stats.visible;
out.peeked = (await client.peek('node-api', { state: 'visible', bodyChars: 2 })).messages.map((m) => m.body);
const { messages } = await client.receive('node-api', { max: 3, wait: 0 });
out.received = messages.map((m) => m.body).sort();
const [first, second, third] = messages.map((m) => m.receipt_handle);
out.extended = (await client.extend('node-api', first, 60)).lease_seconds;
out.extendedBatch = (await client.extendBatch('node-api', [{ receipt_handle: second, timeout: 60 }])).succeeded;
out.checkpointed = (await client.checkpoint('node-api', third, { n: 1 }, { timeout: 45 })).lease_seconds;
out.released = typeof (await client.release('node-api', third, 0)).delay_seconds;
out.deleted = (await client.deleteBatch('node-api', [first, second])).succeeded;
try { await client.delete('node-api', first); } catch (err) { out.again = err instanceof LeaseqError && err.code; }
const settled = await client.receiveSettling('node-api', { delete: [first], max: 2, wait: 0 });
out.settled = [settled.deleted.map((r) => r.code), settled.messages.map((m) => m.body), settled.extended];
out.listed = (await client.listQueues({ prefix: 'node' })).queues.map((q) => q.name);
out.purged = (await client.purge('node-api')).purged;
out.sources = (await client.deadLetterSources('node-api')).queues;
await client.deleteQueue('node-api');
try { await client.getQueue('node-api'); } catch (err) { out.gone = err.code; }
console.log(JSON.stringify(out));
