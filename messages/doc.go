// Package messages is sinkbatch's actor protocol: the Deliver request an
// actor sends to an instance's PID, the Delivered answer, and the errors a
// delivery can be answered with. It imports nothing of sinkbatch but codec, so
// callers can depend on it alone.
//
// Every Deliver sent with a sender is answered exactly once, when its
// message's own result is known; actors.Instance.Deliver returns the same
// answers. Delivery is at least once: the idempotency key travels with every
// message (SQS FIFO's MessageDeduplicationId, and an attribute on every queue
// and topic) so that consumers can drop the duplicates a retry can create.
//
// # Errors
//
// This is the one catalogue of what an answer's error means and what the
// caller (a dispatch attempt that keeps its row claimed until answered)
// should do; other packages link here. codec.IsPermanent(err) is true exactly
// for the errors marked permanent below: a caller that retries everything
// else, with the same idempotency key, and parks the permanent ones never
// loops forever and never loses a row. Test with errors.Is and errors.As.
//
// Retry with the same idempotency key:
//
//   - nil: the destination accepted the message; the id (and, from
//     DeliverResult, the FIFO sequence number) say how it names it.
//   - *RetryAfterError: the destination's queue is full (Reason: entries,
//     bytes or tenant; with Tuning.WhenFull Block, only past QueueMax waiting
//     deliveries); nothing was queued. Retry after its After, drawn with full
//     jitter up to Tuning.RetryAfterMax.
//   - *GroupPausedError: an earlier message of the group failed in the same
//     request, or, with Tuning.StrictGroups, the group is paused (a message
//     of it was answered without a final result: a retryable failure, an
//     expiry, a cancel, a refusal for fullness, a restart); this message was
//     never sent. Retry the message whose idempotency key is Key first, then
//     this one, after the suggested wait After; or resume the group
//     (actors.Instance.ResumeGroup), or wait for Tuning.GroupPauseMax.
//   - ErrBatcherDown: the batcher crashed while it held the message (a panic
//     in its own code or in a telemetry Recorder); it may or may not have
//     been sent.
//   - ErrStopped: the instance is stopping or stopped, or Stop's ctx ended
//     while the message was held (one already in a request may have been
//     stored), or it was waiting for room (WhenFull Block) when Stop began.
//     Retry elsewhere or later.
//   - an error wrapping context.DeadlineExceeded: the caller's deadline
//     passed (or, without one, the instance's DefaultTimeout). A message
//     still queued or waiting for room then is never sent; one already in a
//     request may have been stored.
//   - an error wrapping context.Canceled: the caller's ctx was cancelled; a
//     queued message is never sent, one already in a request may have been
//     stored. Retry if the message is still wanted.
//   - codec.IsThrottled: the destination asked to slow down (SQS throttling
//     codes, KMS throttling, HTTP 429; Pub/Sub ResourceExhausted). Retry
//     later; an adaptive destination lowers its in-flight limit on it.
//   - an error wrapping codec.ErrCodecPanic from SendBatch: the codec
//     panicked while sending this message's batch, or returned an error the
//     batcher cannot read (a typed nil such as a nil *codec.EntryError, or
//     one whose methods panic); the request may have been made. Fix the
//     codec.
//   - an error wrapping codec.ErrResultCount: the codec returned the wrong
//     number of results; the request was made. Fix the codec.
//   - a *codec.EntryError whose Permanent is false: a retryable failure the
//     destination reported (5xx, an unknown code), or an answer for this
//     message that was missing, unverifiable or contradictory (SQS
//     MissingResult, MissingChecksum, ChecksumMismatch, ConflictingResult;
//     Pub/Sub MissingResult), which may have been stored.
//
// Permanent (codec.IsPermanent): park the row, or fix the caller or the
// codec; sending the same message again cannot succeed.
//
//   - a *codec.EntryError whose Permanent is true: the destination can never
//     take this message (invalid content, a missing queue or topic, access
//     denied, a KMS key fault).
//   - an error wrapping codec.ErrRefused: the destination refused the request
//     for this message alone (isolated by bisection).
//   - an error wrapping codec.ErrTooLarge: the message alone exceeds a
//     request's MaxBytes (or the SQS queue's MaximumMessageSize).
//   - a codec's Validate error: refused at admission (an empty body, a
//     character the destination refuses, a FIFO message without a group).
//   - an error wrapping codec.ErrCodecPanic from Size or Validate, or an
//     error from Validate the batcher cannot read: this message makes the
//     codec panic.
//   - a Tuning.X, Limits() or Name() error, or one wrapping
//     codec.ErrCodecPanic from Name, Identity, Limits or Tuning: the codec's
//     configuration is refused (the sqs and pubsub codecs refuse a bad
//     Config or Tuning in New already).
//   - ErrNoIdempotencyKey: a message with a Group but no IdempotencyKey to a
//     destination with Tuning.StrictGroups.
//   - ErrNilCodec: the codec is nil, or a nil pointer.
//   - actors.ErrNilContext: a method of actors.Instance was given a nil ctx.
//   - ErrNotDeliver: an actor sent the instance's PID something other than a
//     non-nil *Deliver (a Deliver by value, for instance).
//
// Cluster mode adds clustered.ErrUnreachable (retry with the same key); see
// package actors/clustered.
package messages
