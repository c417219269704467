// Package actors is sinkbatch's front door: Start an Instance in a
// protoactor-go actor system, Deliver messages to it (from a goroutine with
// Instance.Deliver, or from an actor by sending *messages.Deliver to
// Instance.PID), read its Stats, and Stop it.
//
// # Delivery
//
// A delivery names its destination by its codec (codec.Codec): the codec's
// Name plus a keyed digest (HMAC-SHA-256 with a random per-instance key) of
// its Identity. The first delivery to a destination starts its batcher; every
// delivery to it afterwards goes from the sender's goroutine straight into
// that batcher's mailbox, so no single mailbox carries every destination's
// traffic. The batcher answers each delivery exactly once, when its message's
// own result is known: the destination's message id, or an error (package
// messages lists them and what a caller should do with each).
//
// A batch goes out when the sendable entries reach Tuning.MaxEntries or
// MaxBytes, or Linger after the queue became non-empty (or after the last
// batch left), with at most MaxInflight requests in flight per destination.
// Entries are taken round-robin across tenants, one at a time; entries of
// one group keep their admission order and a group has at most one request in
// flight. A delivery that does not fit the queue's bounds is refused at once
// with *messages.RetryAfterError; an entry whose caller gave up is never sent.
//
// # Failure
//
// A codec that panics in Size or Validate fails that message alone, with a
// permanent error wrapping codec.ErrCodecPanic; one that panics in SendBatch,
// or returns the wrong number of results, fails that batch only. A request
// the destination refuses for its content is bisected until the refused
// messages stand alone; a group whose message fails retryably in one half is
// held back in the later halves (messages.GroupPausedError), so no later
// message of it is stored first. A batcher that panics (its own code, or a
// Recorder it calls) is restarted at once (never given up on: protoactor
// drops messages to a stopped actor silently); everything it held is
// answered with messages.ErrBatcherDown and the requests it had in flight
// are cancelled. The supervisor never panics: user code it calls runs under
// a recover.
//
// # Lifecycle
//
// A batcher with nothing queued or in flight for Tuning.IdleTimeout stops;
// deliveries that race its stop are held and handed, in order, to its
// replacement. Stop drains: see Instance.Stop. protoactor's
// ActorSystem.Shutdown does not stop actors, so call Stop first.
//
// # Telemetry and logs
//
// Config.MeterProvider receives the metrics listed in package telemetry.
// Logs go to Config.Logger (or the actor system's): batcher started, stopped
// idle, crashed and restarted (WARN), a message the destination refused, a
// codec panic with its stack, and Stop's outcome; each names the instance and
// the destination (codec kind and digest, never the identity itself).
package actors
