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
// StrictGroups: every answer that leaves a message's fate to its caller —
// a retryable failure (its request's or its entry's; not a permanent one,
// which never comes back), an expiry in the queue or in flight, a caller
// that cancelled, a refusal because the queue is full, a restart (ErrBatcherDown)
// — pauses the message's group G, keyed by that message. G's later queued
// and waiting messages are taken out and answered
// *messages.GroupPausedError naming the key G waits for next, and so is
// every delivery of G that is not that retry: G then admits the retries of
// the messages it answered so, in the order it first delivered them, and
// resumes once the last is in, on Instance.ResumeGroup, or GroupPauseMax
// (30s) after its last pause. Nothing later in G is sent meanwhile. A
// grouped message needs an IdempotencyKey (else messages.ErrNoIdempotencyKey,
// permanent): the retry is known by it. GroupPausedError.After suggests a
// wait before delivering again. Instance.PausedGroups lists the paused
// groups, and Instance.TakePausedGroups and AdoptPausedGroups move them to
// another instance that takes the destination over. So a caller that
// retries each message it was answered without a final result, in its own
// order, with the same key, sees each group stored in the order it first
// delivered it (ResumeGroup and GroupPauseMax end a pause without the
// retries, by the caller's choice).
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
// context.DeadlineExceeded, never queued); while anything waits, a new
// delivery waits for its turn too. Waiters are admitted round-robin across
// tenants, in arrival order within a tenant, and a group's waiters never
// overtake each other. The waiter whose turn it is keeps its turn until
// room for it frees: room freed meanwhile is reserved for it, not taken by
// a smaller message behind it (only a waiter held by its own tenant's
// TenantMax passes its turn on). A caller that cancels while queued frees
// its room at once, and the waiters that fit are admitted then. At most
// QueueMax deliveries wait; past that a tenant with fewer waiters takes the
// place of the newest waiter of the tenant with the most (that waiter is
// refused), or the delivery is refused as with Refuse. Stats.Waiting counts
// the waiters. Stop answers them messages.ErrStopped.
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
