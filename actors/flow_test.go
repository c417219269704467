package actors_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

var flowLimits = codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20}

// deliverBg delivers m and sends its error on the returned channel.
func deliverBg(ctx context.Context, inst *actors.Instance, c codec.Codec, m codec.Message) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := inst.Deliver(ctx, c, m)
		ch <- err
	}()
	return ch
}

func blockingCodec(id string) (*fakecodec.Codec, *valve) {
	return valved(id, flowLimits, codec.Tuning{WhenFull: codec.Block, QueueMax: 2, MaxEntries: 1, MaxInflight: 1, Linger: time.Millisecond})
}

// With WhenFull Block, a delivery that does not fit waits for room instead
// of being refused, Stats counts it, and it is sent once room frees.
func TestBlockWaitsForRoomInsteadOfRefusing(t *testing.T) {
	rec := &recorder{}
	_, inst := start(t, actors.Config{Recorder: rec})
	c, v := blockingCodec("block")
	ctx := context.Background()
	first := deliverBg(ctx, inst, c, codec.Message{Body: []byte("0")})
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	var rest []<-chan error
	for _, b := range []string{"1", "2", "3", "4"} {
		rest = append(rest, deliverBg(ctx, inst, c, codec.Message{Body: []byte(b)}))
	}
	require.Eventually(t, func() bool { return inst.Stats().Waiting == 2 }, 5*time.Second, time.Millisecond, "two queued, two wait")
	assert.Equal(t, 2, inst.Stats().Queued)
	v.Open()
	require.NoError(t, <-first)
	for _, ch := range rest {
		require.NoError(t, <-ch)
	}
	assert.Empty(t, rec.Refusals(), "nothing refused")
	assert.Len(t, c.Sent(), 5)
	// Stats are published after the callers are answered.
	require.Eventually(t, func() bool { return inst.Stats().Waiting == 0 }, 5*time.Second, time.Millisecond, "no waiter left")
}

// A waiter whose deadline passes is answered with an error wrapping
// context.DeadlineExceeded and is never sent; past QueueMax waiters a
// delivery is refused as with Refuse.
func TestBlockWaiterDeadlineAndBound(t *testing.T) {
	rec := &recorder{}
	_, inst := start(t, actors.Config{Recorder: rec})
	c, v := blockingCodec("block-deadline")
	ctx := context.Background()
	first := deliverBg(ctx, inst, c, codec.Message{Body: []byte("0")})
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	queued := []<-chan error{deliverBg(ctx, inst, c, codec.Message{Body: []byte("1")}), deliverBg(ctx, inst, c, codec.Message{Body: []byte("2")})}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 2 }, 5*time.Second, time.Millisecond)
	long := deliverBg(ctx, inst, c, codec.Message{Body: []byte("long")})
	require.Eventually(t, func() bool { return inst.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond)
	// The batcher answers a waiter at its deadline (the Deliver's ctx
	// deadline travels as the Deliver's Deadline).
	dl, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := inst.Deliver(dl, c, codec.Message{Tenant: "other", Body: []byte("late")})
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	require.Eventually(t, func() bool { return inst.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond, "the batcher dropped the late waiter")
	short := deliverBg(ctx, inst, c, codec.Message{Body: []byte("short")})
	require.Eventually(t, func() bool { return inst.Stats().Waiting == 2 }, 5*time.Second, time.Millisecond)
	_, err = inst.Deliver(ctx, c, codec.Message{Body: []byte("over")})
	var ra *messages.RetryAfterError
	require.ErrorAs(t, err, &ra, "QueueMax deliveries wait: refused")
	v.Open()
	for _, ch := range append(queued, first, long, short) {
		require.NoError(t, <-ch)
	}
	for _, m := range c.Sent() {
		assert.NotEqual(t, "late", string(m.Body), "a waiter that expired is never sent")
		assert.NotEqual(t, "over", string(m.Body))
	}
	assert.Equal(t, []messages.FullReason{messages.FullEntries}, rec.Refusals())
}

// Stop answers waiting deliveries ErrStopped at once and sends what is
// queued.
func TestStopAnswersWaitersErrStopped(t *testing.T) {
	_, inst := start(t, actors.Config{})
	c, v := blockingCodec("block-stop")
	ctx := context.Background()
	first := deliverBg(ctx, inst, c, codec.Message{Body: []byte("0")})
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	queued := []<-chan error{deliverBg(ctx, inst, c, codec.Message{Body: []byte("1")}), deliverBg(ctx, inst, c, codec.Message{Body: []byte("2")})}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 2 }, 5*time.Second, time.Millisecond)
	waiter := deliverBg(ctx, inst, c, codec.Message{Body: []byte("3")})
	require.Eventually(t, func() bool { return inst.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond)
	stopped := make(chan error, 1)
	go func() { stopped <- inst.Stop(ctx) }()
	assert.ErrorIs(t, <-waiter, messages.ErrStopped)
	v.Open()
	require.NoError(t, <-stopped)
	require.NoError(t, <-first)
	for _, ch := range queued {
		require.NoError(t, <-ch)
	}
}

// failOnce fails the first request of each group with a retryable entry
// error and answers the rest.
func failOnce() func(context.Context, []codec.Message) ([]codec.Result, error) {
	var n atomic.Int64
	return func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		res := make([]codec.Result, len(batch))
		if n.Add(1) == 1 {
			for i := range res {
				res[i].Err = &codec.EntryError{Code: "InternalError"}
			}
		}
		return res, nil
	}
}

// A retryable failure pauses the group: PausedGroups lists it, its next
// delivery is answered GroupPausedError naming the failed message's key,
// and ResumeGroup resumes it. A destination with no batcher has nothing
// paused, and asking starts none.
func TestResumeGroupAndPausedGroups(t *testing.T) {
	_, inst := start(t, actors.Config{})
	c := fakecodec.New("strict", flowLimits)
	c.Tune = codec.Tuning{StrictGroups: true}
	c.Hook = failOnce()
	ctx := context.Background()

	other := fakecodec.New("strict-idle", flowLimits)
	paused, err := inst.PausedGroups(ctx, other)
	require.NoError(t, err)
	assert.Empty(t, paused)
	require.NoError(t, inst.ResumeGroup(ctx, other, "g"))
	assert.Zero(t, inst.Stats().Batchers, "asking starts no batcher")

	_, err = inst.Deliver(ctx, c, codec.Message{Group: "g", IdempotencyKey: "k1", Body: []byte("1")})
	require.Error(t, err)
	assert.False(t, codec.IsPermanent(err))
	paused, err = inst.PausedGroups(ctx, c)
	require.NoError(t, err)
	assert.Equal(t, []string{"g"}, paused)

	_, err = inst.Deliver(ctx, c, codec.Message{Group: "g", IdempotencyKey: "k2", Body: []byte("2")})
	var gp *messages.GroupPausedError
	require.ErrorAs(t, err, &gp)
	assert.Equal(t, "g", gp.Group)
	assert.Equal(t, "k1", gp.Key)
	assert.Positive(t, gp.After, "a suggested wait")
	_, err = inst.Deliver(ctx, c, codec.Message{Group: "h", IdempotencyKey: "h", Body: []byte("h")})
	require.NoError(t, err, "other groups go on")

	require.NoError(t, inst.ResumeGroup(ctx, c, "g"))
	paused, err = inst.PausedGroups(ctx, c)
	require.NoError(t, err)
	assert.Empty(t, paused)
	_, err = inst.Deliver(ctx, c, codec.Message{Group: "g", IdempotencyKey: "k2", Body: []byte("2")})
	require.NoError(t, err)

	_, err = inst.PausedGroups(nil, c) //nolint:staticcheck // the nil ctx is the point
	assert.ErrorIs(t, err, actors.ErrNilContext)
	assert.ErrorIs(t, inst.ResumeGroup(ctx, nil, "g"), messages.ErrNilCodec)
}

// The retry of the failed message (same IdempotencyKey) resumes its group
// and goes first; a permanent failure pauses nothing.
func TestStrictRetryResumesAndPermanentDoesNotPause(t *testing.T) {
	_, inst := start(t, actors.Config{})
	c := fakecodec.New("strict-retry", flowLimits)
	c.Tune = codec.Tuning{StrictGroups: true}
	var n atomic.Int64
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		res := make([]codec.Result, len(batch))
		switch n.Add(1) {
		case 1:
			res[0].Err = &codec.EntryError{Code: "InternalError"}
		case 3:
			res[0].Err = &codec.EntryError{Code: "InvalidMessageContents", Permanent: true}
		}
		return res, nil
	}
	ctx := context.Background()
	_, err := inst.Deliver(ctx, c, codec.Message{Group: "g", IdempotencyKey: "k1", Body: []byte("1")})
	require.Error(t, err)
	_, err = inst.Deliver(ctx, c, codec.Message{Group: "g", IdempotencyKey: "k1", Body: []byte("1")})
	require.NoError(t, err, "the retry resumes the group")
	_, err = inst.Deliver(ctx, c, codec.Message{Group: "g", IdempotencyKey: "k2", Body: []byte("2")})
	require.True(t, codec.IsPermanent(err))
	_, err = inst.Deliver(ctx, c, codec.Message{Group: "g", IdempotencyKey: "k3", Body: []byte("3")})
	require.NoError(t, err, "a permanent failure does not pause")
	var bodies []string
	for _, m := range c.Sent() {
		bodies = append(bodies, string(m.Body))
	}
	assert.Equal(t, []string{"1", "3"}, bodies)
}

// An adaptive destination reports its in-flight limit on the gauge
// ankusa.sink_batch.inflight.limit, labelled with the instance, the sink
// and the destination's keyed digest; the series goes when the batcher
// stops.
func TestAdaptiveLimitGauge(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	_, inst := start(t, actors.Config{Name: "adaptive", MeterProvider: mp})
	c := fakecodec.New("adaptive", flowLimits)
	c.Tune = codec.Tuning{Adaptive: true, MaxInflight: 4, MaxEntries: 1, Linger: time.Millisecond, IdleTimeout: 50 * time.Millisecond}
	ctx := context.Background()
	for i := range 20 {
		_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte{byte('a' + i)}})
		require.NoError(t, err)
	}
	limits := func() map[attribute.Distinct]int64 {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(ctx, &rm))
		out := map[attribute.Distinct]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != telemetry.MetricInflightLimit {
					continue
				}
				for _, p := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					out[p.Attributes.Equivalent()] = p.Value
					inst, _ := p.Attributes.Value(telemetry.AttrInstance)
					sink, _ := p.Attributes.Value(telemetry.AttrSink)
					dest, _ := p.Attributes.Value(telemetry.AttrDestination)
					assert.Equal(t, "adaptive", inst.AsString())
					assert.Equal(t, "fake", sink.AsString())
					assert.Regexp(t, `^fake-[0-9a-f]{24}$`, dest.AsString())
				}
			}
		}
		return out
	}
	got := limits()
	require.Len(t, got, 1)
	for _, v := range got {
		assert.GreaterOrEqual(t, v, int64(1))
		assert.LessOrEqual(t, v, int64(4))
	}
	require.Eventually(t, func() bool { return inst.Stats().Batchers == 0 }, 5*time.Second, 5*time.Millisecond)
	assert.Empty(t, limits(), "a stopped batcher's series is gone")
}

// A batcher with a paused group does not stop idle (it would forget the
// pause): a destination started after it, with the same IdleTimeout, stops
// first; once the group resumes it stops too. Stop does not wait for a
// pause.
func TestPausedGroupKeepsTheBatcherButNotStop(t *testing.T) {
	_, inst := start(t, actors.Config{})
	c := fakecodec.New("strict-idle", flowLimits)
	c.Tune = codec.Tuning{StrictGroups: true, IdleTimeout: 20 * time.Millisecond, GroupPauseMax: time.Hour}
	c.Hook = failOnce()
	ctx := context.Background()
	_, err := inst.Deliver(ctx, c, codec.Message{Group: "g", IdempotencyKey: "k1", Body: []byte("1")})
	require.Error(t, err)
	control := fakecodec.New("control", flowLimits)
	control.Tune = codec.Tuning{IdleTimeout: 20 * time.Millisecond}
	_, err = inst.Deliver(ctx, control, codec.Message{Body: []byte("c")})
	require.NoError(t, err)
	require.Equal(t, 2, inst.Stats().Batchers)
	require.Eventually(t, func() bool { return inst.Stats().Batchers == 1 }, 5*time.Second, time.Millisecond, "the control stops idle")
	paused, err := inst.PausedGroups(ctx, c)
	require.NoError(t, err)
	assert.Equal(t, []string{"g"}, paused, "the paused destination's batcher still runs")
	require.NoError(t, inst.ResumeGroup(ctx, c, "g"))
	require.Eventually(t, func() bool { return inst.Stats().Batchers == 0 }, 5*time.Second, time.Millisecond)

	_, err = inst.Deliver(ctx, c, codec.Message{Group: "h", IdempotencyKey: "h1", Body: []byte("h")})
	require.NoError(t, err, "failOnce failed its one request already")
	c2 := fakecodec.New("strict-stop", flowLimits)
	c2.Tune = codec.Tuning{StrictGroups: true, GroupPauseMax: time.Hour}
	c2.Hook = failOnce()
	_, err = inst.Deliver(ctx, c2, codec.Message{Group: "g", IdempotencyKey: "k1", Body: []byte("1")})
	require.Error(t, err)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, inst.Stop(stopCtx), "Stop drains without waiting for the pause")
}
