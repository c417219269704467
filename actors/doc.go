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
// batch left; longer on a loaded instance, see codec.Tuning.Linger), with at
// most MaxInflight requests in flight per destination.
// Entries are taken round-robin across tenants, one at a time; entries of
// one group keep their admission order and a group has at most one request in
// flight. A delivery that does not fit the queue's bounds is refused at once
// with *messages.RetryAfterError; an entry whose caller gave up is never sent.
//
// # Failure
//
// A codec that panics in Size or Validate fails that message alone, with a
// permanent error wrapping codec.ErrCodecPanic; one that panics in SendBatch,
// or returns the wrong number of results, fails that batch only; an error it
// returns that cannot be read (a typed nil such as a nil *codec.EntryError,
// or one whose methods panic) fails its message, or its batch, with an
// error wrapping codec.ErrCodecPanic (retryable from SendBatch, permanent
// from Validate); a panic in Describe is
// logged, and the spans are named by the codec's Name. A request
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
// # Flow (opt-in per destination, in codec.Tuning)
//
// StrictGroups: a retryable failure of a message of group G (its request
// failed, or its entry did; not a permanent failure, which will never come
// back) pauses G before G's next request can leave. G's queued and waiting
// messages, and every new delivery to G, are answered
// *messages.GroupPausedError at once and never sent. G resumes when the
// failed message's retry arrives (a delivery with its IdempotencyKey, which
// then goes first), on Instance.ResumeGroup, or after GroupPauseMax (30s);
// Instance.PausedGroups lists the paused groups, and
// Instance.TakePausedGroups and AdoptPausedGroups move them to another
// instance that takes the destination over. A delivery of G refused
// because the queue is full pauses G the same way for new deliveries, and
// so does a restart for every group the crashed batcher held. So a caller
// that retries each failed or paused message, in its own order, with the
// same key, sees each group stored in the order it first delivered it.
// One limit remains, and it is the destination's: in one SQS
// SendMessageBatch holding several entries of G, SQS enqueues the entries
// in order but answers each alone, and documents nothing about the entries
// after a failed one. If entry i of G fails retryably and a later entry j
// of G in the same request is stored, j is stored before i's retry: the
// batcher cannot recall it (it answers i with the error and j with its
// id). Everything of G that would leave after that request is held. Pub/Sub
// has no such case: a Publish holds one ordering key and succeeds or fails
// as a whole. Where even that case matters, set Tuning.MaxEntries to 1.
//
// WhenFull Block: a delivery that does not fit the queue waits for room
// until its deadline (then it is answered with an error wrapping
// context.DeadlineExceeded, never queued). Waiters are admitted fairly:
// round-robin across tenants, in arrival order within a tenant, and a
// group's waiters never overtake each other. At most QueueMax deliveries
// wait; past that a tenant with fewer waiters takes the place of the newest
// waiter of the tenant with the most (that waiter is refused), or the
// delivery is refused as with Refuse. Stats.Waiting counts the waiters; a
// waiter whose caller gave up still counts until the batcher next looks at
// the waiting list (room frees, a full queue is swept, or the waiter's
// deadline passes). Stop answers them messages.ErrStopped.
//
// Adaptive: the destination's in-flight limit starts at 1 and moves
// between 1 and MaxInflight by AIMD on request time, after Vector's
// adaptive request concurrency: +1 per window (two request times) while
// request time stays near its no-load baseline and requests use the whole
// limit, ×0.9 when request time reaches 1.3 × the baseline or the
// destination throttles (codec.IsThrottled) or a request runs out of time.
// Group gates and tenant fairness are unchanged. The gauge
// ankusa.sink_batch.inflight.limit shows each adaptive destination's limit;
// changes are logged at DEBUG.
//
// # Lifecycle
//
// A batcher with nothing queued, waiting or in flight and no group paused for
// Tuning.IdleTimeout stops;
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
