// This file is the real-server harness that the flow tests and benchmarks
// share: an SQS FIFO queue on fauxqs behind a proxy that fails entries and
// whole requests, a Pub/Sub topic on pstest with a reactor that fails whole
// requests, and a caller that retries each failed or paused message in its
// own order with the same key.

package actors_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/internal/pubsubtest"
	"github.com/ankusa/sinkbatch/internal/sqstest"
	"github.com/ankusa/sinkbatch/messages"
)

// FauxqsEnv names the variable .ci/fauxqs/start.sh exports.
const FauxqsEnv = "SINKBATCH_FAUXQS_ENDPOINT"

// Faults are the odds the servers fail: a whole request, or one entry
// (SQS only: a Pub/Sub Publish succeeds or fails as a whole). Safe for
// concurrent use.
type Faults struct {
	Whole, Entry float64
	mu           sync.Mutex
	rng          *rand.Rand
	Struck       atomic.Int64 // requests or entries failed
}

// NewFaults returns Faults with a seeded generator.
func NewFaults(whole, entry float64, seed uint64) *Faults {
	return &Faults{Whole: whole, Entry: entry, rng: rand.New(rand.NewPCG(seed, 11))}
}

func (f *Faults) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64() < p
}

// ---- SQS: fauxqs behind a proxy ----

// SQS is a FIFO queue on fauxqs, with sqstest's proxy in front that injects
// Faults into SendMessageBatch calls.
type SQS struct {
	QueueURL string
	cfg      aws.Config
	admin    *awssqs.Client
}

// NewSQS creates a fresh FIFO queue on the fauxqs that .ci/fauxqs/start.sh
// started, or skips tb.
func NewSQS(tb testing.TB, f *Faults) *SQS {
	tb.Helper()
	ep := os.Getenv(FauxqsEnv)
	if ep == "" {
		tb.Skipf("%s is unset: run `eval \"$(bash .ci/fauxqs/start.sh)\"` first", FauxqsEnv)
	}
	p := sqstest.New(tb, ep)
	if f != nil {
		p.Set(f.sqsFault)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	tb.Cleanup(tr.CloseIdleConnections)
	base := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKIDFLOW", "secret-flow", ""),
		// One attempt: the caller is the layer that retries, and an
		// injected failure must reach the batcher.
		Retryer:    func() aws.Retryer { return retry.AddWithMaxAttempts(retry.NewStandard(), 1) },
		HTTPClient: &http.Client{Transport: tr},
	}
	s := &SQS{cfg: base}
	s.cfg.BaseEndpoint = aws.String(p.URL)
	adminCfg := base
	adminCfg.BaseEndpoint = aws.String(ep)
	adminCfg.Retryer = func() aws.Retryer { return retry.NewStandard() }
	s.admin = awssqs.NewFromConfig(adminCfg)
	name := fmt.Sprintf("flow-%d-%d.fifo", time.Now().UnixNano()%1e9, queueSeq.Add(1))
	out, err := s.admin.CreateQueue(context.Background(), &awssqs.CreateQueueInput{QueueName: aws.String(name),
		Attributes: map[string]string{"FifoQueue": "true", "ContentBasedDeduplication": "false"}})
	if err != nil {
		tb.Fatalf("create queue: %v", err)
	}
	s.QueueURL = aws.ToString(out.QueueUrl)
	return s
}

var queueSeq atomic.Int64

// Codec is a codec for the queue, through the proxy.
func (s *SQS) Codec(tb testing.TB, t codec.Tuning) *sqs.Codec {
	tb.Helper()
	c, err := sqs.New(sqs.Config{QueueURL: s.QueueURL, AWS: s.cfg, Tuning: t})
	if err != nil {
		tb.Fatalf("sqs codec: %v", err)
	}
	return c
}

// Stored reads the queue back (receiving and deleting) and returns the
// bodies of each group in sequence-number order, each body once.
func (s *SQS) Stored(tb testing.TB) map[string][]string {
	tb.Helper()
	out := map[string][]string{}
	for _, m := range sqstest.ReadBack(tb, s.admin, s.QueueURL) {
		out[m.Group] = append(out[m.Group], m.Body)
	}
	return out
}

// sqsFault fails a SendMessageBatch call as a whole (InternalError) with
// odds f.Whole; otherwise it fails each entry (InternalError, retryable)
// with odds f.Entry, and so every later entry of its group in the request,
// which reaches fauxqs without them.
func (f *Faults) sqsFault(*sqstest.Call) sqstest.Action {
	if f.chance(f.Whole) {
		f.Struck.Add(1)
		return sqstest.Action{Answer: sqstest.Error(http.StatusInternalServerError, "InternalError", "flowtest: the request failed")}
	}
	stopped := map[string]bool{} // groups with a failed entry in this request
	return sqstest.Action{Fail: func(e map[string]any) map[string]any {
		g, _ := e["MessageGroupId"].(string)
		if !stopped[g] && !f.chance(f.Entry) {
			return nil
		}
		stopped[g] = true
		f.Struck.Add(1)
		return sqstest.Failure(e["Id"], "InternalError", "flowtest: the entry failed", false)
	}}
}

// ---- Pub/Sub: pstest with a reactor ----

// PubSub is a topic on pstest, served on a gRPC server of its own; a
// reactor fails a Publish (Unavailable, retryable) with odds Faults.Whole.
type PubSub struct {
	Srv   *pstest.Server
	Topic string
	addr  string
}

// NewPubSub starts pstest; it stops with tb.
func NewPubSub(tb testing.TB, f *Faults) *PubSub {
	tb.Helper()
	react := func(*pubsubpb.PublishRequest) (bool, any, error) {
		if f != nil && f.chance(f.Whole) {
			f.Struck.Add(1)
			return true, nil, status.Error(codes.Unavailable, "flowtest: the request failed")
		}
		return false, nil, nil
	}
	p := &PubSub{Topic: "projects/flow/topics/ordered"}
	p.Srv, p.addr = pubsubtest.Serve(tb, react, []string{p.Topic})
	return p
}

// Codec is a codec for the topic; it closes with tb.
func (p *PubSub) Codec(tb testing.TB, t codec.Tuning) *pubsub.Codec {
	tb.Helper()
	c, err := pubsub.New(context.Background(), pubsub.Config{Topic: p.Topic, Endpoint: p.addr, Insecure: true, Tuning: t})
	if err != nil {
		tb.Fatalf("pubsub codec: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Stored returns each ordering key's bodies in publish order, each once.
func (p *PubSub) Stored() map[string][]string {
	out := map[string][]string{}
	seen := map[string]bool{}
	for _, m := range p.Srv.Messages() {
		if seen[string(m.Data)] {
			continue
		}
		seen[string(m.Data)] = true
		out[m.OrderingKey] = append(out[m.OrderingKey], string(m.Data))
	}
	return out
}

// ---- the caller ----

// Body is the body (and idempotency key) of message i of group g.
func Body(g string, i int) string { return fmt.Sprintf("%s-%06d", g, i) }

// Callers delivers per messages to each of groups through pid, one
// goroutine per group: it sends the group's pending messages in order,
// waits for every answer, and sends the ones that failed (any error but a
// permanent one, which fails tb) again in the same order with the same key,
// after the longest retry-after of the round if the queue was full, until
// none is left. It returns the number of retries.
func Callers(tb testing.TB, system *actor.ActorSystem, pid *actor.PID, c codec.Codec, groups []string, per int) int64 {
	var retries atomic.Int64
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pending := make([]int, per)
			for i := range pending {
				pending[i] = i
			}
			giveUp := time.Now().Add(5 * time.Minute)
			for len(pending) > 0 {
				if time.Now().After(giveUp) {
					tb.Errorf("group %s: still %d pending after 5 minutes", g, len(pending))
					return
				}
				futures := make([]*actor.Future, len(pending))
				for j, i := range pending {
					b := Body(g, i)
					futures[j] = system.Root.RequestFuture(pid, &messages.Deliver{Codec: c,
						Message:  codec.Message{Group: g, Tenant: g, IdempotencyKey: b, Body: []byte(b)},
						Deadline: time.Now().Add(20 * time.Second)}, 30*time.Second)
				}
				var next []int
				var after time.Duration // the longest RetryAfter of the round
				for j, f := range futures {
					r, err := f.Result()
					if err == nil {
						if d, ok := r.(*messages.Delivered); ok {
							err = d.Err
						} else {
							err = fmt.Errorf("answer %T", r)
						}
					}
					if err != nil {
						var ra *messages.RetryAfterError
						if errors.As(err, &ra) {
							after = max(after, ra.After)
						}
						if codec.IsPermanent(err) {
							tb.Errorf("group %s message %d: permanent: %v", g, pending[j], err)
							continue
						}
						next = append(next, pending[j])
					}
				}
				retries.Add(int64(len(next)))
				pending = next
				time.Sleep(after) // the queue was full: honour its retry-after
			}
		}()
	}
	wg.Wait()
	return retries.Load()
}

// Violations counts, in each group's stored bodies, the messages stored
// after a message the caller first delivered later, and the messages
// missing.
func Violations(stored map[string][]string, groups []string, per int) (outOfOrder, missing int) {
	for _, g := range groups {
		got := stored[g]
		highest := -1
		for _, b := range got {
			i, _ := strconv.Atoi(b[len(g)+1:])
			if i < highest {
				outOfOrder++
			}
			highest = max(highest, i)
		}
		missing += per - len(got)
	}
	return outOfOrder, missing
}
