#!/usr/bin/env node
// leaseq-worker --queue QUEUE [--url URL] [--api-key KEY] [--concurrency N] [--lease S]
//               [--heartbeat-period S] [--wait S] [--grace S]
//               [--retry-delay S [--retry-multiplier X] [--retry-max S]] handler.js[:export]
import { main } from '../src/cli.js';

process.exitCode = await main(process.argv.slice(2));
