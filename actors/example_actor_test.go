package actors_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/messages"
)

// Row is one outbox row for the relay to publish.
type Row struct {
	ID     string // also the message's idempotency key
	Tenant string
	Body   []byte
}

// Settled is what became of one row: the relay's report to whoever marks
// rows sent.
type Settled struct {
	Row      *Row
	ID       string // the destination's message id when Err is nil
	Attempts int
	Err      error // nil: delivered; otherwise permanent, or the row ran out of time
}

// How the relay retries.
const (
	attemptTimeout = 10 * time.Second       // each Deliver's deadline
	rowTimeout     = time.Minute            // after this a row settles with its last error
	retryPause     = 100 * time.Millisecond // before a resend after an error that names no wait
)

// relay publishes rows through a sinkbatch instance from inside an actor,
// and never blocks its mailbox:
//   - each row goes out as a *messages.Deliver sent with ctx.Request, so its
//     *messages.Delivered comes back to this actor as an ordinary message. A
//     Deliver sent without a sender (ctx.Send) is sent all the same, but
//     never answered: its row would stay pending for good;
//   - the row waits in pending under its ID, which travels as Deliver.Ref
//     and comes back in Delivered.Ref;
//   - after a *messages.RetryAfterError (the destination's queue was full and
//     nothing was queued) a timer posts a resend to the relay's own mailbox
//     once After has passed; other retryable errors are resent the same way
//     after retryPause, with the same idempotency key.
type relay struct {
	inst    *actors.Instance
	dest    codec.Codec
	settled chan<- Settled // must have room for every row: Receive never waits on it

	// Touched only by Receive.
	timers  *scheduler.TimerScheduler
	pending map[string]*pendingRow // by Row.ID
}

type pendingRow struct {
	row      *Row
	attempts int
	giveUp   time.Time            // from here on an error settles the row
	cancel   scheduler.CancelFunc // the scheduled resend, nil when none is
}

// resend is the timer's message to the relay: send row id again.
type resend struct{ id string }

func (r *relay) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		r.timers = scheduler.NewTimerScheduler(ctx.ActorSystem().Root)
		r.pending = map[string]*pendingRow{}
	case *Row:
		p := &pendingRow{row: m, giveUp: time.Now().Add(rowTimeout)}
		r.pending[m.ID] = p
		r.send(ctx, p)
	case *resend:
		if p := r.pending[m.id]; p != nil {
			p.cancel = nil
			r.send(ctx, p)
		}
	case *messages.Delivered:
		r.settle(ctx, m)
	case *actor.Stopping:
		for _, p := range r.pending {
			if p.cancel != nil {
				p.cancel()
			}
		}
	}
}

func (r *relay) send(ctx actor.Context, p *pendingRow) {
	p.attempts++
	ctx.Request(r.inst.PID(), &messages.Deliver{
		Codec:    r.dest,
		Message:  codec.Message{Tenant: p.row.Tenant, IdempotencyKey: p.row.ID, Body: p.row.Body},
		Deadline: time.Now().Add(attemptTimeout),
		Ref:      p.row.ID,
	})
}

func (r *relay) settle(ctx actor.Context, d *messages.Delivered) {
	id, _ := d.Ref.(string)
	p := r.pending[id]
	if p == nil {
		return
	}
	var full *messages.RetryAfterError
	switch {
	case d.Err == nil, codec.IsPermanent(d.Err), errors.Is(d.Err, messages.ErrStopped), time.Now().After(p.giveUp):
		delete(r.pending, id)
		r.settled <- Settled{Row: p.row, ID: d.ID, Attempts: p.attempts, Err: d.Err}
	case errors.As(d.Err, &full):
		p.cancel = r.timers.SendOnce(full.After, ctx.Self(), &resend{id: id})
	default:
		p.cancel = r.timers.SendOnce(retryPause, ctx.Self(), &resend{id: id})
	}
}

// Publish from an actor: a relay actor gets a burst of rows, more than its
// destination queues at once, and retries those refused.
func ExampleInstance_PID() {
	ctx := context.Background()
	srv := pstest.NewServer()
	defer srv.Close()
	const topic = "projects/my-project/topics/audit"
	if _, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		log.Fatal(err)
	}
	// A queue of 4 entries, so that most of the burst below is refused
	// with a retry-after of at most 20ms.
	audit, err := pubsub.New(ctx, pubsub.Config{
		Topic: topic, Endpoint: srv.Addr, Insecure: true,
		Tuning: codec.Tuning{QueueMax: 4, RetryAfterMax: 20 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer audit.Close()

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "relay"})
	if err != nil {
		log.Fatal(err)
	}
	defer inst.Stop(context.Background())

	const rows = 20
	settled := make(chan Settled, rows)
	pid := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &relay{inst: inst, dest: audit, settled: settled}
	}))
	// Stop the relay before the instance (defers run last first).
	defer func() { _ = system.Root.StopFuture(pid).Wait() }()

	for i := range rows {
		system.Root.Send(pid, &Row{ID: fmt.Sprintf("row-%02d", i), Tenant: "acme", Body: fmt.Appendf(nil, "event %d", i)})
	}
	delivered := 0
	for range rows {
		s := <-settled
		if s.Err != nil {
			fmt.Println(s.Row.ID, "failed:", s.Err)
			continue
		}
		delivered++
	}
	fmt.Println(delivered, "of", rows, "rows delivered")

	// A retry is a later send, so the topic holds the rows in no set
	// order: sort their keys.
	var keys []string
	for _, m := range srv.Messages() {
		keys = append(keys, m.Attributes[pubsub.DefaultIdempotencyAttribute])
	}
	slices.Sort(keys)
	fmt.Println(strings.Join(keys, " "))
	// Output:
	// 20 of 20 rows delivered
	// row-00 row-01 row-02 row-03 row-04 row-05 row-06 row-07 row-08 row-09 row-10 row-11 row-12 row-13 row-14 row-15 row-16 row-17 row-18 row-19
}
