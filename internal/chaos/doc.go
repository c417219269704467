// Package chaos holds sinkbatch's chaos tests; it has no code of its own.
//
// TestChaosSoak drives an instance with many tenants, groups and random
// caller deadlines against real servers — kumo (SQS, a standard and a FIFO
// queue) behind a fault-injecting HTTP proxy, and pstest (Pub/Sub, ordering
// keys) with a fault-injecting reactor and interceptor — through a codec
// wrapper that panics in SendBatch and Size now and then. Each caller behaves
// like a dispatch attempt: it retries failed deliveries with the same
// idempotency key, honours RetryAfterError, and never retries a permanent
// error. At the end it reads every queue and topic back and checks that no
// acknowledged message is missing, that no caller was answered twice, late or
// never, that each group's causal order holds at the server, that the queue
// bounds held, and that Stop leaves nothing behind. It prints one line of
// figures so runs can be compared.
//
//	go test -race ./internal/chaos/                       # CI: 20 000 messages
//	go test -race ./internal/chaos/ -run Soak -soak=10m   # for a duration
//	go test ./internal/chaos/ -run Soak -soak-n=100000 -soak-seed=7
//
// TestBadInputIsRefusedAtOnce sends every kind of input the codecs and the
// batcher must refuse and checks that each is answered at once with an error
// that says why, and that nothing is queued or sent.
package chaos
