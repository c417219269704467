// Package messages is sinkbatch's actor protocol: the Deliver request an
// actor sends to an instance's PID, the Delivered answer, and the errors a
// delivery can be answered with. It imports nothing of sinkbatch but codec, so
// callers can depend on it alone.
//
// Every Deliver sent with a sender is answered exactly once. The answer's Err
// is one of:
//   - nil: the destination accepted the message; ID (and Sequence) say how it
//     names it.
//   - *RetryAfterError: the destination's queue was full; nothing was queued.
//   - an error wrapping codec.ErrTooLarge, or one codec.IsPermanent reports as
//     permanent: sending the same message again cannot succeed.
//   - ErrBatcherDown: the batcher crashed while it held the message; it may or
//     may not have been sent. Retry with the same idempotency key.
//   - ErrStopped: the instance is stopping.
//   - an error wrapping context.DeadlineExceeded: the deadline passed before
//     the message was sent.
//   - any other error: a retryable failure the codec reported.
package messages
