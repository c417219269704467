package actors_test

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// valve makes a fake codec's requests wait until opened; it records which
// groups each running request holds, to catch two requests of one group in
// flight at once.
type valve struct {
	open    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	running map[string]int
	overlap atomic.Int64 // requests that found their group already in flight
	entered atomic.Int64
}

func newValve() *valve {
	return &valve{open: make(chan struct{}), running: map[string]int{}}
}

func (v *valve) Open() { v.once.Do(func() { close(v.open) }) }

// Hook is a fakecodec hook that waits for the valve.
func (v *valve) Hook(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	groups := map[string]bool{}
	for _, m := range batch {
		if m.Group != "" {
			groups[m.Group] = true
		}
	}
	v.mu.Lock()
	for g := range groups {
		if v.running[g] > 0 {
			v.overlap.Add(1)
		}
		v.running[g]++
	}
	v.mu.Unlock()
	v.entered.Add(1)
	defer func() {
		v.mu.Lock()
		for g := range groups {
			v.running[g]--
		}
		v.mu.Unlock()
	}()
	select {
	case <-v.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return make([]codec.Result, len(batch)), nil
}

func valved(id string, lim codec.Limits, t codec.Tuning) (*fakecodec.Codec, *valve) {
	c := fakecodec.New(id, lim)
	c.Tune = t
	v := newValve()
	c.Hook = v.Hook
	return c, v
}

// recorder is a telemetry.Recorder that keeps what it is told.
type recorder struct {
	mu      sync.Mutex
	flushes []telemetry.Flush
	refused []messages.FullReason
	sinks   []string
}

func (r *recorder) Sink(s string) telemetry.SinkRecorder {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sinks = append(r.sinks, s)
	return r
}

func (r *recorder) Flushed(f telemetry.Flush) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.flushes = append(r.flushes, f)
}

func (r *recorder) Refused(reason messages.FullReason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused = append(r.refused, reason)
}

func (r *recorder) Flushes() []telemetry.Flush {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]telemetry.Flush(nil), r.flushes...)
}

func (r *recorder) Refusals() []messages.FullReason {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]messages.FullReason(nil), r.refused...)
}
