package actors_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// flakyStrictCodec is a StrictGroups destination that fails bodies starting
// "fail" retryably and answers the others with ids made of their bodies;
// pauseMax 0 is the default GroupPauseMax.
func flakyStrictCodec(name string, pauseMax time.Duration) *fakecodec.Codec {
	c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Millisecond, StrictGroups: true, GroupPauseMax: pauseMax}
	c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		res, _ := echoIDs(ctx, batch)
		for i, m := range batch {
			if strings.HasPrefix(string(m.Body), "fail") {
				res[i] = codec.Result{Err: &codec.EntryError{Code: "Flaky"}}
			}
		}
		return res, nil
	}
	return c
}

// deliverWithin delivers body to group with key (body when key is "": a
// StrictGroups destination needs one).
func deliverWithin(inst *actors.Instance, c codec.Codec, group, key, body string) (string, error) {
	if key == "" {
		key = body
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return inst.Deliver(ctx, c, codec.Message{Tenant: "t", Group: group, IdempotencyKey: key, Body: []byte(body)})
}

// Instance.TakePausedGroups and AdoptPausedGroups move StrictGroups pauses
// from one instance to another, as cluster mode's hand-off does: the
// giver's pauses are gone (its next delivery of the group is admitted),
// and the taker, which has no batcher for the destination yet, answers the
// group's next delivery GroupPausedError naming the failed message's key
// until that message's retry, which resumes it. Groups that were not
// paused are not held, and the time a pause has left travels with it.
func TestPausesMoveBetweenInstances(t *testing.T) {
	_, giver := start(t, actors.Config{Name: "adopt-give"})
	_, taker := start(t, actors.Config{Name: "adopt-take"})
	const pauseMax = time.Minute
	c := flakyStrictCodec("adopt-move", pauseMax)
	bg := context.Background()
	for _, g := range []string{"a", "b"} {
		_, err := deliverWithin(giver, c, g, "k-"+g, "fail-"+g)
		var ee *codec.EntryError
		require.ErrorAs(t, err, &ee)
	}
	paused, err := giver.PausedGroups(bg, c)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, paused)

	taken, err := giver.TakePausedGroups(bg, c)
	require.NoError(t, err)
	require.Len(t, taken, 2)
	for i, g := range []string{"a", "b"} {
		assert.Equal(t, g, taken[i].Group)
		assert.Equal(t, "k-"+g, taken[i].Key)
		assert.True(t, taken[i].Left > pauseMax-10*time.Second && taken[i].Left <= pauseMax, "left %v", taken[i].Left)
	}
	paused, err = giver.PausedGroups(bg, c)
	require.NoError(t, err)
	assert.Empty(t, paused, "the giver kept pauses it handed over")
	_, err = deliverWithin(giver, c, "a", "", "giver-after")
	require.NoError(t, err, "the giver still held a group it handed over")

	require.NoError(t, taker.AdoptPausedGroups(bg, c, taken))
	// At once: the pause is in place before a delivery made after Adopt
	// returned, although the taker's batcher had yet to start.
	_, err = deliverWithin(taker, c, "a", "k-other", "held")
	var gp *messages.GroupPausedError
	require.ErrorAs(t, err, &gp)
	assert.Equal(t, "a", gp.Group)
	assert.Equal(t, "k-a", gp.Key)
	_, err = deliverWithin(taker, c, "free", "", "not-paused")
	require.NoError(t, err)
	paused, err = taker.PausedGroups(bg, c)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, paused)
	id, err := deliverWithin(taker, c, "a", "k-a", "retry-a")
	require.NoError(t, err, "the failed message's retry is admitted first")
	assert.Equal(t, "id-retry-a", id)
	_, err = deliverWithin(taker, c, "a", "", "next-a")
	require.ErrorAs(t, err, &gp, "the group waits for the held message's retry too")
	assert.Equal(t, "k-other", gp.Key)
	_, err = deliverWithin(taker, c, "a", "k-other", "held")
	require.NoError(t, err, "the held message's retry resumes the group")
	_, err = deliverWithin(taker, c, "a", "", "next-a")
	require.NoError(t, err)
	require.NoError(t, taker.ResumeGroup(bg, c, "b"))
	_, err = deliverWithin(taker, c, "b", "", "next-b")
	require.NoError(t, err)
}

// AdoptPausedGroups at the edges: a pause with no time left is not adopted,
// one longer than the taker's GroupPauseMax is cut to it (the group resumes
// on its own then), a group paused on the taker already keeps its own key,
// nothing to adopt is no error, and bad input is refused at once.
func TestAdoptPausedGroupsAtTheEdges(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "adopt-edges"})
	const pauseMax = 300 * time.Millisecond
	c := flakyStrictCodec("adopt-edges", pauseMax)
	bg := context.Background()
	_, err := deliverWithin(inst, c, "own", "k-own", "fail-own")
	require.Error(t, err)
	require.NoError(t, inst.AdoptPausedGroups(bg, c, []messages.PausedGroup{
		{Group: "spent", Key: "k1", Left: 0},
		{Group: "negative", Key: "k2", Left: -time.Second},
		{Group: "long", Key: "k3", Left: time.Hour},
		{Group: "own", Key: "k-theirs", Left: time.Hour},
	}))
	for _, bad := range []messages.PausedGroup{
		{Group: "", Key: "k4", Left: time.Hour},
		{Group: "nokey", Key: "", Left: time.Hour},
		{Group: "emptythen", Key: "k5", Then: []string{"k6", ""}, Left: time.Hour},
	} {
		err := inst.AdoptPausedGroups(bg, c, []messages.PausedGroup{{Group: "fine", Key: "k7", Left: time.Hour}, bad})
		require.Error(t, err, "%+v", bad)
		assert.True(t, codec.IsPermanent(err))
	}
	paused, err := inst.PausedGroups(bg, c)
	require.NoError(t, err)
	assert.Equal(t, []string{"long", "own"}, paused)
	_, err = deliverWithin(inst, c, "own", "", "held")
	var gp *messages.GroupPausedError
	require.ErrorAs(t, err, &gp)
	assert.Equal(t, "k-own", gp.Key, "an adopted pause replaced the taker's own")
	require.Eventually(t, func() bool {
		_, err := deliverWithin(inst, c, "long", "", "after-max")
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "a pause adopted with an hour left did not end at GroupPauseMax")

	require.NoError(t, inst.AdoptPausedGroups(bg, c, nil))
	//nolint:staticcheck // a nil ctx is the bad input under test
	assert.ErrorIs(t, inst.AdoptPausedGroups(nil, c, nil), actors.ErrNilContext)
	assert.ErrorIs(t, inst.AdoptPausedGroups(bg, nil, nil), messages.ErrNilCodec)
	_, err = inst.TakePausedGroups(bg, (*fakecodec.Codec)(nil))
	assert.ErrorIs(t, err, messages.ErrNilCodec)
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	assert.ErrorIs(t, inst.AdoptPausedGroups(cancelled, c, []messages.PausedGroup{{Group: "x", Left: time.Hour}}), context.Canceled)
}

// A pause adopted while deliveries of its group race in from other
// goroutines: each delivery made after AdoptPausedGroups returned is held,
// and none is lost or answered twice, while the destination's batcher
// starts, restarts under a crashing listener and stops idle around it.
func TestAdoptPausedGroupsRacingDeliveries(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "adopt-race"})
	bg := context.Background()
	for round := range 30 {
		c := flakyStrictCodec(fmt.Sprint("adopt-race-", round), time.Minute)
		c.Tune.IdleTimeout = time.Millisecond
		var wg sync.WaitGroup
		var adopted sync.WaitGroup
		adopted.Add(1)
		held, early := 0, 0
		var mu sync.Mutex
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := deliverWithin(inst, c, "g", "", fmt.Sprint("before-", i))
				mu.Lock()
				if err == nil {
					early++
				}
				mu.Unlock()
			}()
			wg.Add(1)
			go func() {
				defer wg.Done()
				adopted.Wait()
				_, err := deliverWithin(inst, c, "g", "", fmt.Sprint("after-", i))
				var gp *messages.GroupPausedError
				mu.Lock()
				defer mu.Unlock()
				if assert.ErrorAs(t, err, &gp, "round %d: a delivery made after the adoption returned", round) {
					held++
				}
			}()
		}
		require.NoError(t, inst.AdoptPausedGroups(bg, c, []messages.PausedGroup{{Group: "g", Key: "k", Left: time.Minute}}))
		adopted.Done()
		wg.Wait()
		assert.Equal(t, 8, held, "round %d", round)
		for _, m := range c.Sent() {
			assert.True(t, strings.HasPrefix(string(m.Body), "before-"), "round %d: %q was sent while its group was paused", round, m.Body)
		}
	}
}

// AdoptPausedGroups racing Stop, for destinations whose batchers have yet
// to start (the adoption waits in the route, with deliveries): every call
// returns well before its ctx ends, with nil (the batcher took the pauses)
// or messages.ErrStopped, every delivery is answered, and nothing panics.
// Before, a route that answered what it held took every held message for a
// delivery: an adoption held there made the router panic.
func TestAdoptPausedGroupsRacingStop(t *testing.T) {
	for round := range 150 {
		// Stop races the deliveries, whose late answers are dead letters:
		// protoactor's dead-letter throttle then runs a goroutine for its
		// interval, which goleak would find if this were the last test.
		system := actor.NewActorSystem(actor.WithDeadLetterThrottleInterval(time.Millisecond),
			actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
		inst, err := actors.Start(system, actors.Config{Name: fmt.Sprint("adopt-stop", round)})
		require.NoError(t, err)
		var wg sync.WaitGroup
		for i := range 6 {
			c := flakyStrictCodec(fmt.Sprintf("adopt-stop-%d-%d", round, i), time.Minute)
			wg.Add(2)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				start := time.Now()
				err := inst.AdoptPausedGroups(ctx, c, []messages.PausedGroup{{Group: "g", Key: "k", Left: time.Minute}})
				if err != nil {
					assert.ErrorIs(t, err, messages.ErrStopped, "round %d", round)
				}
				assert.Less(t, time.Since(start), 10*time.Second, "round %d: an adoption waited for its ctx", round)
			}()
			go func() {
				defer wg.Done()
				_, err := deliverWithin(inst, c, "g", "", "x")
				if err != nil {
					var gp *messages.GroupPausedError
					if !errors.As(err, &gp) {
						assert.ErrorIs(t, err, messages.ErrStopped, "round %d", round)
					}
				}
			}()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		require.NoError(t, inst.Stop(ctx), "round %d", round)
		cancel()
		wg.Wait()
		system.Shutdown()
	}
}

// AdoptPausedGroups whose ctx ends while the destination's batcher is busy
// (its actor is inside the codec's Size for a slow message) returns the
// ctx's error, and the pauses still reach the batcher before the next
// delivery: the group is held. A ctx that ended before the call adopts
// nothing.
func TestAdoptPausedGroupsGivingUpStillPauses(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "adopt-giveup"})
	c := flakyStrictCodec("adopt-giveup", time.Minute)
	entered, slow := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c.SizeHook = func(m codec.Message) int {
		if string(m.Body) == "slow" {
			once.Do(func() { close(entered) })
			<-slow
		}
		return len(m.Body)
	}
	bg := context.Background()
	_, err := deliverWithin(inst, c, "warm", "", "warm")
	require.NoError(t, err)
	busy := make(chan error, 1)
	go func() { _, err := deliverWithin(inst, c, "other", "", "slow"); busy <- err }()
	<-entered // the batcher's actor is inside Size now
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	err = inst.AdoptPausedGroups(ctx, c, []messages.PausedGroup{{Group: "g", Key: "k", Left: time.Minute}})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	close(slow)
	require.NoError(t, <-busy)
	_, err = deliverWithin(inst, c, "g", "", "after-giving-up")
	var gp *messages.GroupPausedError
	require.ErrorAs(t, err, &gp, "the adoption that gave up waiting did not pause the group")
	assert.Equal(t, "k", gp.Key)

	done, cancelDone := context.WithCancel(bg)
	cancelDone()
	assert.ErrorIs(t, inst.AdoptPausedGroups(done, c, []messages.PausedGroup{{Group: "h", Key: "k", Left: time.Minute}}), context.Canceled)
	_, err = deliverWithin(inst, c, "h", "", "not-adopted")
	require.NoError(t, err, "a ctx that had ended adopted")
}
