package adversary_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// Bisection holds a group's later entries back when an earlier one failed
// retryably; each held entry is answered *messages.GroupPausedError, which a
// caller tells apart with errors.As, never an unexported value.
func TestAGroupHeldInBisectionIsGroupPausedError(t *testing.T) {
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
