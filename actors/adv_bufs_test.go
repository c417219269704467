package actors_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// refusing is a well-behaved codec's SendBatch (it keeps nothing after it
// returns) that refuses a request holding a "bad" body for its content, so
// that the batcher bisects it, and fails one "flaky" body retryably per
// request. It checks that its batch does not change while it runs, and
// counts the bodies it accepted.
type refusing struct {
	mu       sync.Mutex
	accepted map[string]int
	changed  []string
}

func (r *refusing) hook(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	before := make([]string, len(batch))
	bad := false
	for i, m := range batch {
		before[i] = string(m.Body)
		bad = bad || strings.HasPrefix(before[i], "bad")
	}
	// A round trip, during which the destination's other requests end and
	// start, taking buffers.
	t := time.NewTimer(time.Duration(rand.IntN(500)) * time.Microsecond)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range batch {
		if string(m.Body) != before[i] {
			r.changed = append(r.changed, before[i]+" became "+string(m.Body))
		}
	}
	if bad && len(batch) > 1 {
		return nil, fmt.Errorf("refusing: %w", codec.ErrRefused)
	}
	res := make([]codec.Result, len(batch))
	for i, b := range before {
		switch {
		case strings.HasPrefix(b, "bad"):
			res[i].Err = &codec.EntryError{Code: "Bad", Permanent: true}
		case strings.HasPrefix(b, "flaky"):
			res[i].Err = &codec.EntryError{Code: "Flaky"}
		default:
			res[i].ID = "id-" + b
			r.accepted[b]++
		}
	}
	return res, nil
}

// Request goroutines of one destination hand their message and result
// buffers on (Params.bufs) while other requests of it run, bisect and
// fail: every caller still gets its own message's answer (an id made of
// its body, or its own entry's error), each accepted body is accepted once,
// and no batch changes while its codec holds it.
func TestAdvReusedBuffersCarryEachCallersOwnResult(t *testing.T) {
	const (
		dests   = 3
		callers = 60
		each    = 15
	)
	_, inst := start(t, actors.Config{Name: "advbufs", SinkConcurrency: 8})
	r := &refusing{accepted: map[string]int{}}
	codecs := make([]*fakecodec.Codec, dests)
	for i := range codecs {
		c := fakecodec.New(fmt.Sprint("bufs", i), codec.Limits{MaxEntries: 1 + 3*i, MaxBytes: 1 << 20})
		c.Tune = codec.Tuning{Linger: time.Millisecond}
		c.Hook = r.hook
		c.Discard = true
		codecs[i] = c
	}
	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				body := fmt.Sprintf("g%d-%d", g, i)
				switch rand.IntN(6) {
				case 0:
					body = "bad" + body
				case 1:
					body = "flaky" + body
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				id, err := inst.Deliver(ctx, codecs[rand.IntN(dests)], codec.Message{Tenant: fmt.Sprint("t", g%4), Body: []byte(body)})
				cancel()
				switch {
				case strings.HasPrefix(body, "bad"):
					assert.True(t, codec.IsPermanent(err), "%s: %v", body, err)
					assert.ErrorContains(t, err, "Bad")
				case strings.HasPrefix(body, "flaky"):
					if assert.Error(t, err, body) {
						assert.False(t, codec.IsPermanent(err), "%s: %v", body, err)
					}
				default:
					if assert.NoError(t, err, body) {
						assert.Equal(t, "id-"+body, id, "an answer carries its own message's result")
					}
				}
			}
		}()
	}
	wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	assert.Empty(t, r.changed, "a batch changed while its request ran")
	for b, n := range r.accepted {
		assert.Equal(t, 1, n, "body %s accepted %d times", b, n)
	}
}
