package sqs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
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

// signedBy records, for each message body that reaches the server, the
// access key its request was signed with (the Credential=AKID/... part of
// the Authorization header).
type signedBy struct {
	mu   sync.Mutex
	keys map[string]string
}

var credentialRE = regexp.MustCompile(`Credential=([^/]+)/`)

// record is a proxy Fault that reads the request and lets it through.
func (s *signedBy) record(c *sqstest.Call) sqstest.Action {
	var in struct {
		Entries []struct{ MessageBody string }
	}
	if err := json.Unmarshal(c.Body, &in); err != nil {
		panic(err)
	}
	key := ""
	if m := credentialRE.FindStringSubmatch(c.Header.Get("Authorization")); m != nil {
		key = m[1]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range in.Entries {
		s.keys[e.MessageBody] = key
	}
	return sqstest.Action{}
}

func (s *signedBy) key(body string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[body]
}

// TestTenantsNeverShareABatcher: a per-tenant factory builds codecs whose
// credentials are closures of one literal over different keys. Delivered
// through one instance, each tenant's message must reach SQS signed with its
// own key, which it cannot if the codecs share a batcher.
func TestTenantsNeverShareABatcher(t *testing.T) {
	e := newKumo(t)
	p := sqstest.New(t, e.endpoint)
	rec := &signedBy{keys: map[string]string{}}
	p.Set(rec.record)
	q := e.createQueue(t, false, false)
	inst := startInstance(t)

	newTenantCodec := func(key string) *sqs.Codec {
		cfg := e.cfg
		cfg.BaseEndpoint = aws.String(p.URL)
		cfg.Retryer = nil // the credentials alone must keep the tenants apart
		cfg.Credentials = tenantCredentials(key)
		c, err := sqs.New(sqs.Config{QueueURL: q, AWS: cfg})
		require.NoError(t, err)
		return c
	}
	const rounds = 5
	wrong := 0
	for round := range rounds {
		var wg sync.WaitGroup
		for _, tenant := range []string{"A", "B"} {
			key := fmt.Sprintf("AKID%s%d", tenant, round)
			c := newTenantCodec(key)
			wg.Go(func() {
				dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, err := inst.Deliver(dctx, c, codec.Message{Tenant: tenant, Body: []byte(key)})
				assert.NoError(t, err)
			})
		}
		wg.Wait()
		for _, tenant := range []string{"A", "B"} {
			key := fmt.Sprintf("AKID%s%d", tenant, round)
			if got := rec.key(key); got != key {
				t.Logf("round %d: tenant %s's message was signed with %q", round, tenant, got)
				wrong++
			}
		}
	}
	assert.Zero(t, wrong, "of %d messages, %d went out signed with another tenant's key", 2*rounds, wrong)
}
