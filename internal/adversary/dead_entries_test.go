package adversary_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// A Deliver caller that gives up while its delivery is still in the
// batcher's mailbox leaves a dead entry, admitted without asking whether its
// caller still waits; its cancel was counted before the batcher's last sweep,
// so the next refusal does not sweep again. The dead entry must not hold its
// room for long: with TenantMax 1, F of the same tenant is not refused
// FullTenant while the only entry of its tenant belongs to a caller that is
// gone.
func TestAnEntryDeadOnArrivalHoldsNoRoom(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{Name: "deadonarrival"})
	c := &gatedValidator{release: make(chan struct{}), validating: make(chan struct{})}
	deliver := func(tenant, body string, deadline time.Time) *actor.Future {
		return system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Tenant: tenant, Body: []byte(body)}, Deadline: deadline}, answerWithin)
	}
	hour := time.Now().Add(time.Hour)
	deliver("t", "P", hour) // queued: tenant t is full
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, answerWithin, time.Millisecond)
	deliver("a", "A", hour) // the batcher waits in Validate(A) until released
	<-c.validating
	z := deliver("t", "Z", hour) // refused when the batcher goes on: it sweeps then
	// X's delivery is in the mailbox behind Z; its caller gives up at once.
	_, err := inst.Deliver(&cancelInSelect{Context: context.Background(), ch: make(chan struct{})}, c, codec.Message{Tenant: "u", Body: []byte("X")})
	require.ErrorIs(t, err, context.Canceled)
	f := deliver("u", "F", time.Now().Add(500*time.Millisecond))
	close(c.release)

	res, err := z.Result()
	require.NoError(t, err)
	var ra *messages.RetryAfterError
	require.ErrorAs(t, res.(*messages.Delivered).Err, &ra, "Z finds tenant t full")
	res, err = f.Result()
	require.NoError(t, err)
	assert.False(t, errorsAs(res.(*messages.Delivered).Err, &ra), "F is refused (%v) while the only entry of its tenant is X's, whose caller is gone", res.(*messages.Delivered).Err)
}

// gatedValidator is a codec whose Validate of the body "A" waits until
// release is closed, holding the batcher's Receive; it lingers an hour.
type gatedValidator struct {
	release    chan struct{}
	validating chan struct{}
	once       sync.Once
}

func (c *gatedValidator) Name() string     { return "gated" }
func (c *gatedValidator) Identity() []byte { return []byte("gated") }
func (c *gatedValidator) Limits() codec.Limits {
	return codec.Limits{MaxEntries: 10, MaxBytes: 100}
}
func (c *gatedValidator) Tuning() codec.Tuning {
	return codec.Tuning{Linger: time.Hour, TenantMax: 1}
}
func (c *gatedValidator) Size(m codec.Message) int { return len(m.Body) }
func (c *gatedValidator) Validate(m codec.Message) error {
	if string(m.Body) == "A" {
		c.once.Do(func() { close(c.validating) })
		<-c.release
	}
	return nil
}
func (c *gatedValidator) SendBatch(_ context.Context, b []codec.Message) ([]codec.Result, error) {
	return make([]codec.Result, len(b)), nil
}

// cancelInSelect is a ctx that is cancelled the moment Deliver waits on it:
// after Deliver has sent its delivery, before any answer can come.
type cancelInSelect struct {
	context.Context
	ch   chan struct{}
	once sync.Once
	done atomic.Bool
}

func (c *cancelInSelect) Done() <-chan struct{} {
	c.once.Do(func() { c.done.Store(true); close(c.ch) })
	return c.ch
}

func (c *cancelInSelect) Err() error {
	if c.done.Load() {
		return context.Canceled
	}
	return nil
}
