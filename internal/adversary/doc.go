// Package adversary holds sinkbatch's adversary test; it has no code of its
// own.
//
// TestAdversary is a seeded, randomized, concurrent driver of the public API
// only (actors.Start, Instance.Deliver and DeliverResult, *messages.Deliver
// sent to Instance.PID by actors and futures, Instance.Stats, Instance.Stop).
// Each round starts an instance with a few destinations whose codecs (test
// doubles in this package, pointer and value types) panic in any method,
// return the wrong number of results, ignore their ctx for a while, refuse
// whole requests or single entries, and fail retryably or permanently, under
// tiny tunings (IdleTimeout of milliseconds, small queues, one to four
// requests in flight). Many goroutine and actor callers deliver with random
// tenants, groups, idempotency keys and deadlines (past ones, ones in the
// year 2300, and none, with a ctx that never ends), cancel at random moments, and Stop is called with a ctx that
// ends at a random moment while deliveries still arrive. Some callers answer
// from a reply process of their own that is a batcher.Listener, whose
// Listening panics now and then (on the batcher's actor or on a request
// goroutine, as it takes or sweeps); the Recorder panics now and then.
//
// At the end of a round it checks that every caller was answered exactly once
// and in time (by its deadline, or by Stop's return, plus a generous slack),
// that every acknowledged message is in its codec's record under the id the
// caller was given, that the callers that own a group reach the codec in the
// order they delivered, that no bound was exceeded (Stats, and requests,
// entries, bytes and groups in flight as the codec sees them), and that
// nothing is left behind (Stats back at zero, goleak).
//
//	go test -race ./internal/adversary/                                # short
//	go test -race ./internal/adversary/ -adversary.duration=10m        # long
//	go test -race ./internal/adversary/ -adversary.seed=N -adversary.rounds=1  # replay one round
//	go test -race ./internal/adversary/ -adversary.skip=farfuture,nilctx     # leave features out
//
// A round's seed fixes its configuration and every random choice its callers
// and codecs make; the scheduling of goroutines still varies, so a replay
// reproduces a failure often, not always.
package adversary
