package chaos_test

// The real servers the chaos tests run against, and the faults they inject:
// kumo (SQS) behind sqstest's fault-injecting proxy, and pstest (Pub/Sub)
// with a Publish reactor and a gRPC interceptor. Everything listens on
// 127.0.0.1.

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/sivchari/kumo"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/internal/pubsubtest"
	"github.com/ankusa/sinkbatch/internal/sqstest"
)

// poisonMark in a body makes both servers refuse the request holding it for
// its content (SQS InvalidMessageContents, Pub/Sub InvalidArgument).
const poisonMark = "POISON"

// dice is a seeded random source safe for concurrent use. Which call draws
// which number depends on scheduling; the seed fixes the odds and the load.
type dice struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newDice(seed, stream uint64) *dice {
	return &dice{r: rand.New(rand.NewPCG(seed, stream))}
}

func (d *dice) float() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.r.Float64()
}

func (d *dice) chance(p float64) bool { return p > 0 && d.float() < p }

func (d *dice) between(lo, hi time.Duration) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return lo + time.Duration(d.r.Int64N(int64(hi-lo)+1))
}

// wait sleeps for d or until ctx ends; it reports whether d passed.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// stored is a message as the server holds it, in the server's order.
type stored struct {
	ID    string
	Key   string // the idempotency key
	Group string
	Body  string
}

// ---- SQS: kumo behind a fault-injecting proxy ----

// sqsFaults are the odds, per SendMessageBatch call, of each fault the proxy
// injects while On, and how often each struck.
type sqsFaults struct {
	On   atomic.Bool
	Dice *dice

	ServerError, Throttle, ResetBefore, ResetAfter float64
	Delay, LongDelay, DelayAfter                   float64

	Struck struct {
		ServerError, Throttle, ResetBefore, ResetAfter, Delay, LongDelay, Poison atomic.Int64
	}
}

// plan is what the proxy does with one SendMessageBatch call: nothing
// unless f is On, else what the dice say.
func (f *sqsFaults) plan() sqstest.Action {
	var a sqstest.Action
	if f == nil || !f.On.Load() {
		return a
	}
	d := f.Dice
	switch x := d.float(); {
	case x < f.ServerError:
		f.Struck.ServerError.Add(1)
		a.Answer = sqstest.Error(http.StatusInternalServerError, "InternalError", "chaos")
	case x < f.ServerError+f.Throttle:
		f.Struck.Throttle.Add(1)
		a.Answer = sqstest.Error(http.StatusBadRequest, "ThrottlingException", "Rate exceeded")
	case x < f.ServerError+f.Throttle+f.ResetBefore:
		f.Struck.ResetBefore.Add(1)
		a.Answer = sqstest.Reset
	case x < f.ServerError+f.Throttle+f.ResetBefore+f.ResetAfter:
		f.Struck.ResetAfter.Add(1)
		a.ResetAfter = true // stored, but the client never learns it
	}
	var delay time.Duration
	switch x := d.float(); {
	case x < f.LongDelay:
		f.Struck.LongDelay.Add(1)
		delay = d.between(time.Second, 3*time.Second)
	case x < f.LongDelay+f.Delay:
		f.Struck.Delay.Add(1)
		delay = d.between(20*time.Millisecond, 200*time.Millisecond)
	}
	if d.chance(f.DelayAfter) {
		a.After = delay // the messages are stored; the answer comes late
	} else {
		a.Before = delay
	}
	return a
}

// fault refuses, if poison is set, every SendMessageBatch call that holds
// poisonMark for its content, and plays f's plan with the others.
func (f *sqsFaults) fault(poison bool) sqstest.Fault {
	return func(c *sqstest.Call) sqstest.Action {
		if poison && bytes.Contains(c.Body, []byte(poisonMark)) {
			if f != nil {
				f.Struck.Poison.Add(1)
			}
			return sqstest.Action{Answer: sqstest.Error(http.StatusBadRequest, "InvalidMessageContents", "chaos: the request holds a poison message")}
		}
		return f.plan()
	}
}

// sqsEnv is kumo, in-process, and a proxy in front of it: codecs talk to the
// proxy, the admin client (queues, read back) to kumo.
type sqsEnv struct {
	Proxy *sqstest.Proxy // counts the SendMessageBatch calls
	cfg   aws.Config
	admin *awssqs.Client
}

func newSQSEnv(t *testing.T, faults *sqsFaults, poison bool) *sqsEnv {
	t.Helper()
	srv := kumo.NewServer()
	t.Cleanup(srv.Close)
	p := sqstest.New(t, srv.URL)
	p.Set(faults.fault(poison))
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	adminTr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		adminTr.CloseIdleConnections()
	})
	base := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKIDCHAOS", "secret-chaos", ""),
		// The SDK's standard 3 attempts with a short backoff, and no
		// client-side retry quota: the proxy fails calls on purpose.
		Retryer: func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxBackoff = 5 * time.Millisecond
				o.RateLimiter = ratelimit.None
			})
		},
	}
	cfg := base
	cfg.BaseEndpoint = aws.String(p.URL)
	cfg.HTTPClient = &http.Client{Transport: tr}
	adminCfg := base
	adminCfg.BaseEndpoint = aws.String(srv.URL)
	admin := awssqs.NewFromConfig(adminCfg, func(o *awssqs.Options) { o.HTTPClient = &http.Client{Transport: adminTr} })
	return &sqsEnv{Proxy: p, cfg: cfg, admin: admin}
}

// createQueue makes a queue and returns its URL.
func (e *sqsEnv) createQueue(t *testing.T, name string, fifo bool) string {
	t.Helper()
	attrs := map[string]string{}
	if fifo {
		name += ".fifo"
		attrs["FifoQueue"] = "true"
		attrs["ContentBasedDeduplication"] = "false"
	}
	out, err := e.admin.CreateQueue(context.Background(), &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	require.NoError(t, err)
	return aws.ToString(out.QueueUrl)
}

// codec makes a codec for queueURL that talks through the proxy.
func (e *sqsEnv) codec(t *testing.T, queueURL string, tuning codec.Tuning) *sqs.Codec {
	t.Helper()
	c, err := sqs.New(sqs.Config{QueueURL: queueURL, AWS: e.cfg, Tuning: tuning})
	require.NoError(t, err)
	return c
}

// readBack empties queueURL and returns each message once, on a FIFO
// queue in sequence-number order (see sqstest.ReadBack).
func (e *sqsEnv) readBack(t *testing.T, queueURL string) []stored {
	t.Helper()
	var all []stored
	for _, m := range sqstest.ReadBack(t, e.admin, queueURL) {
		all = append(all, stored{ID: m.ID, Key: m.Attributes[sqs.DefaultIdempotencyAttribute], Group: m.Group, Body: m.Body})
	}
	return all
}

// ---- Pub/Sub: pstest with a reactor and an interceptor ----

// pubsubFaults are the odds of each fault the Pub/Sub side injects while On,
// and how often each struck. Unavailable comes from pstest's reactor; delays
// from a gRPC interceptor, since a reactor runs under the server's lock and a
// delay there would stall every call.
type pubsubFaults struct {
	On   atomic.Bool
	Dice *dice

	Unavailable, Delay, LongDelay, DelayAfter float64

	Struck struct {
		Unavailable, Delay, LongDelay, Poison atomic.Int64
	}
}

// pubsubEnv is a pstest server whose fake is served on a gRPC server of our
// own on 127.0.0.1, with a fault-injecting interceptor in front of it.
type pubsubEnv struct {
	Srv       *pstest.Server
	Addr      string
	faults    *pubsubFaults
	poison    bool
	Publishes atomic.Int64 // Publish calls that reached the fake
}

func newPubSubEnv(t *testing.T, faults *pubsubFaults, poison bool, topics ...string) *pubsubEnv {
	t.Helper()
	e := &pubsubEnv{faults: faults, poison: poison}
	e.Srv, e.Addr = pubsubtest.Serve(t, e.react, topics, grpc.UnaryInterceptor(e.intercept))
	return e
}

// react runs under pstest's lock: it only counts and rolls dice.
func (e *pubsubEnv) react(req *pubsubpb.PublishRequest) (bool, any, error) {
	e.Publishes.Add(1)
	if e.poison {
		for _, m := range req.Messages {
			if bytes.Contains(m.Data, []byte(poisonMark)) {
				if e.faults != nil {
					e.faults.Struck.Poison.Add(1)
				}
				return true, nil, status.Error(codes.InvalidArgument, "chaos: the request holds a poison message")
			}
		}
	}
	if f := e.faults; f != nil && f.On.Load() && f.Dice.chance(f.Unavailable) {
		f.Struck.Unavailable.Add(1)
		return true, nil, status.Error(codes.Unavailable, "chaos: unavailable")
	}
	return false, nil, nil
}

func (e *pubsubEnv) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	f := e.faults
	if f == nil || !f.On.Load() || info.FullMethod != "/google.pubsub.v1.Publisher/Publish" {
		return handler(ctx, req)
	}
	var delay time.Duration
	switch x := f.Dice.float(); {
	case x < f.LongDelay:
		f.Struck.LongDelay.Add(1)
		delay = f.Dice.between(time.Second, 3*time.Second)
	case x < f.LongDelay+f.Delay:
		f.Struck.Delay.Add(1)
		delay = f.Dice.between(20*time.Millisecond, 200*time.Millisecond)
	}
	if delay == 0 {
		return handler(ctx, req)
	}
	if f.Dice.chance(f.DelayAfter) {
		// Published at once; the answer comes late, or never.
		resp, err := handler(ctx, req)
		if !wait(ctx, delay) {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return resp, err
	}
	if !wait(ctx, delay) {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return handler(ctx, req)
}

// codec makes a codec for topic; it is closed when the test ends.
func (e *pubsubEnv) codec(t *testing.T, topic string, tuning codec.Tuning) *pubsub.Codec {
	t.Helper()
	c, err := pubsub.New(context.Background(), pubsub.Config{Topic: topic, Endpoint: e.Addr, Insecure: true, Tuning: tuning})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// readBack returns topic's messages in publish order.
func (e *pubsubEnv) readBack(topic string) []stored {
	var all []stored
	for _, m := range e.Srv.Messages() {
		if m.Topic != topic {
			continue
		}
		all = append(all, stored{ID: m.ID, Key: m.Attributes[pubsub.DefaultIdempotencyAttribute], Group: m.OrderingKey, Body: string(m.Data)})
	}
	return all
}
