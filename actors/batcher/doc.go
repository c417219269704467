// Package batcher is the actor that owns one destination's queue.
//
// The batching rules (admission bounds, tenant round-robin, group gating,
// the flush decision, the sweep of abandoned entries) live in queue, a plain
// type that reads no clock, starts no goroutine and sends no message: time
// comes in as an argument and caller liveness as a callback, so tests drive it
// step by step (queue_test.go) and a fuzzer compares it with a simple model.
// Batcher is the thin driver around it, as raft's node drives RawNode: it
// feeds the queue deliveries and ticks, runs each batch's request on a
// goroutine of its own, and turns what comes back into answers.
//
// # Concurrency
//
// Batcher's fields are guarded by one mutex. Receive holds it throughout; a
// request goroutine takes it only when its request has ended, to open the
// batch's groups and take the batch due next for its own slot, so that a
// busy destination's slots never wait for the batcher's turn to run (on a
// loaded machine that wait was about a tenth of a 2 ms request); a panic
// there is sent to Receive, which panics with it, so the supervisor restarts
// the batcher as for a panic in Receive. Fields set in Started never change. A caller whose entry is in a request is answered
// exactly once, by whoever first claims the entry: the request goroutine with
// the result, or the batcher when the caller's deadline passes first (the
// message may still be stored) or when it restarts, aborts or stops
// (protoactor races on a second reply to a future). A restart makes a new
// Batcher. The crashed one is down from the moment it panics: its request
// goroutines finish their requests but take nothing more from its queue,
// and a failure one of them reports cannot restart its successor, which
// sends nothing until they have ended (they hold slots and groups it does
// not know of).
//
// # Messages
//
// The supervisor and a batcher speak Idle (nothing queued or in flight for
// IdleTimeout, with the count of deliveries received so far), Drain and
// Drained (Stop), and Abort (Stop's context ended). Params carries what must
// outlive a restart: the received count and the count of incarnations.
package batcher
