//go:build !race

package clustered_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
)

// A service that starts delivering as soon as New returns, before its
// member has started or attached (its goroutines race its own start-up),
// has those deliveries wait for the topology and then go through, each
// once, within their deadlines: none is lost, refused or answered
// ErrUnreachable because the member was not ready yet.
func TestDeliveriesBeforeAttachWaitForIt(t *testing.T) {
	system, n, c := unattached(t)
	const callers = 20
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, errs[i] = n.Deliver(ctx, "d", codec.Message{Body: []byte(fmt.Sprint(i))})
		}()
	}
	time.Sleep(200 * time.Millisecond) // the callers are waiting now
	cl := testCluster(system, n.Kind())
	cl.StartMember()
	require.NoError(t, n.Attach(cl))
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "caller %d", i)
	}
	sent := map[string]int{}
	for _, m := range c.Sent() {
		sent[string(m.Body)]++
	}
	assert.Len(t, sent, callers, "each delivery sent")
	for body, k := range sent {
		assert.Equal(t, 1, k, "%s sent %d times", body, k)
	}
}
