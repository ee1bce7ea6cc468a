// @ts-check
// One line on stderr per event, the Python worker's format, so that one log reader
// takes both workers' output.

export const log = (/** @type {unknown[]} */ ...parts) =>
  console.error(new Date().toISOString(), 'leaseq.worker:', ...parts);
