//go:build !race

package clustered_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// The node keeps the destinations New was given: a caller who changes its
// map afterwards (drops a name, adds one, swaps a codec, as a config reload
// might) changes nothing the node does, on the member that made the call
// or on the owner. Before, the node read the caller's map on every
// delivery and on every grain's start: a dropped name was refused as
// unknown, a swapped codec took the owner's next grain's deliveries to
// another destination (another queue, other credentials), and a write to
// the map racing a delivery could crash the process (Go's concurrent map
// access check).
func TestDestinationsAreTheNodesOwnAfterNew(t *testing.T) {
	names := []string{"kept", "swapped", "dropped"}
	ms := startTestCluster(t, 2, names, memberOpts{})
	other := fakecodec.New("other", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	for _, m := range ms {
		delete(m.dests, "dropped")
		m.dests["swapped"] = other
		m.dests["added"] = other
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, m := range ms {
		for _, name := range names {
			_, err := m.node.Deliver(ctx, name, codec.Message{Body: []byte(name)})
			require.NoError(t, err, "%q from member %d", name, i)
		}
		_, err := m.node.Deliver(ctx, "added", codec.Message{Body: []byte("added")})
		assert.ErrorIs(t, err, clustered.ErrUnknownDestination, "a name added to the map after New, from member %d", i)
	}
	for _, name := range names {
		sent := 0
		for _, m := range ms {
			for _, s := range m.fake(name).Sent() {
				assert.Equal(t, name, string(s.Body))
				sent++
			}
		}
		assert.Equal(t, len(ms), sent, "%q: one message from each member, through the codec New was given", name)
	}
	assert.Empty(t, other.Sent(), "a codec put in the map after New sent messages")
}

// A typed nil codec (a nil *sqs.Codec in an interface) is refused by New,
// as an untyped nil is; before, New took it and every delivery to its name
// was refused later, on whichever member owned it.
func TestTypedNilCodecIsRefusedByNew(t *testing.T) {
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	inst, err := actors.Start(system, actors.Config{Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, inst.Stop(context.Background())) })
	ok := fakecodec.New("ok", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	_, err = clustered.New(system, clustered.Config{Instance: inst, Destinations: clustered.Destinations{
		"ok":    ok,
		"typed": (*fakecodec.Codec)(nil),
	}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"typed" has a nil codec`)
}

// New refuses a destination whose codec's Limits or Tuning no batcher
// accepts, and one whose codec panics when asked for them, naming the
// destination: every member would otherwise start, and each delivery to it
// be refused, permanently, on whichever member owns it.
func TestBadCodecIsRefusedByNew(t *testing.T) {
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	inst, err := actors.Start(system, actors.Config{Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, inst.Stop(context.Background())) })
	ok := fakecodec.New("ok", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	tooMany := fakecodec.New("many", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	tooMany.Tune = codec.Tuning{MaxEntries: 11}
	noRoom := fakecodec.New("none", codec.Limits{MaxEntries: 0, MaxBytes: 1 << 20})
	panicky := panickyLimits{fakecodec.New("panicky", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})}
	for name, c := range map[string]codec.Codec{"too-many": tooMany, "no-room": noRoom, "panicky": panicky} {
		_, err = clustered.New(system, clustered.Config{Instance: inst, Destinations: clustered.Destinations{"ok": ok, name: c}})
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), `"`+name+`"`, name)
		assert.NotContains(t, err.Error(), "taken", "%s: refused for another reason", name)
		assert.True(t, codec.IsPermanent(err) || name == "panicky", "%s: %v", name, err)
	}
}

// panickyLimits is a codec whose Limits panics.
type panickyLimits struct{ *fakecodec.Codec }

func (panickyLimits) Limits() codec.Limits { panic("panickyLimits: Limits") }
