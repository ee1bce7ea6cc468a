// The command's arguments and handler loading.
import assert from 'node:assert/strict';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { loadHandler, main } from '../src/cli.js';

test('a queue and a handler are required; retry options need --retry-delay', async (t) => {
  t.mock.method(console, 'error', () => {});
  assert.equal(await main(['--queue', 'q']), 2);
  assert.equal(await main(['handler.js']), 2);
  assert.equal(await main(['--queue', 'q', '--retry-max', '60', 'handler.js']), 2);
});

test('a handler is the named export, else handle, else the default', async () => {
  const dir = await mkdtemp(path.join(tmpdir(), 'leaseq-node-'));
  const file = path.join(dir, 'handlers.mjs');
  await writeFile(file, 'export const handle = () => "handle"; export const other = () => "other"; export default () => "default";');
  assert.equal((await loadHandler(file))(), 'handle');
  assert.equal((await loadHandler(`${file}:other`))(), 'other');
  const only = path.join(dir, 'only-default.mjs');
  await writeFile(only, 'export default () => "default";');
  assert.equal((await loadHandler(only))(), 'default');
  await assert.rejects(loadHandler(`${file}:missing`), /exports no handler function/);
});
