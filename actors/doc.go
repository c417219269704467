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
// codec.Tuning's field docs say what StrictGroups, WhenFull Block and
// Adaptive do; what the instance adds:
//
// StrictGroups: a paused group's rule lives in the batcher, so it holds the
// same for the front door's callers and actors'; the answer that paused it
// names the key it waits for next, and GroupPausedError.After suggests a
// wait. Instance.ResumeGroup ends a pause without the retries (the caller's
// choice), Instance.PausedGroups lists the paused groups, and Instance.TakePausedGroups and AdoptPausedGroups move them
// to another instance that takes the destination over. In one SQS
// SendMessageBatch holding several entries of a group, SQS enqueues the
// entries in order but answers each alone: if entry i fails retryably and a
// later entry j of the group in the same request is stored, j is stored
// before i's retry (the batcher cannot recall it). Everything of the group
// that would leave after that request is held.
//
// WhenFull Block: Stats.Waiting counts the waiters. A waiter whose deadline
// passes is answered with an error wrapping context.DeadlineExceeded and
// never queued; a front-door caller that cancels while queued frees its room
// at once, and the waiters that fit are admitted then; Stop answers waiters
// messages.ErrStopped.
//
// Adaptive: the limit grows by one per window (two request times) while
// requests use the whole limit, after Vector's adaptive request concurrency;
// a request that runs out of time lowers it as throttling does. Group gates
// and tenant fairness are unchanged. The gauge
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
// Config.MeterProvider receives the metrics, and Config.TracerProvider the
// spans, that package telemetry lists.
// Logs go to Config.Logger (or the actor system's): batcher started, stopped
// idle, crashed and restarted (WARN), a message the destination refused, a
// codec panic with its stack, and Stop's outcome; each names the instance and
// the destination (codec kind and digest, never the identity itself).
// protoactor itself logs in colour at INFO to stderr unless the actor system
// is given a logger (actor.WithLoggerFactory with any slog.Handler), as the
// package's examples do.
//
// # Cluster mode
//
// Package actors/clustered puts one batcher per destination in a whole
// protoactor-go cluster; its doc is the reference.
package actors
