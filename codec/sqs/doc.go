// Package sqs is sinkbatch's codec for Amazon SQS: it sends the messages the
// batcher gathers for one queue as SendMessageBatch requests, on
// github.com/aws/aws-sdk-go-v2/service/sqs.
//
// # Construction and identity
//
// New takes a Config: the queue URL, either an aws.Config (region,
// credentials, BaseEndpoint, HTTP client, retry settings) or a ready
// *sqs.Client, the FIFO queue's deduplication mode and the codec.Tuning. It
// refuses a config that is incomplete or outside SQS's limits, and a Tuning
// that codec.Tuning.Check refuses, naming the field.
//
// Codecs with equal Identities share a batcher, and it sends every one's
// messages through the codec that started it. So two codecs get equal
// Identities only when the codec can tell that they send alike. Identity is a
// SHA-256 digest over the queue, the codec's options and every field of the
// aws.Config but the logger: data by value; static credentials by their
// values (also inside an aws.CredentialsCache, as config.LoadDefaultConfig
// wraps them), so the secret never leaves the digest; a pointer (an HTTP
// client, a credentials cache) by the object it points to, kept alive by the
// codec. A func cannot be told apart from another closure of the same
// literal, whatever keys it captured, so a func anywhere in the aws.Config (a
// CredentialsProviderFunc, a Retryer, APIOptions, ServiceOptions, an endpoint
// resolver func, an interceptor func) makes the Identity unique to the codec
// value: such codecs share no batcher. To share one, reuse the *Codec, or
// build the codecs on one *sqs.Client (Config.Client), whose Identity is the
// client's.
//
// # Mapping
//
//	Message.Body            MessageBody
//	Message.Attributes      String message attributes
//	Message.Group           MessageGroupId (FIFO queues; fair standard queues)
//	Message.IdempotencyKey  MessageDeduplicationId on FIFO queues, and on every
//	                        queue the message attribute Config.IdempotencyAttribute
//	                        (default "idempotency-key") for consumers
//	Message.Trace           the AWSTraceHeader system attribute (X-Ray format), or
//	                        the traceparent and tracestate attributes: see Tracing
//	Result.ID               MessageId
//	Result.Sequence         SequenceNumber (FIFO queues)
//
// Entry Ids are the messages' positions in the request; results map back by
// Id, not by position in SQS's answer.
//
// # Limits
//
// SQS allows 10 entries per request and 1 MiB (1,048,576 bytes) per message
// and for all the messages of a request together, where a message weighs its
// body plus each attribute's name, data type ("String") and value, the
// idempotency attribute included; and at most 10 attributes per message. The
// SDK checks none of this: Limits and Size state it so the batcher packs
// within it, and Validate refuses what can never fit.
//
// A queue may allow less per message: its MaximumMessageSize (queues created
// before 2025 often still allow 256 KiB). Config.MaxMessageBytes states it,
// or Config.ReadQueueAttributes makes New read it from the queue (one
// GetQueueAttributes call, in New because Validate must not wait on the
// network). Validate then refuses a heavier message at admission with an
// error wrapping codec.ErrTooLarge, so SQS never sees it; requests keep the
// 1 MiB limit.
//
// # Tracing
//
// When the instance traces, the batcher sets each message's Trace to its
// create span's W3C context, and the codec carries it to consumers as
// Config.TracePropagation says. By default (TraceAWSHeader) it goes in the
// AWSTraceHeader message system attribute, converted to X-Ray's format
// (Root=1-<first 8 hex of the trace id>-<other 24>;Parent=<span id>;
// Sampled=<0|1>): the X-Ray SDKs, Lambda and OpenTelemetry's X-Ray propagator
// read it, and it costs none of the 10 message attributes.
// TraceW3CAttributes sends the "traceparent" and, when not empty,
// "tracestate" message attributes instead, as OpenTelemetry's W3C propagator
// reads them; they count toward the 10 attributes (Validate) and the size.
// TraceBoth sends both; TraceOff nothing. Size counts what is carried, the
// AWSTraceHeader too, although SQS does not count a system attribute toward a
// message's size. In the default mode a trace context never costs a message
// its delivery: an invalid traceparent, a tracestate SQS would refuse, or an
// AWSTraceHeader that would take a message past MaxMessageBytes or
// Tuning.MaxBytes, is not carried; a caller's own "traceparent" or
// "tracestate" attribute wins over the codec's; and SQS's checksum of the
// AWSTraceHeader (MD5OfMessageSystemAttributes) is checked when SQS sends it
// but not required. The W3C attributes (TraceW3CAttributes, TraceBoth) are
// carried whenever the traceparent is valid and count as the caller's own
// do: a message they take past 10 attributes or past MaxMessageBytes or
// Tuning.MaxBytes is refused at admission, permanently, so a message sent
// in those modes must leave them room. Neither kumo nor fauxqs stores
// the AWSTraceHeader; both store the W3C attributes.
//
// # Errors
//
// Validate, which the batcher calls at admission, refuses with a permanent
// *codec.EntryError an empty body, a body or attribute value with characters
// SQS rejects (it allows #x9, #xA, #xD, #x20-#xD7FF, #xE000-#xFFFD,
// #x10000-#x10FFFF, as valid UTF-8), invalid attribute names, more than 10
// attributes, a bad MessageGroupId, and on a FIFO queue a message without a
// group or, unless Config.ContentBasedDeduplication, without an idempotency
// key. SendBatch validates again and answers an invalid message without
// sending it, so it cannot sink its batch.
//
// SendBatch answers:
//   - each successful entry with its MessageId and SequenceNumber, after
//     checking MD5OfMessageBody and, when attributes were sent,
//     MD5OfMessageAttributes (the SDK's own check is off, since one mismatch
//     makes it drop the whole answer). A mismatch fails that entry only,
//     retryably (CodeChecksumMismatch). So does a missing checksum
//     (CodeMissingChecksum): an answer that cannot be checked is not
//     trusted. Amazon SQS always sends both; for an emulator that omits the
//     attributes' checksum (kumo), set Config.AttributeChecksumsOptional;
//   - an entry listed both as successful and as failed as failed, retryably
//     (CodeConflictingResult), whatever the failure's code: SQS said both,
//     so it may be stored, and a retry with the same IdempotencyKey is the
//     safe answer (a FIFO queue drops it as a duplicate; on a standard queue
//     consumers deduplicate by the idempotency attribute);
//   - each failed entry with a *codec.EntryError carrying SQS's code and
//     text: permanent only for a code that says the message itself is at
//     fault (InvalidMessageContents, InvalidParameterValue and the like) or
//     one of the permanent codes below; Throttled for a throttling code;
//     retryable for any other code;
//   - an entry missing from SQS's answer with a retryable CodeMissingResult;
//   - a whole request SQS refuses for its content (BatchRequestTooLong,
//     TooManyEntriesInBatchRequest, InvalidParameterValue and the like) with
//     an error wrapping codec.ErrRefused, so the batcher bisects it;
//   - a short list of codes no resend can cure, the answer for every
//     message, with an error wrapping a permanent *codec.EntryError: a
//     missing queue (QueueDoesNotExist), denied access or bad credentials
//     (AccessDenied, InvalidClientTokenId, SignatureDoesNotMatch, ...), and a
//     queue whose KMS key cannot be used (KmsAccessDenied, KmsDisabled,
//     KmsNotFound, ... and their KMS.* forms), known by the code in either
//     spelling SQS reports it (its own, or the query-compatible one of its
//     X-Amzn-Query-Error header) and by the SDK's error type;
//   - throttling, by SQS's or KMS's code (RequestThrottled, Throttling,
//     ThrottlingException, KmsThrottled, KMS.ThrottlingException, ...) or by
//     an HTTP 429 from anything in between, with a retryable error wrapping
//     codec.ErrThrottled and the SDK's error (codec.IsThrottled);
//   - anything else (5xx answers, network faults, a done context, and any
//     code or status the codec does not know) with a retryable error
//     wrapping the SDK's (or the context's) error. Unknown is never
//     permanent: a code SQS adds later, or a proxy's answer, must not park a
//     message for good.
//
// # Retries
//
// One layer retries: the SDK's retryer (by default the standard one: 3
// attempts with jittered backoff, for throttling, 5xx and transport faults),
// configured through the aws.Config or client. The codec never retries, nor
// does the batcher; a caller decides whether to send a failed message again,
// guided by codec.IsPermanent.
//
// Delivery is at least once. When an answer is lost after SQS stored the
// messages (a reset connection, a timeout), the SDK's retry stores them
// again: a FIFO queue drops the repeat by its MessageDeduplicationId (within
// SQS's five-minute window) and answers with the first message ids; on a
// standard queue the consumer deduplicates by the idempotency attribute. The
// codec removes one cause of such repeats: with the SDK as it is, net/http
// may close a connection under an answer it is reading, because the SDK
// closes the request body early (aws-sdk-go-v2 issue 2737); SendBatch hands
// net/http a body that ends cleanly instead.
//
// A Codec is safe for concurrent use.
package sqs
