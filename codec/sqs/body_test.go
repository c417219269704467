package sqs_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

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

// The codec hands the SDK each Body as a string view of its bytes
// (bodyString, unsafe.String), not a copy. Bodies that share memory are
// read, never written: one slice delivered by many callers at once (in one
// batch and in batches sent side by side), overlapping windows of one
// buffer, a slice whose capacity runs past its length into another
// caller's window, multi-byte text cut at rune boundaries. Each caller's
// message is stored as exactly its own bytes (SQS's MD5 of each body checks
// it on the way, kumo's read back after), and an empty or nil Body is
// refused at admission, permanently, and never sent.
func TestSharedBodiesAreSentAsTheirOwnBytes(t *testing.T) {
	e := newKumo(t)
	q := e.createQueue(t, false, false)
	c := e.codec(t, q, codec.Tuning{Linger: 2 * time.Millisecond})
	inst := startInstance(t)

	buf := []byte(strings.Repeat("0123456789abcdef€ü", 40))
	shared := buf[:100]
	var bodies [][]byte
	for range 12 {
		bodies = append(bodies, shared) // the very same slice
	}
	for i := 0; i+40 <= len(buf); i += 17 {
		w := buf[i : i+40]  // overlapping windows, capacity to the end of buf
		if !utf8.Valid(w) { // cut inside a rune: SQS would refuse it

			continue
		}
		bodies = append(bodies, w)
	}
	type got struct {
		id   string
		body string
		err  error
	}
	out := make([]got, len(bodies))
	var wg sync.WaitGroup
	for i, b := range bodies {
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			id, err := inst.Deliver(dctx, c, codec.Message{Tenant: fmt.Sprint("t", i%3), Body: b})
			out[i] = got{id: id, body: string(b), err: err}
		})
	}
	for _, empty := range [][]byte{nil, {}, buf[5:5]} {
		dctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := inst.Deliver(dctx, c, codec.Message{Tenant: "t", Body: empty})
		cancel()
		var ee *codec.EntryError
		require.ErrorAs(t, err, &ee, "an empty body (%#v)", empty)
		assert.Equal(t, sqs.CodeEmptyBody, ee.Code)
		assert.True(t, codec.IsPermanent(err))
	}
	wg.Wait()
	want := map[string]string{}
	for i, g := range out {
		require.NoError(t, g.err, "delivery %d", i)
		want[g.id] = g.body
	}
	require.Len(t, want, len(bodies), "one id per delivery")
	stored := e.readBack(t, q, len(bodies))
	require.Len(t, stored, len(bodies), "nothing more was stored (the empty bodies were not sent)")
	for _, m := range stored {
		body, ok := want[m.ID]
		if assert.True(t, ok, "stored message %s was not acknowledged", m.ID) {
			assert.Equal(t, body, string(m.Body), "message %s is stored as its own bytes", m.ID)
		}
	}
	assert.Equal(t, strings.Repeat("0123456789abcdef€ü", 40), string(buf), "no body was written to")
}
