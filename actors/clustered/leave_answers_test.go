//go:build !race

package clustered_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// A member that leaves gracefully has answered everything it admitted,
// and its answers reach their callers before its word that it left: the
// callers' member then takes whatever still waits for the leaver as never
// admitted, and sends it again. Here the leaver owns the destinations of
// many deliveries from another member, holds them all in its requests,
// and answers them all at once as it leaves, with answers large enough
// that they cross the wire in many messages. Every caller must get its
// own answer: none ErrUnreachable (the leaver taken for gone before its
// answers or its word arrived), and no message sent twice (an answered
// delivery taken for never admitted and sent again to the next owner).
func TestALeavingOwnersAnswersReachItsCallersBeforeItsWord(t *testing.T) {
	agent := test.NewInMemAgent()
	opts := func(codecFor func(string) codec.Codec) memberOpts {
		return memberOpts{noCleanup: true, wire: 64 << 10, codec: codecFor, provider: test.NewTestProvider(agent,
			test.WithTestProviderServiceTtl(time.Second), test.WithTestProviderRefreshTtl(100*time.Millisecond))}
	}
	// 32 names, so that the leaver owns some (of 8, none in 1 run of 256);
	// at most 6 of them are used.
	pool := names(32)
	release := make(chan struct{})
	var held atomic.Int64
	// The leaver's requests wait for release, then succeed with ids of
	// 2 KB: a few answers fill a message to the callers' member.
	leaverCodec := func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
			held.Add(int64(len(batch)))
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			res := make([]codec.Result, len(batch))
			for i, m := range batch {
				res[i].ID = string(m.Body) + strings.Repeat("x", 2<<10)
			}
			return res, nil
		}
		return c
	}
	stays := startMember(t, pool, opts(nil))
	leaver := startMember(t, pool, opts(leaverCodec))
	ms := []*member{stays, leaver}
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
		leaveAll(t, ms)
	})
	waitMembers(t, ms, 2)
	var dests []string
	for _, d := range pool {
		if owner, _ := ownerOf(t, ms, d); owner == leaver {
			dests = append(dests, d)
		}
	}
	require.NotEmpty(t, dests)
	dests = dests[:min(len(dests), 6)]

	const perDest = 60
	total := perDest * len(dests)
	type outcome struct {
		body string
		id   string
		err  error
	}
	outcomes := make(chan outcome, total)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, d := range dests {
		for i := range perDest {
			body := fmt.Sprintf("%s-%d", d, i)
			go func() {
				id, err := stays.node.Deliver(ctx, d, codec.Message{Body: []byte(body)})
				outcomes <- outcome{body, id, err}
			}()
		}
	}
	// Every delivery is admitted by the leaver: in a request, or queued
	// behind one.
	require.Eventually(t, func() bool {
		return int(held.Load())+leaver.inst.Stats().Queued == total
	}, 10*time.Second, time.Millisecond, "the leaver admitted %d of %d", held.Load(), total)

	left := make(chan error, 1)
	go func() { left <- leaver.node.Leave(ctx) }()
	close(release)

	var failed, again []string
	for range total {
		o := <-outcomes
		switch {
		case o.err != nil:
			failed = append(failed, fmt.Sprintf("%s: %v", o.body, o.err))
		case !strings.HasPrefix(o.id, o.body):
			// Not the leaver's id: the message was sent again elsewhere.
			again = append(again, o.body)
		}
	}
	require.NoError(t, <-left)
	leaver.gone = true
	require.NoError(t, leaver.inst.Stop(ctx))
	if !assert.Zero(t, len(failed), "callers (of %d) answered an error", total) {
		t.Logf("first: %s", failed[0])
	}
	assert.Zero(t, len(again), "callers (of %d) answered by the next owner: their messages were sent again", total)

	sent := map[string]int{}
	for _, m := range ms {
		for _, d := range dests {
			for _, msg := range m.fake(d).Sent() {
				sent[string(msg.Body)]++
			}
		}
	}
	var twice []string
	for body, n := range sent {
		if n > 1 {
			twice = append(twice, body)
		}
	}
	assert.Len(t, sent, total)
	assert.Zero(t, len(twice), "messages (of %d) sent twice", total)
}
