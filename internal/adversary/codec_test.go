package adversary_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ankusa/sinkbatch/codec"
)

// Message flags: the first byte of a body says how the codec treats it.
const (
	flagPlain        = '.'
	flagSizePanic    = 'S' // Size panics
	flagNegSize      = 'N' // Size is negative
	flagInvalid      = 'V' // Validate refuses it (permanent)
	flagValidatePanc = 'P' // Validate panics
	flagRefused      = 'R' // a request holding it is refused whole (codec.ErrRefused)
	flagEntryPerm    = 'E' // its entry fails permanently
	flagEntryRetry   = 'T' // its entry fails retryably
	flagEntryThrottl = 'H' // its entry is throttled
)

// faults are a destination's misbehaviours, as probabilities per call.
type faults struct {
	latency     time.Duration // each request takes up to this long (honouring ctx)
	panicMeta   float64       // Name, Identity, Limits, Tuning panic
	panicSend   float64       // SendBatch panics (after storing the batch, half the time)
	wrongCount  float64       // SendBatch returns one result too many or too few (after storing)
	ignoreCtx   float64       // SendBatch ignores its ctx for up to ignoreFor, then answers
	ignoreFor   time.Duration
	failWhole   float64 // the whole request fails retryably
	permWhole   float64 // the whole request fails permanently
	throttle    float64 // the whole request is throttled
	refuseWhole float64 // the whole request is refused for its content, flagged or not
}

// dest is one destination as the codec doubles see it: its limits, tuning and
// faults, and the record of what it stored. Every codec value of a dest has
// the same Name, Identity, Limits and Tuning, so they share one batcher.
type dest struct {
	r        *round
	idx      int
	name     string
	identity []byte
	lim      codec.Limits
	tune     codec.Tuning
	resolved codec.Tuning // tune with the defaults the instance applies
	validate bool
	f        faults
	values   []codec.Codec // the codec values callers pick from
	// listenCrash is when a listening caller's Listening first panicked
	// (Unix nanoseconds; 0: never): its batcher crashed then.
	listenCrash atomic.Int64

	rmu sync.Mutex
	rng *rand.Rand

	mu       sync.Mutex
	seq      int            // SendBatch calls so far
	inflight int            // SendBatch calls running
	maxIn    int            // the most that ran at once
	groups   map[string]int // SendBatch calls running per group
	stored   map[string]int // body id → position of its first store
	nStored  int
	sent     map[string]sendPos // body id → its first send
	requests int
}

// sendPos is where a message was first sent: the SendBatch call and its
// index in that batch.
type sendPos struct{ call, index int }

func (d *dest) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	d.rmu.Lock()
	defer d.rmu.Unlock()
	return d.rng.Float64() < p
}

func (d *dest) durN(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	d.rmu.Lock()
	defer d.rmu.Unlock()
	return time.Duration(d.rng.Int64N(int64(max) + 1))
}

func (d *dest) meta(method string) {
	if d.chance(d.f.panicMeta) {
		panic(fmt.Sprintf("adversary: %s panics in %s", d.name, method))
	}
}

func (d *dest) Name() string         { d.meta("Name"); return d.name }
func (d *dest) Identity() []byte     { d.meta("Identity"); return d.identity }
func (d *dest) Limits() codec.Limits { d.meta("Limits"); return d.lim }
func (d *dest) Tuning() codec.Tuning { d.meta("Tuning"); return d.tune }

// size is the message's size without side effects: the codec's checks use it.
func size(m codec.Message) int { return len(m.Body) + len(m.Group) }

// counted is the size the batcher counts for m: Size, with a negative one as
// zero.
func counted(m codec.Message) int {
	if flagOf(m) == flagNegSize {
		return 0
	}
	return size(m)
}

func (d *dest) Size(m codec.Message) int {
	switch flagOf(m) {
	case flagSizePanic:
		panic("adversary: Size panics on " + bodyID(m))
	case flagNegSize:
		return -5
	}
	return size(m)
}

func (d *dest) Validate(m codec.Message) error {
	switch flagOf(m) {
	case flagValidatePanc:
		panic("adversary: Validate panics on " + bodyID(m))
	case flagInvalid:
		return &codec.EntryError{Code: "Invalid", Message: "flagged invalid", Permanent: true}
	}
	return nil
}

func (d *dest) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	call := d.begin(ctx, batch)
	defer d.end(batch)
	if lat := d.durN(d.f.latency); lat > 0 {
		t := time.NewTimer(lat)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	if d.chance(d.f.ignoreCtx) {
		time.Sleep(d.durN(d.f.ignoreFor)) // a codec that does not watch its ctx
		if ctx.Err() != nil && d.chance(0.5) {
			return nil, ctx.Err()
		}
	}
	refused := d.chance(d.f.refuseWhole)
	for _, m := range batch {
		refused = refused || flagOf(m) == flagRefused
	}
	switch {
	case refused:
		return nil, fmt.Errorf("adversary: request %d: %w", call, codec.ErrRefused)
	case d.chance(d.f.panicSend):
		if d.chance(0.5) {
			d.store(batch, nil)
		}
		panic(fmt.Sprintf("adversary: SendBatch panics in request %d", call))
	case d.chance(d.f.wrongCount):
		d.store(batch, nil)
		n := len(batch) + 1
		if d.chance(0.5) {
			n = len(batch) - 1
		}
		return make([]codec.Result, n), nil
	case d.chance(d.f.failWhole):
		return nil, &codec.EntryError{Code: "Unavailable", Message: "whole request"}
	case d.chance(d.f.permWhole):
		return nil, &codec.EntryError{Code: "Forbidden", Message: "whole request", Permanent: true}
	case d.chance(d.f.throttle):
		return nil, fmt.Errorf("adversary: %w", codec.ErrThrottled)
	}
	res := make([]codec.Result, len(batch))
	for i, m := range batch {
		switch flagOf(m) {
		case flagEntryPerm:
			res[i].Err = &codec.EntryError{Code: "Poison", Permanent: true}
		case flagEntryRetry:
			res[i].Err = &codec.EntryError{Code: "Busy"}
		case flagEntryThrottl:
			res[i].Err = &codec.EntryError{Code: "Throttled", Throttled: true}
		default:
			res[i].ID = "id:" + bodyID(m)
		}
	}
	d.store(batch, res)
	return res, nil
}

// begin checks a request against the bounds the batcher promises and notes
// where each message was first sent. It returns the call's number.
func (d *dest) begin(ctx context.Context, batch []codec.Message) int {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	call := d.seq
	d.seq++
	d.requests++
	d.inflight++
	d.maxIn = max(d.maxIn, d.inflight)
	r := d.r
	if d.inflight > d.resolved.MaxInflight {
		r.violate("bound-inflight", "%s: %d requests in flight, MaxInflight %d", d.name, d.inflight, d.resolved.MaxInflight)
	}
	if len(batch) == 0 {
		r.violate("bound-entries", "%s: an empty request", d.name)
	}
	if len(batch) > d.resolved.MaxEntries {
		r.violate("bound-entries", "%s: %d entries, MaxEntries %d", d.name, len(batch), d.resolved.MaxEntries)
	}
	bytes := 0
	for _, m := range batch {
		bytes += counted(m)
	}
	if bytes > d.resolved.MaxBytes {
		r.violate("bound-bytes", "%s: %d bytes, MaxBytes %d", d.name, bytes, d.resolved.MaxBytes)
	}
	// After Stop returns, no request starts; one whose goroutine began
	// before may still, but with its ctx cancelled when Stop's ctx ended.
	if ret := r.stopReturned.Load(); ret != 0 && now.UnixNano() > ret && (ctx.Err() == nil || r.stopErr == nil) {
		r.violate("sent-after-stop", "%s: request %d started %v after Stop returned %v, its ctx not cancelled (%v)", d.name, call, time.Duration(now.UnixNano()-ret), r.stopErr, ctx.Err())
	}
	seen := map[string]bool{}
	for i, m := range batch {
		if d.lim.OneGroupPerRequest && m.Group != batch[0].Group {
			r.violate("bound-onegroup", "%s: groups %q and %q in one request", d.name, batch[0].Group, m.Group)
		}
		if m.Group != "" && !seen[m.Group] {
			seen[m.Group] = true
			d.groups[m.Group]++
			if d.groups[m.Group] > 1 {
				r.violate("group-overlap", "%s: two requests of group %q in flight", d.name, m.Group)
			}
		}
		d.checkTrace(m)
		id := bodyID(m)
		if _, ok := d.sent[id]; ok {
			// A bisected request sends its halves again: that is one send.
			continue
		}
		d.sent[id] = sendPos{call: call, index: i}
		if c := r.callByBody(id); c != nil {
			c.checkSend(now)
		}
	}
	return call
}

func (d *dest) end(batch []codec.Message) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.inflight--
	seen := map[string]bool{}
	for _, m := range batch {
		if m.Group != "" && !seen[m.Group] {
			seen[m.Group] = true
			if d.groups[m.Group]--; d.groups[m.Group] == 0 {
				delete(d.groups, m.Group)
			}
		}
	}
}

// store records the messages the destination stored: those of res with no
// error, or all of batch when res is nil.
func (d *dest) store(batch []codec.Message, res []codec.Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, m := range batch {
		if res != nil && res[i].Err != nil {
			continue
		}
		id := bodyID(m)
		if _, ok := d.stored[id]; ok {
			d.r.violate("stored-twice", "%s: message %s stored twice (sent again after a stored request)", d.name, id)
			continue
		}
		d.stored[id] = d.nStored
		d.nStored++
	}
}

// storedAt is the position of id's first store, if it was stored.
func (d *dest) storedAt(id string) (int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.stored[id]
	return p, ok
}

func (d *dest) sentAt(id string) (sendPos, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.sent[id]
	return p, ok
}

func flagOf(m codec.Message) byte {
	if len(m.Body) == 0 {
		return flagPlain
	}
	return m.Body[0]
}

// bodyID is the message's id: the body between its flag and the first ':'.
func bodyID(m codec.Message) string {
	if len(m.Body) < 2 {
		return ""
	}
	s := string(m.Body[1:])
	if i := strings.IndexByte(s, ':'); i >= 0 {
		s = s[:i]
	}
	return s
}

// The codec values: pointers and values, with and without Validate. All of
// a dest's values are one destination.
type (
	ptrCodec      struct{ d *dest }
	ptrValidating struct{ d *dest }
	valCodec      struct{ d *dest }
	valValidating struct{ d *dest }
)

func (c *ptrCodec) Name() string         { return c.d.Name() }
func (c *ptrCodec) Identity() []byte     { return c.d.Identity() }
func (c *ptrCodec) Limits() codec.Limits { return c.d.Limits() }
func (c *ptrCodec) Tuning() codec.Tuning { return c.d.Tuning() }
func (c *ptrCodec) Size(m codec.Message) int {
	return c.d.Size(m)
}
func (c *ptrCodec) SendBatch(ctx context.Context, b []codec.Message) ([]codec.Result, error) {
	return c.d.SendBatch(ctx, b)
}

func (c *ptrValidating) Name() string         { return c.d.Name() }
func (c *ptrValidating) Identity() []byte     { return c.d.Identity() }
func (c *ptrValidating) Limits() codec.Limits { return c.d.Limits() }
func (c *ptrValidating) Tuning() codec.Tuning { return c.d.Tuning() }
func (c *ptrValidating) Size(m codec.Message) int {
	return c.d.Size(m)
}
func (c *ptrValidating) Validate(m codec.Message) error { return c.d.Validate(m) }
func (c *ptrValidating) SendBatch(ctx context.Context, b []codec.Message) ([]codec.Result, error) {
	return c.d.SendBatch(ctx, b)
}

func (c valCodec) Name() string             { return c.d.Name() }
func (c valCodec) Identity() []byte         { return c.d.Identity() }
func (c valCodec) Limits() codec.Limits     { return c.d.Limits() }
func (c valCodec) Tuning() codec.Tuning     { return c.d.Tuning() }
func (c valCodec) Size(m codec.Message) int { return c.d.Size(m) }
func (c valCodec) SendBatch(ctx context.Context, b []codec.Message) ([]codec.Result, error) {
	return c.d.SendBatch(ctx, b)
}

func (c valValidating) Name() string                   { return c.d.Name() }
func (c valValidating) Identity() []byte               { return c.d.Identity() }
func (c valValidating) Limits() codec.Limits           { return c.d.Limits() }
func (c valValidating) Tuning() codec.Tuning           { return c.d.Tuning() }
func (c valValidating) Size(m codec.Message) int       { return c.d.Size(m) }
func (c valValidating) Validate(m codec.Message) error { return c.d.Validate(m) }
func (c valValidating) SendBatch(ctx context.Context, b []codec.Message) ([]codec.Result, error) {
	return c.d.SendBatch(ctx, b)
}

// newValues makes nPtr pointer values and, if withValues, a value codec of d.
func (d *dest) newValues(nPtr int, withValues bool) {
	for range nPtr {
		if d.validate {
			d.values = append(d.values, &ptrValidating{d: d})
		} else {
			d.values = append(d.values, &ptrCodec{d: d})
		}
	}
	if withValues {
		if d.validate {
			d.values = append(d.values, valValidating{d: d})
		} else {
			d.values = append(d.values, valCodec{d: d})
		}
	}
}
