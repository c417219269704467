package adversary_test

// Promises of the doc comments that inputs within their contract break.

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// codec.Permanent's doc: "IsPermanent reports true for it and for anything
// that wraps it". IsPermanent looks for an *EntryError first and believes
// its flag, wherever in the chain it is: a retryable EntryError marked
// Permanent by a wrapper is answered retryable. And its doc counts an error
// that wraps ErrRefused as permanent, but one that also carries the
// destination's code in a retryable EntryError is not: a lone message the
// destination refuses is then retried forever.
func TestIsPermanentThroughWrappers(t *testing.T) {
	skipUnfixed(t, "codec.IsPermanent believes a wrapped non-permanent *EntryError over Permanent and ErrRefused")
	entry := &codec.EntryError{Code: "InvalidParameterValue", Message: "the destination's text"}
	for name, err := range map[string]error{
		"Permanent(EntryError)":         codec.Permanent(entry),
		"Permanent(wrapped EntryError)": codec.Permanent(fmt.Errorf("sqs: %w", entry)),
		"ErrRefused with EntryError":    fmt.Errorf("%w: %w", codec.ErrRefused, entry),
	} {
		assert.True(t, codec.IsPermanent(err), "%s: %q", name, err)
	}
}

// Deliver's doc: "if ctx ends first, Deliver returns ctx.Err() and m is never
// sent unless its batch already left". When it already left, Deliver
// returns while the request still reads m.Body: a caller that reuses its
// buffer once Deliver has returned (a sync.Pool, a bufio scratch slice)
// changes what is stored. Nothing says when the buffer is free again. The
// same holds when a deadline passes in flight (errExpiredInFlight) and when
// Stop's ctx ends (ErrStopped) while a request runs.
func TestBodyReusedAfterCancelIsSent(t *testing.T) {
	skipUnfixed(t, "Deliver returns on cancel while its request still reads m.Body; a reused buffer is what the destination stores")
	_, inst := testinst.Start(t, actors.Config{Name: "bodyreuse"})
	c := &heldSender{sending: make(chan struct{}), release: make(chan struct{})}
	body := []byte("original")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := inst.Deliver(ctx, c, codec.Message{Body: body})
		done <- err
	}()
	<-c.sending // the request has left with body
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	copy(body, "REUSED!!") // Deliver has returned: the caller's buffer is its own again
	close(c.release)
	c.wg.Wait()
	assert.Equal(t, "original", c.stored, "the destination stored the caller's reused buffer")
}

// heldSender's SendBatch signals sending, waits for release (ignoring its
// ctx, as a request whose bytes are already on the wire does), then stores
// the first message's body.
type heldSender struct {
	sending, release chan struct{}
	once             sync.Once
	wg               sync.WaitGroup
	stored           string
}

func (c *heldSender) Name() string             { return "held" }
func (c *heldSender) Identity() []byte         { return []byte("held") }
func (c *heldSender) Limits() codec.Limits     { return codec.Limits{MaxEntries: 10, MaxBytes: 100} }
func (c *heldSender) Tuning() codec.Tuning     { return codec.Tuning{Linger: 1} }
func (c *heldSender) Size(m codec.Message) int { return len(m.Body) }
func (c *heldSender) SendBatch(_ context.Context, b []codec.Message) ([]codec.Result, error) {
	c.wg.Add(1)
	defer c.wg.Done()
	c.once.Do(func() { close(c.sending) })
	<-c.release
	c.stored = string(b[0].Body)
	return make([]codec.Result, len(b)), nil
}
