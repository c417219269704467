package sqs_test

import (
	"fmt"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

// writeErrors counts requests net/http failed to write.
type writeErrors struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (w *writeErrors) RoundTrip(r *http.Request) (*http.Response, error) {
	trace := &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err != nil {
			w.n.Add(1)
		}
	}}
	return w.next.RoundTrip(r.WithContext(httptrace.WithClientTrace(r.Context(), trace)))
}

// TestNoConnectionClosedUnderAnswer: under concurrent requests, net/http
// never fails to write a SendMessageBatch request because the SDK closed its
// body early (aws-sdk-go-v2 issue 2737): no connection is closed under an
// answer, so no stored batch is sent twice.
func TestNoConnectionClosedUnderAnswer(t *testing.T) {
	e := newKumo(t)
	q := e.createQueue(t, false, false)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	counter := &writeErrors{next: tr}
	c := e.codec(t, q, codec.Tuning{}, func(cfg *sqs.Config) {
		cfg.AWS.HTTPClient = &http.Client{Transport: counter}
		cfg.AWS.RetryMaxAttempts = 1 // a closed connection would fail the call
	})

	const workers, requests = 8, 25
	run := runName(t)
	var wg sync.WaitGroup
	errs := make(chan error, workers*requests)
	for w := range workers {
		wg.Go(func() {
			for r := range requests {
				// Small requests: one buffer holds all of it, and the
				// answer can come before net/http's last read.
				batch := batchOf(fmt.Sprintf("%s-w%d-r%d", run, w, r), 0, sqs.MaxEntries, 1)
				res, err := c.SendBatch(ctx(t), batch)
				if err != nil {
					errs <- err
					continue
				}
				for _, r := range res {
					if r.Err != nil {
						errs <- r.Err
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.Zero(t, counter.n.Load(), "requests net/http failed to write")
	require.Len(t, e.readBack(t, q, workers*requests*sqs.MaxEntries), workers*requests*sqs.MaxEntries)
}
