// Package fakecodec is an in-memory codec.Codec for tests, benchmarks and the
// minimal demo: it stores what it is sent and answers as its hooks say. It is
// a test double for the batching rules, not a destination.
package fakecodec

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ankusa/sinkbatch/codec"
)

// Codec records every request and answers each message with an id, unless
// a hook says otherwise. Set the fields before the first delivery.
type Codec struct {
	Kind string // Name(); default "fake"
	ID   string // part of Identity()
	Lim  codec.Limits
	Tune codec.Tuning
	// Latency is how long each request takes (honouring ctx).
	Latency time.Duration
	// Jitter, if set, spreads each request's time uniformly over
	// Latency ± Jitter, as a network's round trips spread.
	Jitter time.Duration
	// Hook, if set, answers a request instead of the default success. It
	// runs on the request goroutine.
	Hook func(ctx context.Context, batch []codec.Message) ([]codec.Result, error)
	// SizeHook, if set, replaces Size.
	SizeHook func(m codec.Message) int
	// Discard keeps no record of accepted messages (for benchmarks).
	Discard bool

	seq      atomic.Uint64
	requests atomic.Int64
	inflight atomic.Int64
	maxIn    atomic.Int64
	busy     atomic.Int64 // nanoseconds spent inside SendBatch, summed

	mu    sync.Mutex
	sent  []codec.Message // accepted messages, in acceptance order
	sizes []int           // entries per request
}

// New returns a codec with the given limits.
func New(id string, lim codec.Limits) *Codec { return &Codec{ID: id, Lim: lim} }

func (c *Codec) Name() string {
	if c.Kind == "" {
		return "fake"
	}
	return c.Kind
}
func (c *Codec) Identity() []byte     { return []byte(c.ID) }
func (c *Codec) Limits() codec.Limits { return c.Lim }
func (c *Codec) Tuning() codec.Tuning { return c.Tune }

func (c *Codec) Size(m codec.Message) int {
	if c.SizeHook != nil {
		return c.SizeHook(m)
	}
	return len(m.Body)
}

func (c *Codec) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	start := time.Now()
	n := c.inflight.Add(1)
	for {
		old := c.maxIn.Load()
		if n <= old || c.maxIn.CompareAndSwap(old, n) {
			break
		}
	}
	defer func() {
		c.inflight.Add(-1)
		c.busy.Add(int64(time.Since(start)))
	}()
	c.requests.Add(1)
	if d := c.latency(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	var res []codec.Result
	if c.Hook != nil {
		var err error
		if res, err = c.Hook(ctx, batch); err != nil {
			return res, err
		}
	} else {
		res = make([]codec.Result, len(batch))
	}
	for i := range res {
		if res[i].Err == nil && res[i].ID == "" {
			res[i].ID = "m" + strconv.FormatUint(c.seq.Add(1), 10)
		}
	}
	if c.Discard {
		return res, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sizes = append(c.sizes, len(batch))
	for i := range res {
		if i < len(batch) && res[i].Err == nil {
			c.sent = append(c.sent, batch[i])
		}
	}
	return res, nil
}

func (c *Codec) latency() time.Duration {
	if c.Jitter <= 0 {
		return c.Latency
	}
	return c.Latency - c.Jitter + rand.N(2*c.Jitter+1)
}

// Sent returns the accepted messages in acceptance order.
func (c *Codec) Sent() []codec.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]codec.Message(nil), c.sent...)
}

// BatchSizes returns the number of messages in each successful request.
func (c *Codec) BatchSizes() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.sizes...)
}

// Requests is the number of SendBatch calls so far.
func (c *Codec) Requests() int64 { return c.requests.Load() }

// MaxInflight is the most SendBatch calls that ran at once.
func (c *Codec) MaxInflight() int64 { return c.maxIn.Load() }

// Busy is the time spent inside SendBatch, summed over calls.
func (c *Codec) Busy() time.Duration { return time.Duration(c.busy.Load()) }

// String names the codec in test output.
func (c *Codec) String() string { return fmt.Sprintf("fake(%s)", c.ID) }
