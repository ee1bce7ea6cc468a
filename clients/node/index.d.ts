// Types of leaseq-client (the JavaScript is in src/, checked with // @ts-check).

export interface CallOptions {
  body?: unknown;
  timeoutMs?: number;
  signal?: AbortSignal;
}

export interface OutgoingMessage {
  body: string;
  attributes?: Record<string, string>;
  /** Standard queues only. */
  delay?: number;
  /** Standard queues only. */
  not_before?: string;
  /** FIFO queues (required there): the message group, delivered in send order. */
  group?: string;
  /** FIFO queues: required unless the queue has content_based_deduplication. */
  deduplication_id?: string;
}

export interface RetryBackoff {
  initial: number;
  multiplier: number;
  max: number;
  jitter: number;
}

export interface QueueAttributes {
  visibility_timeout: number;
  message_retention: number;
  delay: number;
  receive_wait: number;
  max_message_bytes: number;
  dead_letter_queue: string | null;
  max_receive_count: number | null;
  retry_backoff: RetryBackoff | null;
  /** Fixed when the queue is created; a FIFO queue's name ends in ".fifo". */
  fifo: boolean;
  content_based_deduplication: boolean;
  deduplication_scope: 'queue' | 'message_group';
  fifo_throughput_limit: 'per_queue' | 'per_message_group_id';
}

export interface Queue {
  name: string;
  attributes: QueueAttributes;
  created_at: string;
  updated_at: string;
}

export interface QueueDetail extends Queue {
  stats: { visible: number; in_flight: number; delayed: number; oldest_age_seconds: number };
}

export interface Sent {
  message_id: string;
  sent_at: string;
  /** FIFO queues only: strictly increasing (a duplicate's is the first message's). */
  sequence_number?: string;
}

export interface ReceivedMessage {
  message_id: string;
  body: string;
  attributes: Record<string, string>;
  receipt_handle: string;
  receive_count: number;
  fencing_token: number;
  lease_seconds: number;
  lease_expires_at: string;
  sent_at: string;
  first_received_at: string;
  checkpoint: unknown;
  /** FIFO queues only (absent on standard queues). */
  group?: string;
  sequence_number?: string;
  deduplication_id?: string;
}

export interface LeaseGranted {
  lease_seconds: number;
  lease_expires_at: string;
}

export interface Released {
  delay_seconds: number;
  visible_at: string;
}

export interface BatchResults<T = Record<string, unknown>> {
  results: (({ ok: true } & T) | { ok: false; status: number; code: string; detail: string })[];
  succeeded: number;
  failed: number;
}

export interface PeekedMessage {
  message_id: string;
  body: string;
  truncated: boolean;
  attributes: Record<string, string>;
  state: 'visible' | 'in_flight' | 'delayed';
  receive_count: number;
  sent_at: string;
  first_received_at: string | null;
  visible_at: string;
  checkpoint: unknown;
  dead_letter_source: string | null;
  /** While in flight: the holder's fencing token. */
  fencing_token: number | null;
  /** While in flight: seconds left of the lease, on the server's database clock. */
  lease_remaining_seconds: number | null;
}

export interface RedriveTask {
  task_id: string;
  source: string;
  destination: string | null;
  status: string;
  moved: number;
  remaining: number;
  to_move_at_start: number;
  max_per_second: number | null;
  failure: string | null;
  created_at: string;
  updated_at: string;
}

export class LeaseqError extends Error {
  constructor(status: number, code: string, detail: string);
  readonly status: number;
  /** The problem's stable code: `lease_lost`, `queue_not_found`, `forbidden`, ... */
  readonly code: string;
  readonly detail: string;
}

export class HandlerCancelled extends Error {
  constructor(reason: string);
  /** `lease_lost`, `lease_expired` or `shutdown`. */
  readonly reason: string;
}

export class Client {
  /** apiKey: `<key id>.<secret>` (default LEASEQ_API_KEY); url default LEASEQ_URL. */
  constructor(url?: string, options?: { apiKey?: string; timeoutMs?: number });
  readonly url: string;
  call(method: string, route: string, options?: CallOptions): Promise<any>;
  createQueue(name: string, attributes?: Partial<QueueAttributes>): Promise<Queue>;
  listQueues(options?: { prefix?: string; after?: string; limit?: number }):
    Promise<{ queues: Queue[]; next_after: string | null }>;
  getQueue(name: string): Promise<QueueDetail>;
  updateQueue(name: string, changes: Partial<QueueAttributes>): Promise<Queue>;
  deleteQueue(name: string): Promise<null>;
  purge(name: string): Promise<{ purged: number }>;
  send(queue: string, body: string, options?: Omit<OutgoingMessage, 'body'>): Promise<Sent>;
  sendBatch(queue: string, messages: OutgoingMessage[]): Promise<BatchResults<Sent>>;
  /** `attemptId`: FIFO queues answer a retry with the same id the same messages. */
  receive(queue: string, options?: { max?: number; visibilityTimeout?: number; wait?: number;
    attemptId?: string; signal?: AbortSignal }): Promise<{ messages: ReceivedMessage[] }>;
  /** Acknowledge and extend, then claim: one request; one result per entry. */
  receiveSettling(queue: string, options?: { delete?: string[];
    extend?: { receipt_handle: string; timeout: number }[]; max?: number;
    visibilityTimeout?: number; wait?: number; attemptId?: string; signal?: AbortSignal }): Promise<{
    messages: ReceivedMessage[];
    deleted: BatchResults['results'];
    extended: BatchResults<LeaseGranted>['results'];
  }>;
  extend(queue: string, handle: string, timeout: number, options?: CallOptions):
    Promise<LeaseGranted>;
  extendBatch(queue: string, entries: { receipt_handle: string; timeout: number }[]):
    Promise<BatchResults<LeaseGranted>>;
  release(queue: string, handle: string, delay?: number): Promise<Released>;
  delete(queue: string, handle: string): Promise<null>;
  deleteBatch(queue: string, handles: string[]): Promise<BatchResults>;
  checkpoint(queue: string, handle: string, cursor: unknown,
    options?: CallOptions & { timeout?: number }): Promise<LeaseGranted>;
  peek(queue: string, options?: { state?: 'visible' | 'in_flight' | 'delayed'; limit?: number;
    after?: string; bodyChars?: number }):
    Promise<{ messages: PeekedMessage[]; next_after: string | null }>;
  deadLetterSources(queue: string): Promise<{ queues: string[] }>;
  startRedrive(deadLetterQueue: string, options?: { destination?: string;
    maxPerSecond?: number }): Promise<RedriveTask>;
  listRedrives(deadLetterQueue: string): Promise<{ tasks: RedriveTask[] }>;
  getRedrive(taskId: string): Promise<RedriveTask>;
  cancelRedrive(taskId: string): Promise<RedriveTask>;
}

export interface HandlerContext {
  readonly message: ReceivedMessage;
  readonly fencingToken: number;
  /** Aborts when the lease is lost or runs out, or at shutdown. */
  readonly signal: AbortSignal;
  readonly cancelled: boolean;
  readonly cancelReason: string | null;
  /** Seconds left on this worker's monotonic clock. */
  readonly leaseRemaining: number;
  throwIfCancelled(): void;
  /** Records a cursor (message.checkpoint on redelivery) and renews the lease. */
  checkpoint(cursor: unknown): Promise<LeaseGranted>;
}

export type Handler = (message: ReceivedMessage, ctx: HandlerContext) => unknown;

export interface WorkerOptions {
  url?: string;
  apiKey?: string;
  queue: string;
  concurrency?: number;
  /** Seconds per lease and per extension (default: the queue's visibility_timeout). */
  visibilityTimeout?: number;
  /** The earlier name of `visibilityTimeout`. */
  lease?: number;
  heartbeatPeriod?: number;
  wait?: number;
  grace?: number;
  /** The worker's own retry delay; undefined: the queue's retry ladder decides. */
  retryDelay?: number;
  retryMultiplier?: number;
  retryMax?: number;
}

export class Lease {
  constructor(handle: string, seconds: number, sentAt: number, periodSeconds?: number);
  readonly handle: string;
  readonly seconds: number;
  readonly signal: AbortSignal;
  readonly cancelled: boolean;
  readonly reason: string | null;
  remaining(): number;
  cancel(reason: string): boolean;
  renewed(sentAt: number, granted: number): void;
  close(): void;
}

export class Worker {
  constructor(handler: Handler, options: WorkerOptions);
  readonly client: Client;
  readonly stopping: boolean;
  /** True once a received message had a `group` (a FIFO queue): each group's
   *  messages are then handled one at a time, in order. */
  readonly fifo: boolean;
  /** Receives until stopped; rejects on an answer that retrying cannot mend (4xx). */
  run(): Promise<void>;
  /** No more receives; a second call cancels in-flight handlers at once. */
  stop(): void;
}
