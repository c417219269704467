// Package pubsub is the codec.Codec for Google Cloud Pub/Sub. It publishes
// each batch the batcher forms with one low-level Publish call
// (apiv1.TopicAdminClient.Publish), not through the client library's own
// batching publisher: sinkbatch does the batching.
//
// # Mapping
//
//	codec.Message        PubsubMessage
//	Body             ->  data
//	Attributes       ->  attributes
//	IdempotencyKey   ->  attributes[Config.IdempotencyAttribute] ("idempotency-key")
//	Group            ->  ordering_key
//	Trace.Parent     ->  attributes["googclient_traceparent"] (TraceParentAttribute)
//	Trace.State      ->  attributes["googclient_tracestate"] (TraceStateAttribute)
//	Tenant           ->  (not sent; the batcher's fairness unit)
//
// The message ids of a PublishResponse map back to the batch by position.
// Subscribers that deduplicate read the idempotency attribute.
//
// # Trace propagation
//
// A message whose Trace.Parent is set (the batcher sets it to the message's
// create span when the instance traces) carries its W3C trace context in the
// attributes Google's client library uses, "googclient_" followed by the
// header's name, so Google's subscriber, or any consumer that extracts with
// NewMessageCarrierFromPB of cloud.google.com/go/pubsub/v2, continues the
// trace. tracestate travels
// only with a traceparent, and only when non-empty. The carried context
// replaces any attribute of those two names the message has (a forwarded
// message's stale context). It counts in Size and in the attribute limits:
// with it a message may hold fewer attributes of its own. Set
// Config.DisableTracePropagation to carry nothing.
//
// # Limits
//
// One Publish request holds at most 1000 messages and 10,000,000 bytes
// (MaxRequestMessages, MaxRequestBytes), counted on the serialized
// PublishRequest. Size returns a message's exact share of it: the
// PubsubMessage's encoded size plus the repeated field's tag and length
// prefix. Limits().MaxBytes is 10,000,000 less the encoded topic field, so a
// request packed to MaxBytes by Size is exactly 10,000,000 bytes and never
// "10000004 > 10000000".
//
// The topic's name must be one Pub/Sub accepts: projects/{project}/topics/{id},
// the id 3 to 255 ASCII letters, digits or - _ . ~ + %, starting with a
// letter and not with "goog". New refuses any other name, naming
// Config.Topic, rather than have every request refused.
//
// Per message: data at most 10,000,000 bytes, at most 100 attributes
// (the idempotency and trace attributes count), keys non-empty and at most 256 bytes,
// values at most 1024 bytes, an ordering key of at most 1024 bytes, strings
// valid UTF-8 (protobuf cannot encode anything else), and non-empty data or at
// least one attribute of the user's (the idempotency attribute alone does not
// make a message: every sinkbatch codec refuses a message without payload). pstest enforces none of this and the real service
// enforces all of it, so the codec does: Validate (codec.Validator) answers a
// bad message at admission with a permanent *codec.EntryError whose Code
// names the rule (EmptyMessage, DataTooLarge, TooManyAttributes,
// EmptyAttributeKey, AttributeKeyTooLong, AttributeValueTooLong,
// OrderingKeyTooLong, InvalidUTF8, IdempotencyAttributeTaken,
// MessageTooLarge) and whose Message says what is wrong. The two size errors
// also wrap codec.ErrTooLarge. SendBatch validates again and never sends a
// message Validate refuses.
//
// # Ordering keys
//
// Pub/Sub requires every message of one PublishRequest to carry the same
// ordering key ("" included). Limits().OneGroupPerRequest says so, and the
// batcher then builds every batch from one key (or from messages without
// one), so a batch is one request. SendBatch still accepts a mixed batch, as
// any caller may send one: it publishes it as one request per key, keys in
// parallel (at most 16 at a time), each key's messages in order; if a
// request of a key fails for a reason other than a refusal, or a message of
// it gets no id, the key's later requests of that batch are not sent (they
// would overtake it) and their messages get a retryable error.
//
// # Errors
//
// A Publish call is all-or-nothing. Its failure is classified by gRPC code:
//
//	InvalidArgument; ResourceExhausted "... larger than max"  the request is refused for its content: wraps codec.ErrRefused
//	NotFound, PermissionDenied, Unauthenticated,
//	FailedPrecondition, Unimplemented                        permanent *codec.EntryError for every message
//	ResourceExhausted (any other)                            retryable and throttled (codec.IsThrottled) for every message
//	Unavailable, DeadlineExceeded, Aborted, Internal,
//	Canceled, Unknown and the rest                           retryable *codec.EntryError for every message
//
// The *codec.EntryError's Code is the gRPC code's name and its Message the
// server's text.
//
// ResourceExhausted has two sources. The service sends it for an exhausted
// quota or publisher flow control: that asks the caller to slow down, so the
// answer reports codec.IsThrottled and an adaptive destination lowers its
// in-flight limit. gRPC sends it for a message over a receive or send size
// limit ("grpc: received message larger than max (N vs. M)"), which an
// emulator or pstest sets at 4 MiB, below Pub/Sub's 10 MB: that request was
// never processed and a smaller one passes, so it is a refusal the batcher
// bisects, and a message too large on its own is answered permanently.
//
// A successful call is an acknowledgement only for the messages it gives an
// id. A message whose id is missing or empty is answered with a retryable
// *codec.EntryError of Code CodeMissingResult ("may have been stored": the
// request reached the server, so retry it with the same idempotency key);
// when the answer holds too few or too many ids, every message of the
// request gets it, and it also wraps codec.ErrResultCount. The gRPC error stays in the chain (status.Code works on the
// answer), and so does ctx.Err() when the caller's context ended the call
// (errors.Is(err, context.DeadlineExceeded) holds; that failure is
// retryable).
//
// # Retries
//
// Exactly one layer retries: the caller. The client library would retry
// Publish on Unavailable, Internal, ResourceExhausted, Aborted, Unknown,
// Canceled and DeadlineExceeded for up to 60 s; the codec turns that off
// (gax.WithRetry(nil) on every call, overriding a Config.Client's own
// CallOptions), because a retry inside SendBatch would hold the whole batch
// past callers' deadlines, and the caller already retries failed messages
// with their idempotency key, guided by codec.IsPermanent. The batcher's
// context carries the batch's deadline; DefaultTimeout (60 s) applies only
// to a context without one.
//
// # Compression
//
// With Config.CompressionBytesThreshold above 0, a request whose serialized
// size is above it is sent gzip-compressed (gRPC's gzip compressor on the
// call), as the Google client does with EnableCompression. Pub/Sub's
// limits and Size count the request before compression. It costs CPU at
// both ends and saves bytes on the wire (docs/performance.md has the
// figures).
//
// # Identity
//
// Identity covers the topic, the endpoint, a SHA-256 digest of
// CredentialsJSON (the credentials themselves are never kept in it, nor
// logged), Insecure, the idempotency attribute, trace propagation, the
// compression threshold and the Tuning. ClientOptions and a ready Client are
// opaque: describe them in Config.IdentityExtra, or the codec gets an
// identity of its own and shares batches with no other codec value. Either
// way two codecs with different credentials never share a request.
//
// # Concurrency and lifecycle
//
// A Codec is safe for concurrent use and immutable after New. Close closes
// the connection the codec dialled (not a Config.Client); call it after the
// sinkbatch instance using the codec has stopped.
package pubsub
