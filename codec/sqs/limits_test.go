package sqs_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/internal/sqstest"
)

func TestMaxMessageBytes(t *testing.T) {
	for _, n := range []int{-1, sqs.MaxBytes + 1} {
		cfg := baseConfig()
		cfg.MaxMessageBytes = n
		_, err := sqs.New(cfg)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "sinkbatch/sqs: Config.MaxMessageBytes")
	}

	def := mustNew(t, baseConfig())
	assert.Equal(t, sqs.MaxBytes, def.MaxMessageBytes())
	cfg := baseConfig()
	cfg.MaxMessageBytes = 1024
	c := mustNew(t, cfg)
	assert.Equal(t, 1024, c.MaxMessageBytes())
	assert.Equal(t, sqs.MaxBytes, c.Limits().MaxBytes, "requests keep SQS's limit")
	assert.NotEqual(t, def.Identity(), c.Identity())

	require.NoError(t, c.Validate(codec.Message{Body: bytes.Repeat([]byte("x"), 1024)}))
	err := c.Validate(codec.Message{Body: bytes.Repeat([]byte("x"), 1020), Attributes: map[string]string{"a": "b"}})
	require.ErrorIs(t, err, codec.ErrTooLarge)
	assert.True(t, codec.IsPermanent(err))
	assert.Contains(t, err.Error(), "1028 bytes")
	assert.Contains(t, err.Error(), "Config.MaxMessageBytes, 1024")
}

// TestReadQueueAttributes: with ReadQueueAttributes, New reads the queue's
// MaximumMessageSize; the smaller of it and MaxMessageBytes is the limit.
func TestReadQueueAttributes(t *testing.T) {
	for _, srv := range []struct {
		name string
		mk   func(testing.TB) *env
		def  int // the MaximumMessageSize of a queue created without one
	}{{"kumo", newKumo, 256 << 10}, {"fauxqs", newFauxqs, sqs.MaxBytes}} {
		t.Run(srv.name, func(t *testing.T) {
			e := srv.mk(t)
			read := func(c *sqs.Config) { c.ReadQueueAttributes = true }

			small := e.createQueueWith(t, false, false, map[string]string{"MaximumMessageSize": "2048"})
			c := e.codec(t, small, codec.Tuning{}, read)
			assert.Equal(t, 2048, c.MaxMessageBytes())
			err := c.Validate(codec.Message{Body: bytes.Repeat([]byte("x"), 2049)})
			require.ErrorIs(t, err, codec.ErrTooLarge)
			assert.Contains(t, err.Error(), "the queue's MaximumMessageSize, 2048")

			tighter := e.codec(t, small, codec.Tuning{}, read, func(c *sqs.Config) { c.MaxMessageBytes = 1500 })
			assert.Equal(t, 1500, tighter.MaxMessageBytes())

			assert.Equal(t, srv.def, e.codec(t, e.createQueue(t, false, false), codec.Tuning{}, read).MaxMessageBytes())

			_, err = sqs.New(sqs.Config{QueueURL: e.endpoint + "/000000000000/no-such-queue", AWS: e.cfg, ReadQueueAttributes: true})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "sinkbatch/sqs: New: reading MaximumMessageSize of no-such-queue (Config.ReadQueueAttributes)")
		})
	}
}

// TestSmallQueueRefusedAtAdmission: on a queue whose MaximumMessageSize is
// below SQS's 1 MiB, a message over it is answered ErrTooLarge at admission
// and never reaches the server, which would refuse it.
func TestSmallQueueRefusedAtAdmission(t *testing.T) {
	e := newFauxqs(t)
	q := e.createQueueWith(t, false, false, map[string]string{"MaximumMessageSize": "1024"})
	big := codec.Message{Tenant: "t", Body: bytes.Repeat([]byte("b"), 1025)}

	// fauxqs enforces the queue's limit: past the codec's check, it
	// refuses the entry.
	unchecked := e.codec(t, q, codec.Tuning{})
	res, err := sqs.SendUnvalidated(ctx(t), unchecked, []codec.Message{big})
	require.NoError(t, err)
	var ee *codec.EntryError
	require.ErrorAs(t, res[0].Err, &ee)
	assert.Equal(t, "InvalidParameterValue", ee.Code)
	assert.Contains(t, ee.Message, "shorter than 1024")

	p := sqstest.New(t, e.endpoint)
	rec := &signedBy{keys: map[string]string{}}
	p.Set(rec.record)
	c := e.codec(t, q, codec.Tuning{Linger: 20 * time.Millisecond}, func(c *sqs.Config) {
		c.AWS.BaseEndpoint = aws.String(p.URL)
		c.ReadQueueAttributes = true
	})
	inst := startInstance(t)
	msgs := []codec.Message{big}
	for i := range 5 {
		msgs = append(msgs, codec.Message{Tenant: "t", Body: []byte(strings.Repeat("s", 100+i))})
	}
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, errs[i] = inst.Deliver(dctx, c, m)
		})
	}
	wg.Wait()
	require.ErrorIs(t, errs[0], codec.ErrTooLarge)
	assert.True(t, codec.IsPermanent(errs[0]))
	for _, err := range errs[1:] {
		require.NoError(t, err)
	}
	assert.Len(t, e.readBack(t, q, 5), 5)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Len(t, rec.keys, 5, "only the small messages reached the server")
	_, sent := rec.keys[string(big.Body)]
	assert.False(t, sent, "the large message was never sent")
	assert.False(t, errors.Is(errs[0], codec.ErrRefused), "refused at admission, not by the server")
}
