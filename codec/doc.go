// Package codec defines what sinkbatch needs from a destination: the Codec
// interface, the Message it batches, the per-message Result and the errors a
// codec reports. It imports only the standard library.
//
// A codec states its destination API's hard Limits (SQS SendMessageBatch: 10
// entries, 1 MiB; Pub/Sub Publish: 1000 messages, 10 MB) and the user's Tuning;
// the batcher merges the two so that a user can only tighten the limits.
//
// Errors are classified once, here: a codec returns per-message failures as
// *EntryError (Permanent or not), a whole-request refusal for the request's
// content as an error wrapping ErrRefused (the batcher then bisects the batch
// to find the message the destination refuses), and any other whole-request
// failure as the answer for every message. The SDK under the codec retries
// transport faults; the batcher never retries; the caller decides whether to
// send a failed message again, guided by IsPermanent.
package codec
