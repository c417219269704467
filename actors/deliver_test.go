package actors_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

func TestEveryCallerGetsItsOwnResult(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "own"})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		res := make([]codec.Result, len(batch))
		for i, m := range batch {
			res[i].ID = "id-" + string(m.Body)
		}
		return res, nil
	}
	var wg sync.WaitGroup
	for i := range 500 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			body := fmt.Sprint(i)
			id, err := inst.Deliver(ctx, c, codec.Message{Tenant: fmt.Sprint(i % 7), Body: []byte(body)})
			assert.NoError(t, err)
			assert.Equal(t, "id-"+body, id)
		}()
	}
	wg.Wait()
	require.Len(t, c.Sent(), 500)
	for _, n := range c.BatchSizes() {
		assert.LessOrEqual(t, n, 10)
	}
	assert.Less(t, c.Requests(), int64(500), "deliveries were batched")
}

func TestDeliverResultCarriesTheSequenceNumber(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "seq"})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune.Linger = time.Millisecond
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		res := make([]codec.Result, len(batch))
		for i, m := range batch {
			res[i] = codec.Result{ID: "id-" + string(m.Body), Sequence: "seq-" + string(m.Body)}
			if string(m.Body) == "bad" {
				res[i] = codec.Result{Err: &codec.EntryError{Code: "InvalidMessageContents", Permanent: true}}
			}
		}
		return res, nil
	}
	r, err := inst.DeliverResult(context.Background(), c, codec.Message{Group: "g", Body: []byte("7")})
	require.NoError(t, err)
	assert.Equal(t, codec.Result{ID: "id-7", Sequence: "seq-7"}, r)
	r, err = inst.DeliverResult(context.Background(), c, codec.Message{Group: "g", Body: []byte("bad")})
	assert.True(t, codec.IsPermanent(err))
	assert.Equal(t, codec.Result{}, r)
}
