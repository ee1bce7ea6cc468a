"""The SQS front door: the AWS JSON 1.0 and Query protocols, mapped onto the queue
engine (app.queue) so that SQS clients work unchanged. No queue rule lives here:
only parsing, validation of SQS's own request shapes, serialisation and errors."""
