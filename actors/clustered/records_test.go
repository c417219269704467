//go:build !race

package clustered_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// TestRecycledRecordsAnswerTheirOwnCaller attacks the owner's pooled
// records (an admitted delivery's record serves another once the batcher
// lets go of it): round after round, callers on every member deliver
// messages that succeed, fail permanently, or expire before they are sent,
// and every answer must be the caller's own. A record recycled while its
// answer or its entry was still in use would hand one caller another's id,
// or another's error.
func TestRecycledRecordsAnswerTheirOwnCaller(t *testing.T) {
	errBad := codec.Permanent(errors.New("refused by the test"))
	ms := startTestCluster(t, 3, []string{"dest"}, memberOpts{codec: func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.Latency, c.Jitter, c.Discard = time.Millisecond, time.Millisecond, true
		c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
			res := make([]codec.Result, len(batch))
			for i, m := range batch {
				if strings.HasPrefix(string(m.Body), "bad") {
					res[i].Err = errBad
				} else {
					res[i].ID = "id:" + string(m.Body)
				}
			}
			return res, nil
		}
		return c
	}})
	// A refusal crosses the wire as a permanent error of the same text.
	refused := func(err error) bool { return codec.IsPermanent(err) && strings.Contains(err.Error(), errBad.Error()) }
	const rounds, callers, each = 4, 150, 20
	var ok, bad, expired, wrong atomic.Int64
	var firstWrong atomic.Value
	for r := range rounds {
		var wg sync.WaitGroup
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				node := ms[c%len(ms)].node
				for i := range each {
					body := fmt.Sprintf("%d-%d-%d", r, c, i)
					timeout := 10 * time.Second
					switch i % 5 {
					case 1:
						body = "bad" + body
					case 3:
						timeout = time.Duration(1+c%3) * time.Millisecond
					}
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					id, err := node.Deliver(ctx, "dest", codec.Message{Body: []byte(body)})
					cancel()
					switch {
					case err == nil && id == "id:"+body:
						ok.Add(1)
					case err != nil && refused(err) && strings.HasPrefix(body, "bad"):
						bad.Add(1)
					case err != nil && i%5 == 3 && !refused(err):
						expired.Add(1) // a deadline error, of whatever kind
					default:
						wrong.Add(1)
						firstWrong.CompareAndSwap(nil, fmt.Sprintf("body %q: id %q, err %v", body, id, err))
					}
				}
			}()
		}
		wg.Wait()
	}
	t.Logf("own id: %d, own refusal: %d, expired: %d, wrong: %d", ok.Load(), bad.Load(), expired.Load(), wrong.Load())
	require.Zero(t, wrong.Load(), "a caller got an answer that is not its own: %v", firstWrong.Load())
	assert.Greater(t, ok.Load(), int64(rounds*callers*each/2), "most deliveries succeed")
	assert.Greater(t, bad.Load(), int64(rounds*callers*each/10), "every permanent refusal reaches its caller")
}
