package adversary_test

// Focused reproductions of what TestAdversary found, one promise each,
// through the public API.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// answerWithin is a bound a loaded machine cannot miss for an answer that
// needs no request: it tells an answer from a wait for a deadline.
const answerWithin = 5 * time.Second

// A codec whose Limits.MaxBytes is above the default QueueMaxBytes (128 MiB),
// with QueueMaxBytes left zero, passes Tuning.Check; a message larger than
// the default queue bound but within MaxBytes can then never be queued, and
// its caller is told to retry it forever.
func TestDefaultQueueMaxBytesBelowMaxBytes(t *testing.T) {
	_, inst := testinst.Start(t, actors.Config{Name: "bigbytes"})
	c := fakecodec.New("big", codec.Limits{MaxEntries: 10, MaxBytes: 256 << 20})
	c.SizeHook = func(codec.Message) int { return 200 << 20 } // the codec's own count
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
		_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte("x")})
		cancel()
		var ra *messages.RetryAfterError
		require.Falsef(t, errorsAs(err, &ra), "a message within MaxBytes that no empty queue can take is answered %v: retried forever", err)
	}
}

// A Name, Identity, Limits or Tuning that panics while the destination is
// resolved is answered with an error that wraps neither codec.ErrCodecPanic
// nor anything codec.IsPermanent knows: a caller cannot branch on it.
func TestMetaPanicIsClassified(t *testing.T) {
	for _, method := range []string{"Name", "Identity", "Limits", "Tuning"} {
		t.Run(method, func(t *testing.T) {
			_, inst := testinst.Start(t, actors.Config{Name: "meta" + method})
			d := &metaPanicker{method: method}
			ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
			defer cancel()
			_, err := inst.Deliver(ctx, d, codec.Message{Body: []byte("x")})
			require.Error(t, err)
			assert.ErrorIs(t, err, codec.ErrCodecPanic, "%q", err)
			assert.True(t, codec.IsPermanent(err), "%q is retryable: a codec that always panics is retried forever", err)
		})
	}
}

// metaPanicker is a pointer codec that panics in one of its describing
// methods, every time.
type metaPanicker struct{ method string }

func (c *metaPanicker) boom(m string) {
	if c.method == m {
		panic("adversary: " + m + " panics")
	}
}
func (c *metaPanicker) Name() string     { c.boom("Name"); return "meta" }
func (c *metaPanicker) Identity() []byte { c.boom("Identity"); return []byte("meta") }
func (c *metaPanicker) Limits() codec.Limits {
	c.boom("Limits")
	return codec.Limits{MaxEntries: 1, MaxBytes: 100}
}
func (c *metaPanicker) Tuning() codec.Tuning { c.boom("Tuning"); return codec.Tuning{} }
func (c *metaPanicker) Size(m codec.Message) int {
	return len(m.Body)
}
func (c *metaPanicker) SendBatch(context.Context, []codec.Message) ([]codec.Result, error) {
	return nil, fmt.Errorf("adversary: never sent")
}

// A Tuning that Tuning.Check refuses answers every delivery with an error
// that names the field, but that error is not permanent: a caller that
// follows the error table retries a delivery that can never succeed.
func TestRefusedTuningIsPermanent(t *testing.T) {
	_, inst := testinst.Start(t, actors.Config{Name: "badtuning"})
	c := fakecodec.New("bad", codec.Limits{MaxEntries: 10, MaxBytes: 1000})
	c.Tune = codec.Tuning{MaxBytes: 1000, QueueMaxBytes: 500}
	ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
	defer cancel()
	_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte("x")})
	require.ErrorContains(t, err, "Tuning.QueueMaxBytes")
	assert.True(t, codec.IsPermanent(err), "%q is retryable", err)
}

// Issue #10 item 9 (confirmed before a9d997b): a Name that panics when the
// supervisor spawns the batcher (its second call; the first, when the
// destination was resolved, passed) crashed the supervisor actor, and the
// delivery it held was never answered.
func TestNamePanicInSpawn(t *testing.T) {
	_, inst := testinst.Start(t, actors.Config{Name: "namespawn"})
	c := &nameOnce{}
	ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
	defer cancel()
	_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte("x")})
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "the delivery was held and never answered: %v", err)
}

// nameOnce is a codec whose Name panics after its first call.
type nameOnce struct{ calls atomic.Int64 }

func (c *nameOnce) Name() string {
	if c.calls.Add(1) > 1 {
		panic("adversary: Name panics after its first call")
	}
	return "nameonce"
}
func (c *nameOnce) Identity() []byte         { return []byte("nameonce") }
func (c *nameOnce) Limits() codec.Limits     { return codec.Limits{MaxEntries: 1, MaxBytes: 100} }
func (c *nameOnce) Tuning() codec.Tuning     { return codec.Tuning{} }
func (c *nameOnce) Size(m codec.Message) int { return len(m.Body) }
func (c *nameOnce) SendBatch(_ context.Context, b []codec.Message) ([]codec.Result, error) {
	return make([]codec.Result, len(b)), nil
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// A nil *messages.Deliver sent to the instance's PID panics on the sender's
// goroutine (the PID's process runs there): a caller actor crashes, a plain
// goroutine takes the process down. Bad input should get a clear error.
func TestNilDeliverPointer(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{Name: "nildeliver"})
	var res any
	var err error
	require.NotPanics(t, func() {
		res, err = system.Root.RequestFuture(inst.PID(), (*messages.Deliver)(nil), answerWithin).Result()
	})
	require.NoError(t, err, "no answer")
	d, ok := res.(*messages.Delivered)
	require.True(t, ok, "%T", res)
	assert.Error(t, d.Err)
}

// A messages.Deliver sent by value (a slip of a missing &) is logged and
// dropped: its sender waits for an answer that never comes.
func TestDeliverByValueIsAnswered(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{Name: "byvalue"})
	c := fakecodec.New("byvalue", codec.Limits{MaxEntries: 1, MaxBytes: 100})
	res, err := system.Root.RequestFuture(inst.PID(), messages.Deliver{Codec: c, Message: codec.Message{Body: []byte("x")}}, answerWithin).Result()
	require.NoError(t, err, "no answer within %v", answerWithin)
	d, ok := res.(*messages.Delivered)
	require.True(t, ok, "%T", res)
	assert.Error(t, d.Err)
}

// messages.ErrNilCodec answers "a nil interface, or a typed nil pointer";
// a typed nil pointer codec is answered with its Name's panic instead
// ("sinkbatch: codec *T panicked: runtime error: invalid memory address"),
// which is neither ErrNilCodec nor permanent.
func TestTypedNilCodec(t *testing.T) {
	_, inst := testinst.Start(t, actors.Config{Name: "typednil"})
	ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
	defer cancel()
	_, err := inst.Deliver(ctx, (*fakecodec.Codec)(nil), codec.Message{Body: []byte("x")})
	assert.ErrorIs(t, err, messages.ErrNilCodec)
}

// A Deliver caller that gives up while its delivery is still in the
// batcher's mailbox leaves a dead entry: the batcher admits it without
// asking whether its caller still waits (for a Deliver caller, one atomic
// load). Its cancel was counted before the batcher's last sweep, so the next
// refusal does not sweep again, and the dead entry holds its room until the
// next periodic sweep (at most 10ms since a9d997b; before it, until the
// entry's deadline). Here TenantMax is 1: F is refused with FullTenant while
// the only entry of its tenant belongs to a caller that is gone.
func TestDeadOnArrivalHoldsRoom(t *testing.T) {
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

// Since a9d997b, bisection holds a group's later entries back when an
// earlier one failed retryably, and answers them with an unexported
// errors.New value: a caller cannot tell it with errors.Is or errors.As, and
// it is in no error table. messages.GroupPausedError says exactly this ("an
// earlier message of the group failed ... The message was never sent.
// Retryable"); any exported value would do.
func TestGroupHeldIsExported(t *testing.T) {
	_, inst := testinst.Start(t, actors.Config{Name: "groupheld"})
	c := fakecodec.New("held", codec.Limits{MaxEntries: 2, MaxBytes: 100})
	c.Tune = codec.Tuning{Linger: time.Hour}
	c.Hook = func(_ context.Context, b []codec.Message) ([]codec.Result, error) {
		if len(b) > 1 {
			return nil, fmt.Errorf("adversary: %w", codec.ErrRefused)
		}
		res := make([]codec.Result, 1)
		if string(b[0].Body) == "a" {
			res[0].Err = &codec.EntryError{Code: "Busy"} // retryable
		}
		return res, nil
	}
	errs := make(chan error, 2)
	deliver := func(body string) {
		ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
		defer cancel()
		_, err := inst.Deliver(ctx, c, codec.Message{Group: "g", Body: []byte(body)})
		errs <- err
	}
	go deliver("a")
	// a is queued before b: the batch is [a, b].
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, answerWithin, time.Millisecond)
	go deliver("b")
	var held error
	for range 2 {
		if err := <-errs; err != nil && !errorsAs(err, new(*codec.EntryError)) {
			held = err
		}
	}
	require.Error(t, held, "b is held back, not sent")
	var gp *messages.GroupPausedError
	assert.True(t, errorsAs(held, &gp), "%q (%T) cannot be told apart with errors.Is or errors.As", held, held)
}
