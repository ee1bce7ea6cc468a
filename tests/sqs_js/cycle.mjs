// The whole SQS cycle with @aws-sdk/client-sqs against leaseq. Run by
// tests/sqs/test_sqs_clients.py: ENDPOINT names the service; the test reads the
// lines this prints ("step <name>", and JSON at the end) and sends the message
// that wakes the long poll once the service shows the receive waiting.
import {
  SQSClient, CreateQueueCommand, GetQueueUrlCommand, SendMessageCommand,
  SendMessageBatchCommand, ReceiveMessageCommand, DeleteMessageCommand,
  DeleteMessageBatchCommand, ChangeMessageVisibilityCommand,
  ChangeMessageVisibilityBatchCommand, GetQueueAttributesCommand,
  SetQueueAttributesCommand, ListQueuesCommand, StartMessageMoveTaskCommand,
  ListMessageMoveTasksCommand, TagQueueCommand, ListQueueTagsCommand,
  PurgeQueueCommand, DeleteQueueCommand,
} from "@aws-sdk/client-sqs";

const sqs = new SQSClient({
  endpoint: process.env.ENDPOINT,
  region: "us-east-1",
  credentials: { accessKeyId: "AKIDNODE", secretAccessKey: "secret" },
  maxAttempts: 1,
});
const out = {};
const step = (name) => console.log(`step ${name}`);
const check = (cond, what) => { if (!cond) throw new Error(`check failed: ${what}`); };
async function code(command) {
  try { await sqs.send(command); } catch (e) { return e.name; }
  throw new Error("expected an error");
}

const dlq = (await sqs.send(new CreateQueueCommand({ QueueName: "js-dead" }))).QueueUrl;
const dlqArn = (await sqs.send(new GetQueueAttributesCommand({
  QueueUrl: dlq, AttributeNames: ["QueueArn"] }))).Attributes.QueueArn;
const url = (await sqs.send(new CreateQueueCommand({
  QueueName: "js-work",
  Attributes: { RedrivePolicy: JSON.stringify({ deadLetterTargetArn: dlqArn, maxReceiveCount: 2 }) },
}))).QueueUrl;
check((await sqs.send(new GetQueueUrlCommand({ QueueName: "js-work" }))).QueueUrl === url, "url");
out.queues = (await sqs.send(new ListQueuesCommand({ QueueNamePrefix: "js-" }))).QueueUrls;

// The SDK checks MD5OfMessageBody (and attributes) on send and receive.
const attrs = { kind: { DataType: "String", StringValue: "js" },
                n: { DataType: "Number", StringValue: "3" },
                raw: { DataType: "Binary", BinaryValue: new Uint8Array([1, 2, 250]) } };
const sent = await sqs.send(new SendMessageCommand({ QueueUrl: url, MessageBody: "héllo", MessageAttributes: attrs }));
out.sentMd5 = sent.MD5OfMessageAttributes;
const batch = await sqs.send(new SendMessageBatchCommand({ QueueUrl: url, Entries: [
  { Id: "a", MessageBody: "one" }, { Id: "b", MessageBody: "two" } ] }));
check(batch.Successful.length === 2, "batch sent");

const got = await sqs.send(new ReceiveMessageCommand({ QueueUrl: url, MaxNumberOfMessages: 10,
  MessageAttributeNames: ["All"], MessageSystemAttributeNames: ["All"] }));
check(got.Messages.length === 3, "received 3");
const hello = got.Messages.find((m) => m.Body === "héllo");
check(hello.MessageAttributes.kind.StringValue === "js", "attribute");
check(Buffer.from(hello.MessageAttributes.raw.BinaryValue).equals(Buffer.from([1, 2, 250])), "binary");
check(hello.Attributes.SenderId === "AKIDNODE", "sender");
check(hello.Attributes.ApproximateReceiveCount === "1", "count");

const rest = got.Messages.filter((m) => m !== hello);
await sqs.send(new ChangeMessageVisibilityCommand({ QueueUrl: url, ReceiptHandle: hello.ReceiptHandle, VisibilityTimeout: 0 }));
const vis = await sqs.send(new ChangeMessageVisibilityBatchCommand({ QueueUrl: url, Entries: rest.map((m, i) => (
  { Id: `v${i}`, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 60 })) }));
check(vis.Successful.length === 2, "visibility batch");
const del = await sqs.send(new DeleteMessageBatchCommand({ QueueUrl: url, Entries: rest.map((m, i) => (
  { Id: `d${i}`, ReceiptHandle: m.ReceiptHandle })) }));
check(del.Successful.length === 2, "delete batch");

// Received twice (once more now, visibility 0), then a third receive dead-letters it.
const second = await sqs.send(new ReceiveMessageCommand({ QueueUrl: url, VisibilityTimeout: 0 }));
check(second.Messages[0].Body === "héllo", "second receive");
out.staleChange = await code(new ChangeMessageVisibilityCommand({ QueueUrl: url, ReceiptHandle: hello.ReceiptHandle, VisibilityTimeout: 5 }));
check(!(await sqs.send(new ReceiveMessageCommand({ QueueUrl: url }))).Messages, "dead-lettered");
const dead = await sqs.send(new ReceiveMessageCommand({ QueueUrl: dlq, VisibilityTimeout: 0 }));
check(dead.Messages[0].Body === "héllo", "in the dead-letter queue");
await sqs.send(new StartMessageMoveTaskCommand({ SourceArn: dlqArn }));
for (;;) {
  const tasks = (await sqs.send(new ListMessageMoveTasksCommand({ SourceArn: dlqArn }))).Results;
  if (tasks[0].Status === "COMPLETED") { out.moved = tasks[0].ApproximateNumberOfMessagesMoved; break; }
  await new Promise((r) => setTimeout(r, 50)); // polling a remote task's state
}
const back = await sqs.send(new ReceiveMessageCommand({ QueueUrl: url }));
check(back.Messages[0].Body === "héllo", "redriven back");
await sqs.send(new DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: back.Messages[0].ReceiptHandle }));

// Long polling: the test sends the message once it sees this receive waiting.
step("long-poll");
const started = Date.now();
const woke = await sqs.send(new ReceiveMessageCommand({ QueueUrl: url, WaitTimeSeconds: 15 }));
out.longPoll = { body: woke.Messages[0].Body, ms: Date.now() - started };
await sqs.send(new DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: woke.Messages[0].ReceiptHandle }));

await sqs.send(new SetQueueAttributesCommand({ QueueUrl: url, Attributes: { VisibilityTimeout: "45" } }));
out.visibility = (await sqs.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ["VisibilityTimeout"] }))).Attributes.VisibilityTimeout;
await sqs.send(new TagQueueCommand({ QueueUrl: url, Tags: { team: "js" } }));
out.tags = (await sqs.send(new ListQueueTagsCommand({ QueueUrl: url }))).Tags;
await sqs.send(new PurgeQueueCommand({ QueueUrl: url }));

out.errors = {
  missingQueue: await code(new GetQueueUrlCommand({ QueueName: "js-nope" })),
  exists: await code(new CreateQueueCommand({ QueueName: "js-work", Attributes: { DelaySeconds: "9" } })),
  fifo: await code(new CreateQueueCommand({ QueueName: "js-not-fifo", Attributes: { FifoQueue: "true" } })),
  badHandle: await code(new DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: "nope" })),
  tooMany: await code(new SendMessageBatchCommand({ QueueUrl: url, Entries: Array.from({ length: 11 }, (_, i) => ({ Id: `e${i}`, MessageBody: "x" })) })),
  notDistinct: await code(new DeleteMessageBatchCommand({ QueueUrl: url, Entries: [{ Id: "x", ReceiptHandle: "a" }, { Id: "x", ReceiptHandle: "b" }] })),
  badAttribute: await code(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ["Nope"] })),
  badValue: await code(new ReceiveMessageCommand({ QueueUrl: url, WaitTimeSeconds: 21 })),
};
await sqs.send(new DeleteQueueCommand({ QueueUrl: url }));
console.log(JSON.stringify(out));
