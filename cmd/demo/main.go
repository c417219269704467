// Command demo runs sinkbatch under a mixed load against real wire protocols
// on this machine and checks, by reading every destination back, that what
// was acknowledged was stored, in order.
//
//	go run ./cmd/demo            # 15 s, embedded servers, no network
//	go run ./cmd/demo -h         # the flags
//
// With no flags it needs no network: it starts an SQS-compatible server
// (kumo) and the Pub/Sub fake (pstest) on 127.0.0.1, an actor system with a
// slog logger, and one sinkbatch instance with an OpenTelemetry
// MeterProvider. For -duration (15 s) it offers about 3,000 messages/s
// (-load scales it) to eight destinations, each its own batcher (the demo
// gives each codec its own Name), with a few scripted events on the way:
//
//	sqs-orders.fifo  a FIFO queue: tenants a, b and c, and "flood" sending
//	                 several times as much, each with its own message groups
//	sqs-events       a standard queue with the same tenants; at 60% one
//	                 marked message, sent right after twenty others, makes
//	                 its codec's Size panic, once: that message alone is
//	                 answered, permanently, with codec.ErrCodecPanic; the
//	                 twenty are sent as usual, and no batcher restarts
//	pubsub-orders    a topic whose messages carry ordering keys
//	pubsub-audit     a topic without ordering keys, IdleTimeout about 1 s:
//	                 at 15% one poison message, sent with seven companions so
//	                 that they share a batch, which the server refuses with
//	                 InvalidArgument (a pstest reactor): the batcher bisects
//	                 until the poison stands alone, and its caller gets a
//	                 permanent error; at 30% its traffic pauses until its
//	                 batcher has stopped idle, and resumes
//	sqs-burst        a standard queue with QueueMax 64 and TenantMax 40 that
//	                 a burst of 400 callers hits at 30%: refusals
//	                 (RetryAfterError), each retried after its After
//	sqs-strict.fifo  a FIFO queue with StrictGroups whose codec fails one
//	                 request in 25: the failed messages' groups pause (their
//	                 deliveries are answered GroupPausedError) until the
//	                 callers retry them, and every group stays in order
//	sqs-block        a standard queue with WhenFull Block and QueueMax 64
//	                 that the same burst hits: up to 64 deliveries wait for
//	                 room, fairly across tenants; the rest of the burst is
//	                 refused as on sqs-burst and retried
//	sqs-adaptive     a standard queue with Adaptive and MaxInflight 16: the
//	                 in-flight limit it settles on is in the summary
//
// Every message is sent as a dispatch attempt would send it: with an
// idempotency key; after a *messages.RetryAfterError (once After has passed),
// messages.ErrBatcherDown or any other retryable error it is sent again with
// the same key; after a permanent error (codec.IsPermanent) it is not.
//
// # Progress
//
// Once a second a progress line goes to stderr, with the logs; on a terminal
// it is one line redrawn in place below the logs (see console), so the two
// never share a line:
//
//	3s  1186/s  queued=2 inflight=3 refused=0 down=0 retries=8 batchers=8
//
// seconds elapsed; deliveries acknowledged in the last second; the
// instance's entries queued and requests in flight (Instance.Stats); and,
// since the start, refusals for a full queue, ErrBatcherDown answers (0
// unless a batcher crashed: the codec panic above fails one message, not
// its batcher), retries, and batchers running (one per destination;
// pubsub-audit's stops when idle and comes back, so 8 -> 7 -> 8).
//
// # Report
//
// When the load ends the callers finish their retries, the instance is
// stopped with a deadline (its outcome is printed), and the demo prints a
// table with one row per destination:
//
//	delivered    messages whose caller was finally answered with success
//	requests     requests the batcher made, bisections included (the
//	             OpenTelemetry counter flush.requests)
//	entries/req  entries sent / requests: how much batching bought
//	bisections   extra requests spent isolating a message the destination
//	             refused
//	refused      deliveries answered RetryAfterError because the queue was
//	             full
//	retried      messages that took more than one attempt
//	failed       messages never delivered: refused for good, or out of
//	             attempts
//	p50, p99     from a message's first attempt to its success, retries
//	             included, as its caller saw it
//	stored, dups, lost
//	             read back from the destination: messages held, held more
//	             than once, acknowledged but missing
//	order        messages stored after one of their group that was
//	             acknowledged before they were first sent (ordered
//	             destinations only)
//
// entries/req is low on pubsub-orders because a Publish carries one ordering
// key and a key has at most one request in flight: a request holds only the
// messages of its key that arrived while the key's previous request was
// out. An SQS FIFO request mixes groups, so it fills up. Fewer keys, or more
// messages per key, fill requests.
//
// Below the table: what each destination is, a table per tenant (the
// flooding tenant must not slow the others), how each scripted event went,
// and the verdict, read back from every destination (SQS: receive and delete
// until empty; Pub/Sub: the fake's record):
//
//	lost: N              acknowledged, but not stored
//	order violations: N  within a FIFO group or ordering key, a message
//	                     acknowledged before another of its group was first
//	                     submitted, yet stored after it
//	duplicates: N        stored more than once; expected on the standard
//	                     queue when a message whose answer was lost (its
//	                     batcher crashed, a deadline passed) had been stored:
//	                     delivery is at least once
//
// It exits 1 if lost or order violations is not zero, or if Stop or a read
// back failed; 2 on bad flags.
//
// # Flags
//
// -metrics-addr serves the instance's metrics in the Prometheus format at
// /metrics, through the OpenTelemetry Prometheus exporter and a registry of
// the demo's own. -sqs-queue-url, -sqs-endpoint, -pubsub-topic and
// -pubsub-endpoint (or $PUBSUB_EMULATOR_HOST) send to real services, or other
// emulators, instead of the embedded servers, with the SDKs' default
// credential chains; the output says what could not be read back, and the
// poison, which needs the embedded server, is then not sent. -cluster N runs
// N cluster members in this process instead (mutual TLS, the Pub/Sub fake,
// one member killed halfway) and prints lost and order violations read back
// from the fake (see cluster.go). -outbox relays an outbox table from PostgreSQL
// instead (a throwaway server from the installed binaries, or -outbox-dsn),
// with the relay in a child process killed once with SIGKILL, and prints
// lost, order violations and duplicates read back from both destinations
// (see outbox.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"
)

func main() {
	if cfg := os.Getenv(outboxRelayEnv); cfg != "" { // -outbox's relay process
		os.Exit(outboxRelayChild(cfg))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the demo's flags.
type options struct {
	duration    time.Duration
	load        float64
	metricsAddr string
	logLevel    string
	cluster     int    // members of cluster mode (cluster.go); 0: one instance
	outbox      bool   // the outbox relay instead (outbox.go)
	outboxDSN   string // its PostgreSQL; "": a throwaway server

	sqsQueueURL    string
	sqsEndpoint    string
	pubsubTopic    string
	pubsubEndpoint string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.duration, "duration", 15*time.Second, "how long to drive the load")
	fs.Float64Var(&o.load, "load", 1, "multiplies every stream's rate and the burst's size (1 offers about 3,000 messages/s)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address, e.g. 127.0.0.1:9464")
	fs.StringVar(&o.logLevel, "log-level", "info", "slog level of the actor system's and sinkbatch's logs: debug, info, warn, error")
	fs.IntVar(&o.cluster, "cluster", 0, "run N cluster members in this process instead (mutual TLS, Pub/Sub fake, one member killed halfway); see cluster.go")
	fs.BoolVar(&o.outbox, "outbox", false, "relay an outbox table from PostgreSQL instead, killing the relay process once; see outbox.go")
	fs.StringVar(&o.outboxDSN, "outbox-dsn", "", "with -outbox: the PostgreSQL to use, where it drops and recreates tables demo_outbox and demo_outbox_leases (default: a throwaway server from the installed binaries)")
	fs.StringVar(&o.sqsQueueURL, "sqs-queue-url", "", "send every SQS destination's messages to this existing queue (AWS default credentials; not read back)")
	fs.StringVar(&o.sqsEndpoint, "sqs-endpoint", "", "SQS endpoint URL instead of the embedded server; without -sqs-queue-url the demo creates its queues there and reads them back")
	fs.StringVar(&o.pubsubTopic, "pubsub-topic", "", "publish every Pub/Sub destination's messages to this existing topic, projects/P/topics/T (default credentials; not read back)")
	fs.StringVar(&o.pubsubEndpoint, "pubsub-endpoint", "", "Pub/Sub host:port for -pubsub-topic; default $PUBSUB_EMULATOR_HOST, else the service")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: demo [flags]\n\nRuns sinkbatch under a mixed load and checks the destinations for lost and reordered messages.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.duration <= 0:
		return o, fmt.Errorf("-duration %v is not positive", o.duration)
	case o.load <= 0 || o.load > 20:
		return o, fmt.Errorf("-load %v is outside (0, 20]", o.load)
	case o.pubsubEndpoint != "" && o.pubsubTopic == "":
		return o, fmt.Errorf("-pubsub-endpoint needs -pubsub-topic")
	}
	return o, nil
}
