// Package codectest is the conformance suite every sinkbatch codec runs, in
// the manner of gocloud's drivertest: a codec's own test package supplies a
// Harness that makes codecs for fresh destinations on a real (or faithful
// fake) server and reads back what those destinations hold, and calls Run.
//
// Run checks what the batcher relies on and what a user can observe:
//
//   - Name is non-empty and stable; Identity is stable and differs when only
//     the tuning differs; Limits are positive and Tuning is within them.
//   - Size is positive and grows with the body and with the attributes.
//   - SendBatch of Limits.MaxEntries messages answers one Result per message,
//     each with a non-empty, distinct ID, and every message reads back with
//     its body, attributes, group and idempotency key intact.
//   - The order of each group is kept across two sequential requests.
//   - A cancelled context makes SendBatch return promptly with an error.
//   - If the codec is a codec.Validator, an empty message is refused with an
//     error codec.IsPermanent reports as permanent.
//
// Every message Run sends carries a group, an idempotency key and string
// attributes, so a harness for a destination that requires them (an SQS FIFO
// queue) needs no special case. A request mixes groups unless the codec's
// Limits say OneGroupPerRequest, as the batcher would build it. A destination that does not report a field
// on read back (kumo's SQS does not return a message's group), or does not
// keep order within a group (an SQS standard queue), says so by implementing
// Unreported; Run then skips that comparison and logs it.
//
// The package imports testing and testify: it is meant for _test.go files
// only.
package codectest
