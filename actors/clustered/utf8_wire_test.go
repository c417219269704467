//go:build !race

package clustered_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// TestStringsThatAreNotUTF8CrossTheWire attacks the wire with what
// protobuf refuses to write: strings that are not UTF-8. A local instance
// hands a message's tenant, group, key and attributes to the codec as they
// are, and a codec's ids and error texts to the caller; so must a cluster.
// When protobuf wrote the batches, one such message made the endpoint
// writer drop its whole batch (and one such answer every answer written
// with it): each of those callers waited out its deadline for
// ErrUnreachable.
func TestStringsThatAreNotUTF8CrossTheWire(t *testing.T) {
	bad := string([]byte{0xff, 0xfe, 'x'})
	ms := startTestCluster(t, 2, []string{"dest"}, memberOpts{codec: func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.Latency, c.Discard = 2*time.Millisecond, true
		c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
			res := make([]codec.Result, len(batch))
			for i, m := range batch {
				if m.Tenant == "refuse" {
					res[i].Err = codec.Permanent(errors.New("refused " + bad + string(m.Body)))
					continue
				}
				res[i].ID = fmt.Sprintf("%s|%s|%s|%s|%s", m.Group, m.IdempotencyKey, m.Attributes[bad], m.Tenant, m.Body)
			}
			return res, nil
		}
		return c
	}})
	_, other := ownerOf(t, ms, "dest")

	// Many callers at once, so that their deliveries share batches both ways.
	const callers = 60
	var wg sync.WaitGroup
	errs := make(chan string, callers)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			body := fmt.Sprint(c)
			m := codec.Message{Body: []byte(body)}
			want := fmt.Sprintf("||||%s", body)
			switch c % 3 {
			case 1:
				m.Group, m.IdempotencyKey, m.Attributes, m.Tenant = bad, bad, map[string]string{bad: bad}, bad
				want = fmt.Sprintf("%s|%s|%s|%s|%s", bad, bad, bad, bad, body)
			case 2:
				m.Tenant = "refuse"
			}
			id, err := other.node.Deliver(ctx, "dest", m)
			switch {
			case c%3 == 2 && err != nil && codec.IsPermanent(err) && err.Error() == "refused "+bad+body:
			case c%3 != 2 && err == nil && id == want:
			default:
				errs <- fmt.Sprintf("caller %d: id %q, err %v", c, id, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var wrong []string
	for e := range errs {
		wrong = append(wrong, e)
	}
	require.Empty(t, wrong, "callers not answered with their own result")
}
