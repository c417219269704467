//go:build !race

package clustered_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
)

// Every Node method that takes a ctx answers a nil one with
// actors.ErrNilContext at once and does nothing else. Leave(nil) used to
// start leaving (the member stopped admitting and yielded its grains) and
// then panic on ctx.Done(), with the member neither in the cluster's
// service nor out of it.
func TestNilContextIsRefusedByTheNode(t *testing.T) {
	ms := startTestCluster(t, 2, []string{"d"}, memberOpts{})
	var nilCtx context.Context
	for i, m := range ms {
		calls := map[string]func() error{
			"Leave": func() error { return m.node.Leave(nilCtx) },
			"Deliver": func() error {
				_, err := m.node.Deliver(nilCtx, "d", codec.Message{Body: []byte("x")})
				return err
			},
			"ResumeGroup": func() error { return m.node.ResumeGroup(nilCtx, "d", "g") },
			"PausedGroups": func() error {
				_, err := m.node.PausedGroups(nilCtx, "d")
				return err
			},
		}
		for name, call := range calls {
			var err error
			require.NotPanics(t, func() { err = call() }, "member %d: %s", i, name)
			require.ErrorIs(t, err, actors.ErrNilContext, "member %d: %s", i, name)
		}
	}
	// Nobody left: every member still delivers, and the cleanup's Leave
	// (with a real ctx) is the first and works.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, m := range ms {
		_, err := m.node.Deliver(ctx, "d", codec.Message{Body: []byte("after")})
		require.NoError(t, err, "member %d", i)
	}
}
