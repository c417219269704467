package actors_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// Every Instance method that takes a ctx answers a nil one with
// ErrNilContext at once, and does nothing else: Stop(nil) used to start the
// stop and then panic on ctx.Done(), leaving an instance that refused every
// delivery and a stop that no later Stop could finish.
func TestNilContextIsRefusedEverywhere(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "nilctx"})
	c := flakyStrictCodec("nilctx", 0)
	var nilCtx context.Context
	calls := map[string]func() error{
		"Stop": func() error { return inst.Stop(nilCtx) },
		"Deliver": func() error {
			_, err := inst.Deliver(nilCtx, c, codec.Message{Body: []byte("x")})
			return err
		},
		"DeliverResult": func() error {
			_, err := inst.DeliverResult(nilCtx, c, codec.Message{Body: []byte("x")})
			return err
		},
		"ResumeGroup": func() error { return inst.ResumeGroup(nilCtx, c, "g") },
		"PausedGroups": func() error {
			_, err := inst.PausedGroups(nilCtx, c)
			return err
		},
		"TakePausedGroups": func() error {
			_, err := inst.TakePausedGroups(nilCtx, c)
			return err
		},
		"AdoptPausedGroups": func() error {
			return inst.AdoptPausedGroups(nilCtx, c, []messages.PausedGroup{{Group: "g", Key: "k", Left: time.Minute}})
		},
	}
	for name, call := range calls {
		var err error
		require.NotPanics(t, func() { err = call() }, name)
		require.ErrorIs(t, err, actors.ErrNilContext, name)
	}
	// Nothing was stopped, adopted or half-done: the instance still
	// delivers, no group is paused, and a real Stop (the cleanup's) drains.
	id, err := deliverWithin(inst, c, "g", "k2", "ok")
	require.NoError(t, err)
	require.NotEmpty(t, id)
	paused, err := inst.PausedGroups(context.Background(), c)
	require.NoError(t, err)
	require.Empty(t, paused)
}
