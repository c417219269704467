// Package batcher is the actor that owns one destination's queue.
//
// The flow rules beside the queue are as plain: pause.go (StrictGroups: the
// one rule, queue.interrupt, that every answer leaving a message's fate to
// its caller goes through, and the retries a paused group waits for),
// block.go (WhenFull Block: the
// waiting list and its fair admission), adaptive.go (Adaptive: the AIMD
// limiter that sets the queue's MaxInflight); flow.go joins them to the
// actor.
//
// The batching rules (admission bounds, tenant round-robin, group gating,
// the flush decision, the sweep of abandoned entries) live in queue, a plain
// type that reads no clock, starts no goroutine and sends no message: time
// comes in as an argument and caller liveness as a callback, so tests drive it
// step by step (queue_test.go), a fuzzer compares it with a simple model
// (FuzzQueue) and another holds it to the group-order promise against
// callers that retry as documented (FuzzStrictGroupOrder).
// Batcher is the thin driver around it, as raft's node drives RawNode: it
// feeds the queue deliveries and ticks, runs each batch's request on a
// goroutine of its own, and turns what comes back into answers. While it
// holds something, its mailbox runs on one goroutine that waits between
// messages for the next (mailboxRef, whose own lock guards only the handing
// of a run to that goroutine), instead of protoactor's new goroutine per
// wake.
//
// # Concurrency
//
// Three owners, each named in the code:
//
//   - dispatch (dispatch.go) holds the one mutex and exactly the state the
//     actor shares with its request goroutines: the queue, the requests
//     running, the slots they hold, and whether the incarnation is down.
//     Every method of it takes the lock. A request goroutine whose request
//     ends calls finish, which opens the batch's groups and takes the batch
//     due at that moment for the same slot, so that a busy destination's
//     slots never wait for the actor's turn to run.
//   - Batcher's own fields are touched by the actor alone; those set in
//     Started are read by request goroutines too and never change. Codec
//     code the actor calls (Validate, Size) runs outside the lock, and a
//     panic there answers that one message (permanent, wrapping
//     codec.ErrCodecPanic).
//   - Each caller whose entry is in a request is answered exactly once, by
//     whoever first sets its claim (inflight.claims): the request goroutine
//     with the result, or the actor when the caller's deadline passes first
//     (the message may still be stored) or when it restarts, aborts or stops
//     (protoactor races on a second reply to a future).
//
// A restart makes a new Batcher with a new dispatch. The crashed one is down
// from the moment it panics: its request goroutines finish their requests
// but take nothing more from its queue, a panic one of them reports cannot
// restart its successor, and the successor sends nothing until they have
// ended (they hold slots and groups it does not know of). A panic in the
// rules on a request goroutine is sent to Receive, which panics with it, so
// the supervisor restarts the batcher as for a panic in Receive.
//
// # Messages
//
// The supervisor and a batcher speak Idle (nothing queued or in flight for
// IdleTimeout, with the count of deliveries received so far), Drain and
// Drained (Stop), and Abort (Stop's context ended: answer everything held,
// and every delivery still arriving, with ErrStopped). Params carries what
// must outlive a restart: the received count, Stop's drain and the count of
// incarnations.
package batcher
