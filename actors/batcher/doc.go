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
// type that reads no clock, starts no goroutine, sends no message and
// calls no caller's code: time comes in as an argument and a caller's
// leaving as an event (its Room's Leave flag, or the driver's report of
// callers it found gone: dispatch.leave, admitSwept), so tests drive it
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
// Goroutines that run this package's code: the actor (Receive, on the
// mailbox's own goroutine: batcher.go, mailbox.go's loop); request
// goroutines (request.go, and settle and learn in flow.go); any goroutine of
// the instance's callers (Params.ResumeGroup, TakePauses, PausedGroups,
// CallerLeft; Room and Listener calls the front door makes); timers (fire,
// which only posts a tick). Each piece of shared state has one guard:
//
//   - dispatch.mu guards the rules (queue: its lanes, pauses and waiting
//     list), the requests running, the slots they hold, whether the
//     incarnation is down and the adaptive limiter. Every dispatch method
//     takes it; nothing else touches those fields. The actor and request
//     goroutines call it; so do the goroutines of ResumeGroup and friends,
//     through Params.current.
//   - inflight.claims[i] says who answers entry i of a request in flight:
//     whoever sets it first, under dispatch.mu (finishWith on the request
//     goroutine, expire and abandon on the actor). The winner answers
//     outside the lock.
//   - Params.current (atomic) is the running incarnation; the next one is
//     published under the old one's dispatch.mu (handPausesTo), so a
//     ResumeGroup reaches one or the other, never a stale one.
//   - Params.goroutines (atomic) counts the request goroutines of every
//     incarnation: a new incarnation sends nothing while a crashed one's run.
//   - Params.waiting (atomic) is the actor's last count of waiters, read by
//     CallerLeft on callers' goroutines.
//   - Counters (atomics) are the instance's, added to by every batcher and
//     read by Stats.
//   - mailboxRef.mu guards the hand-over of a mailbox run to its goroutine;
//     its held and prompt atomics are written by the actor and by whoever
//     wakes it (mailbox.go).
//   - Room.taken (atomic) gives a Room to the first batcher that admits a
//     Deliver naming it.
//   - Params.bufs (a sync.Pool) passes request buffers between goroutines.
//   - Everything else in Params (received, drain, aborted, incarnations) and
//     every field of Batcher is the actor's alone; the Batcher fields set in
//     Started are read by request goroutines too and never change.
//
// Codec code runs outside every lock: Validate and Size on the actor (a
// panic answers that one message, permanent, wrapping codec.ErrCodecPanic),
// SendBatch on request goroutines. A caller's code is never called under
// dispatch.mu: a Listener's Listening is asked on the actor as a delivery
// arrives, and on the request goroutine before it sends (dropLeft), each
// time outside the lock; the callers it finds gone are reported to the
// rules (dispatch.leave), which take them out of the batch unsent. The
// process registry is asked about an actor's sender (which has no Room to
// say it left with) on the actor, outside the lock, when a full queue is
// swept for room (admission.ask, admitSwept) and before each sweep the
// actor makes for deadlines and for callers that left (Batcher.sweep,
// dispatch.sweepGone). A panic in Listening restarts the batcher.
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
