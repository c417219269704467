package actors_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// A Deliver call's record serves later calls once both the call and its
// batcher have let go of it: a record reused while its batcher could still
// answer through it would hand one caller another's answer. Many callers
// deliver messages of their own through a codec that answers each with its
// body as its id, after a request time of its own; a third of them give up
// at once or shortly after (cancel), while their messages are queued or in
// flight, a third have deadlines that pass meanwhile, so records are let
// go of in every order while new calls take them. Every caller answered
// without an error must get its own message's id, a caller with time to
// spare that did not give up must get no error at all, and some cancelled
// callers' messages must have been sent and answered after their callers
// gave up (the late answers that make the order matter). The same holds
// when deliveries wait for room (WhenFull Block: their entries are never
// released) and when the instance traces (the caller ends its create span).
func TestARecordIsNeverReusedWhileItsBatcherCanAnswer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        actors.Config
		tune       codec.Tuning
		goroutines int
		groups     bool // each caller's messages are of one of 4 groups
	}{
		{name: "refuse", goroutines: 32},
		// 20 callers never outnumber QueueMax queued plus QueueMax waiting:
		// none is refused for fullness.
		{name: "block", tune: codec.Tuning{WhenFull: codec.Block, QueueMax: 10}, goroutines: 20},
		{name: "block-groups", tune: codec.Tuning{WhenFull: codec.Block, QueueMax: 10}, goroutines: 20, groups: true},
		{name: "traced", cfg: actors.Config{TracerProvider: sdktrace.NewTracerProvider()}, goroutines: 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Name = "reuse-" + tc.name
			tc.tune.Linger, tc.tune.MaxInflight = 50*time.Microsecond, 4
			checkNoReuse(t, tc.cfg, tc.tune, tc.goroutines, tc.groups)
		})
	}
}

// checkNoReuse is TestARecordIsNeverReusedWhileItsBatcherCanAnswer for an
// instance configured with cfg, a destination tuned with tune, and
// goroutines callers, whose messages are of 4 groups if groups is set.
func checkNoReuse(t *testing.T, cfg actors.Config, tune codec.Tuning, goroutines int, groups bool) {
	const (
		each   = 300
		within = 30 * time.Second
	)
	if tp, ok := cfg.TracerProvider.(*sdktrace.TracerProvider); ok {
		t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	}
	_, inst := start(t, cfg)
	c := fakecodec.New(cfg.Name, codec.Limits{MaxEntries: 16, MaxBytes: 1 << 20})
	c.Tune = tune
	c.Latency, c.Jitter, c.Discard = 300*time.Microsecond, 250*time.Microsecond, true
	var sentMu sync.Mutex
	sent := map[string]bool{} // bodies of cancelled calls' messages that were sent
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		res := make([]codec.Result, len(batch))
		sentMu.Lock()
		for i, m := range batch {
			res[i].ID = string(m.Body)
			if m.Body[0] == 'c' {
				sent[string(m.Body)] = true
			}
		}
		sentMu.Unlock()
		return res, nil
	}

	var (
		answered, expired atomic.Int64
		cancelledMu       sync.Mutex
		cancelled         []string
		wg                sync.WaitGroup
	)
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range each {
				var (
					ctx    context.Context
					cancel context.CancelFunc
					body   string
				)
				switch i % 3 {
				case 0: // gives up: at once, or within 600µs
					body = fmt.Sprintf("c%d-%d", g, i)
					ctx, cancel = context.WithTimeout(context.Background(), within)
					if after := time.Duration(r.IntN(600)) * time.Microsecond; after < 50*time.Microsecond {
						cancel()
					} else {
						time.AfterFunc(after, cancel)
					}
				case 1: // its deadline passes while queued or in flight, or not
					body = fmt.Sprintf("d%d-%d", g, i)
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(100+r.IntN(900))*time.Microsecond)
				default:
					body = fmt.Sprintf("w%d-%d", g, i)
					ctx, cancel = context.WithTimeout(context.Background(), within)
				}
				m := codec.Message{Tenant: fmt.Sprint("t", g%4), Body: []byte(body)}
				if groups {
					m.Group = fmt.Sprint("g", g%4)
				}
				id, err := inst.Deliver(ctx, c, m)
				cancel()
				switch {
				case err == nil:
					if !assert.Equal(t, body, id, "a caller got another message's id") {
						return
					}
					answered.Add(1)
				case body[0] == 'c' && errors.Is(err, context.Canceled):
					cancelledMu.Lock()
					cancelled = append(cancelled, body)
					cancelledMu.Unlock()
				case body[0] == 'd' && errors.Is(err, context.DeadlineExceeded):
					expired.Add(1)
				default:
					// A caller that neither gave up nor ran out of time
					// answered with an error is another call's answer.
					assert.NoError(t, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())
	late := 0
	sentMu.Lock()
	for _, b := range cancelled {
		if sent[b] {
			late++
		}
	}
	sentMu.Unlock()
	t.Logf("answered %d, expired %d, cancelled %d (of which sent: %d)", answered.Load(), expired.Load(), len(cancelled), late)
	assert.Positive(t, answered.Load(), "callers answered")
	assert.Positive(t, expired.Load(), "callers whose deadline passed")
	assert.Positive(t, late, "cancelled callers whose message was sent and answered after they gave up")
}
