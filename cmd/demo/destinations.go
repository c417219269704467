package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/sivchari/kumo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

// The destinations' names: each is also its codec's Name(), so the metrics'
// "sink" attribute, the batcher's logs and the tables all say the same.
const (
	destOrders   = "sqs-orders.fifo"
	destEvents   = "sqs-events"
	destBurst    = "sqs-burst"
	destStrict   = "sqs-strict.fifo"
	destBlock    = "sqs-block"
	destAdaptive = "sqs-adaptive"
	destPSOrders = "pubsub-orders"
	destAudit    = "pubsub-audit"
)

// The attributes the demo marks its special messages with.
const (
	attrTenant = "tenant"
	attrPoison = "poison" // "true": the embedded Pub/Sub server refuses any request holding it
)

// destination is one queue or topic the demo sends to, and what its callers
// saw.
type destination struct {
	name  string
	about string      // what the destination shows, for the table
	codec codec.Codec // a *named (or *crashOnce) around the real codec
	// grouped: every message needs a group (a FIFO queue); ordered: the
	// destination keeps each group's order, so the read back checks it.
	grouped, ordered bool
	// readBack returns the messages the destination holds, in the order
	// it stored them; nil when it cannot be read back.
	readBack func(ctx context.Context) ([]stored, error)
	noRead   string // why it is not read back
	// wireRequests counts the requests the server got, where the demo
	// can see them (the embedded Pub/Sub server); nil elsewhere.
	wireRequests func() int

	refused     atomic.Int64 // RetryAfterError answers the callers got
	batcherDown atomic.Int64 // ErrBatcherDown answers the callers got
	paused      atomic.Int64 // GroupPausedError answers the callers got
	// failing, if set, counts the requests its codec failed on purpose.
	failing *failEvery

	mu      sync.Mutex
	records []*record
}

// named gives a codec the demo's name for its destination: a different Name
// is a different destination to sinkbatch, with its own batcher.
type named struct {
	codec.Codec
	name string
}

func (n *named) Name() string { return n.name }

// Validate keeps the codec's admission check, which embedding the Codec
// interface alone would hide from the batcher.
func (n *named) Validate(m codec.Message) error {
	if v, ok := n.Codec.(codec.Validator); ok {
		return v.Validate(m)
	}
	return nil
}

// failEvery fails its first request, and every nth after it, as a whole
// with a retryable error, as a destination's passing fault would: with
// StrictGroups each such failure pauses the groups of the request until
// their callers retry. Counting from the first, a run fails at least once
// however few requests its batches make.
type failEvery struct {
	*named
	n      int64
	sent   atomic.Int64
	Failed atomic.Int64
}

func (f *failEvery) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	if (f.sent.Add(1)-1)%f.n == 0 {
		f.Failed.Add(1)
		return nil, &codec.EntryError{Code: "InternalError", Message: "demo: a passing fault"}
	}
	return f.named.SendBatch(ctx, batch)
}

// crashOnce panics in Size the first time it sees the message with key: a
// codec bug that one message triggers. The batcher answers that message
// alone, permanently, with codec.ErrCodecPanic; every other delivery it
// holds goes on as if nothing happened.
type crashOnce struct {
	*named
	key   string
	armed atomic.Bool
}

func (c *crashOnce) Size(m codec.Message) int {
	if m.IdempotencyKey == c.key && c.armed.CompareAndSwap(true, false) {
		panic("demo: injected crash in Size for " + m.IdempotencyKey)
	}
	return c.named.Size(m)
}

// servers holds what the demo started and must stop: the embedded servers,
// HTTP transports and Pub/Sub connections.
type servers struct {
	kumo      *kumo.Server
	pstest    *pstest.Server
	publishes *publishReactor // pstest's
	closers   []func()
	external  []string // lines saying which real services are used
}

func (s *servers) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// crashKey and poisonKey are the idempotency keys of the two marked
// messages.
const (
	crashKey  = destEvents + "/a/crash"
	poisonKey = destAudit + "/a/poison"
)

// setUp starts the embedded servers (or reaches the services the flags
// name) and returns the destinations in table order.
func setUp(ctx context.Context, o options, idleTimeout time.Duration) (*servers, []*destination, error) {
	s := &servers{}
	sqsDests, err := setUpSQS(ctx, o, s)
	if err != nil {
		s.close()
		return nil, nil, err
	}
	psDests, err := setUpPubSub(ctx, o, s, idleTimeout)
	if err != nil {
		s.close()
		return nil, nil, err
	}
	return s, append([]*destination{sqsDests[0], sqsDests[1], psDests[0], psDests[1]}, sqsDests[2:]...), nil
}

// setUpSQS returns the orders, events, burst, strict, block and adaptive
// destinations.
func setUpSQS(ctx context.Context, o options, s *servers) ([]*destination, error) {
	// One transport for the codecs, one for the demo's own calls; both
	// keep enough idle connections for 8 requests in flight per queue.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	adminTr := http.DefaultTransport.(*http.Transport).Clone()
	s.closers = append(s.closers, tr.CloseIdleConnections, adminTr.CloseIdleConnections)

	var cfg aws.Config
	external := o.sqsQueueURL != "" || o.sqsEndpoint != ""
	if external {
		var err error
		cfg, err = awsconfig.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("AWS config: %w", err)
		}
		if cfg.Region == "" {
			cfg.Region = "us-east-1"
		}
		if o.sqsEndpoint != "" {
			cfg.BaseEndpoint = aws.String(o.sqsEndpoint)
		}
	} else {
		s.kumo = kumo.NewServer() // httptest: listens on 127.0.0.1
		s.closers = append(s.closers, s.kumo.Close)
		cfg = aws.Config{
			Region:       "us-east-1",
			Credentials:  credentials.NewStaticCredentialsProvider("demo", "demo-secret", ""),
			BaseEndpoint: aws.String(s.kumo.URL),
		}
	}
	cfg.HTTPClient = &http.Client{Transport: tr}
	admin := awssqs.NewFromConfig(cfg, func(opt *awssqs.Options) {
		opt.HTTPClient = readOnlyBodies{&http.Client{Transport: adminTr}}
	})

	specs := []struct {
		name, queue, about string
		tuning             codec.Tuning
	}{
		{destOrders, "orders.fifo", "FIFO queue, 4 tenants (1 flooding), groups", codec.Tuning{}},
		{destEvents, "events", "standard queue, 4 tenants; a codec panic", codec.Tuning{}},
		{destBurst, "burst", "standard queue, QueueMax 64, TenantMax 40; burst", codec.Tuning{
			QueueMax: 64, TenantMax: 40, MaxInflight: 1, RetryAfterMax: 250 * time.Millisecond,
		}},
		{destStrict, "strict.fifo", "FIFO queue, StrictGroups; 1 request in 25 fails", codec.Tuning{StrictGroups: true}},
		{destBlock, "block", "standard queue, WhenFull Block, QueueMax 64; burst", codec.Tuning{
			WhenFull: codec.Block, QueueMax: 64, MaxInflight: 1,
		}},
		{destAdaptive, "adaptive", "standard queue, Adaptive, MaxInflight 16", codec.Tuning{Adaptive: true, MaxInflight: 16}},
	}
	var dests []*destination
	for _, sp := range specs {
		url := o.sqsQueueURL
		if url == "" {
			var err error
			if url, err = createQueue(ctx, admin, sp.queue); err != nil {
				return nil, err
			}
		}
		inner, err := sqs.New(sqs.Config{QueueURL: url, AWS: cfg, Tuning: sp.tuning,
			// kumo (and other emulators on loopback) never return
			// MD5OfMessageAttributes; Amazon SQS does.
			AttributeChecksumsOptional: s.kumo != nil || onLoopback(o.sqsEndpoint)})
		if err != nil {
			return nil, err
		}
		fifo := strings.HasSuffix(url, ".fifo")
		d := &destination{
			name:    sp.name,
			about:   sp.about,
			codec:   &named{Codec: inner, name: sp.name},
			grouped: fifo,
			ordered: fifo,
		}
		switch sp.name {
		case destEvents:
			c := &crashOnce{named: d.codec.(*named), key: crashKey}
			c.armed.Store(true)
			d.codec = c
		case destStrict:
			d.failing = &failEvery{named: d.codec.(*named), n: 25}
			d.codec = d.failing
		}
		if o.sqsQueueURL == "" {
			d.readBack = func(ctx context.Context) ([]stored, error) { return drainQueue(ctx, admin, url) }
		} else {
			d.noRead = "an existing queue: reading it would consume others' messages"
		}
		dests = append(dests, d)
	}
	switch {
	case o.sqsQueueURL != "":
		s.external = append(s.external, fmt.Sprintf("SQS: every SQS destination sends to %s (not read back)", o.sqsQueueURL))
	case o.sqsEndpoint != "":
		s.external = append(s.external, fmt.Sprintf("SQS: queues created at %s", o.sqsEndpoint))
	}
	return dests, nil
}

// readOnlyBodies hands net/http request bodies with Read and Close only, as
// codec/sqs does for its own calls: smithy-go closes a request body once the
// response headers are in, and net/http's last read of it through WriteTo
// then fails and closes the connection under the answer being read
// (aws-sdk-go-v2 issue 2737). The SDK retries that call; for a receive the
// messages the first attempt took stay in flight. drainQueue copes with that
// either way; this makes it rare.
type readOnlyBodies struct{ next *http.Client }

func (c readOnlyBodies) Do(r *http.Request) (*http.Response, error) {
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = struct{ io.ReadCloser }{r.Body}
	}
	return c.next.Do(r)
}

// createQueue creates a queue named name (a FIFO queue if it ends in .fifo)
// and returns its URL.
func createQueue(ctx context.Context, admin *awssqs.Client, name string) (string, error) {
	attrs := map[string]string{}
	if strings.HasSuffix(name, ".fifo") {
		attrs["FifoQueue"] = "true"
	}
	// A queue of another run must not mix in: on an external server, and
	// in kumo, whose storage is one per process, not one per server.
	name = fmt.Sprintf("sinkbatch-demo-%d-%s", time.Now().UnixNano()%1e12, name)
	out, err := admin.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		return "", fmt.Errorf("create queue %s: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// stored is one message as a destination holds it.
type stored struct {
	id  string // the destination's message id
	key string // its idempotency key
	// redelivered: the queue handed it out before, in a receive whose
	// answer the demo never got (see drainQueue); where it stands in its
	// group is then not the order it was stored in.
	redelivered bool
}

// readVisibility is the read back's VisibilityTimeout in seconds: long
// enough to delete each received message before it is handed out again
// (should that happen, the message id tells), short enough to wait out a
// receive whose answer was lost.
const readVisibility = 3

// drainQueue receives and deletes every message the queue holds, in the
// order the queue hands them out (a FIFO queue: each group's order). The
// instance has stopped, so nothing more is on its way: the queue is empty
// when a receive returns nothing and it reports no message in flight.
//
// A receive can take messages and lose its answer: the SDK retries a
// response it could not read (aws-sdk-go-v2 retries net.ErrClosed), and the
// messages the first attempt took stay in flight until readVisibility
// passes, locking their FIFO groups meanwhile. drainQueue waits for them, and
// counts each message once by its message id.
func drainQueue(ctx context.Context, admin *awssqs.Client, url string) ([]stored, error) {
	var out []stored
	seen := map[string]bool{}
	var waitingSince time.Time
	for range 1_000_000 { // bounded: 10 million messages
		res, err := admin.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(url),
			MaxNumberOfMessages:         10,
			VisibilityTimeout:           readVisibility,
			WaitTimeSeconds:             0,
			MessageAttributeNames:       []string{sqs.DefaultIdempotencyAttribute},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
		})
		if err != nil {
			return nil, fmt.Errorf("receive from %s: %w", url, err)
		}
		if len(res.Messages) == 0 {
			left, err := inQueue(ctx, admin, url)
			if err != nil {
				return nil, err
			}
			if left == 0 {
				return out, nil
			}
			if waitingSince.IsZero() {
				waitingSince = time.Now()
			}
			if time.Since(waitingSince) > 3*readVisibility*time.Second {
				return nil, fmt.Errorf("read back: %d messages of %s stay invisible", left, url)
			}
			if !sleep(ctx, 100*time.Millisecond) {
				return nil, ctx.Err()
			}
			continue
		}
		waitingSince = time.Time{}
		del := make([]types.DeleteMessageBatchRequestEntry, len(res.Messages))
		for i, m := range res.Messages {
			id := aws.ToString(m.MessageId)
			del[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle}
			if seen[id] {
				continue // its delete's answer was lost
			}
			seen[id] = true
			receives, _ := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
			s := stored{id: id, redelivered: receives > 1}
			if v, ok := m.MessageAttributes[sqs.DefaultIdempotencyAttribute]; ok {
				s.key = aws.ToString(v.StringValue)
			}
			out = append(out, s)
		}
		// Deleting lets a FIFO queue hand out the group's next messages.
		if _, err := admin.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: del}); err != nil {
			return nil, fmt.Errorf("delete from %s: %w", url, err)
		}
	}
	return nil, errors.New("read back: queue never emptied")
}

// inQueue is how many messages url holds, visible or in flight.
func inQueue(ctx context.Context, admin *awssqs.Client, url string) (int, error) {
	a, err := admin.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		},
	})
	if err != nil {
		return 0, fmt.Errorf("queue attributes of %s: %w", url, err)
	}
	n := 0
	for _, k := range []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages,
		types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
	} {
		v, _ := strconv.Atoi(a.Attributes[string(k)])
		n += v
	}
	return n, nil
}

// publishReactor sees every Publish the embedded Pub/Sub server gets: it
// counts them per topic, and refuses with InvalidArgument any that holds a
// message marked poison. It runs under the server's lock and so never calls
// back into the server.
type publishReactor struct {
	mu    sync.Mutex
	calls map[string]int // by topic
}

func (p *publishReactor) React(req any) (bool, any, error) {
	r := req.(*pubsubpb.PublishRequest)
	p.mu.Lock()
	p.calls[r.GetTopic()]++
	p.mu.Unlock()
	for _, m := range r.GetMessages() {
		if m.GetAttributes()[attrPoison] == "true" {
			return true, nil, status.Error(codes.InvalidArgument, "demo: this request holds the poison message")
		}
	}
	return false, nil, nil
}

// publishes is how many Publish calls topic got.
func (p *publishReactor) publishes(topic string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[topic]
}

// setUpPubSub returns the pubsub-orders and pubsub-audit destinations.
func setUpPubSub(ctx context.Context, o options, s *servers, idleTimeout time.Duration) ([]*destination, error) {
	specs := []struct {
		name, topic, about string
		ordered            bool
		tuning             codec.Tuning
	}{
		{destPSOrders, "orders", "topic, ordering keys", true, codec.Tuning{}},
		{destAudit, "audit", fmt.Sprintf("topic; poison message; IdleTimeout %v, a pause", idleTimeout), false,
			codec.Tuning{IdleTimeout: idleTimeout, MaxEntries: 100}},
	}
	var dests []*destination
	for _, sp := range specs {
		cfg := pubsub.Config{Topic: o.pubsubTopic, Endpoint: o.pubsubEndpoint, Tuning: sp.tuning}
		d := &destination{name: sp.name, about: sp.about, ordered: sp.ordered}
		if o.pubsubTopic == "" {
			if s.pstest == nil {
				// NewServer would listen on "localhost", which may be ::1.
				s.publishes = &publishReactor{calls: map[string]int{}}
				s.pstest = pstest.NewServerWithAddress("127.0.0.1:0",
					pstest.ServerReactorOption{FuncName: "Publish", Reactor: s.publishes})
				srv := s.pstest
				s.closers = append(s.closers, func() { _ = srv.Close() })
			}
			cfg.Topic = "projects/sinkbatch-demo/topics/" + sp.topic
			cfg.Endpoint, cfg.Insecure = s.pstest.Addr, true
			if _, err := s.pstest.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: cfg.Topic}); err != nil {
				return nil, fmt.Errorf("create topic %s: %w", cfg.Topic, err)
			}
			srv, topic, reactor := s.pstest, cfg.Topic, s.publishes
			d.wireRequests = func() int { return reactor.publishes(topic) }
			d.readBack = func(context.Context) ([]stored, error) {
				var out []stored
				for _, m := range srv.Messages() { // in publish order
					if m.Topic == topic {
						out = append(out, stored{id: m.ID, key: m.Attributes[pubsub.DefaultIdempotencyAttribute]})
					}
				}
				return out, nil
			}
		} else {
			cfg.Insecure = cfg.Endpoint != "" && (os.Getenv("PUBSUB_EMULATOR_HOST") != "" || isLoopback(cfg.Endpoint))
			d.noRead = "an existing topic: reading it needs a subscription made before publishing"
		}
		inner, err := pubsub.New(ctx, cfg)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { _ = inner.Close() })
		d.codec = &named{Codec: inner, name: sp.name}
		dests = append(dests, d)
	}
	if o.pubsubTopic != "" {
		ep := o.pubsubEndpoint
		if ep == "" {
			ep = os.Getenv("PUBSUB_EMULATOR_HOST")
		}
		if ep == "" {
			ep = "the service"
		}
		s.external = append(s.external, fmt.Sprintf("Pub/Sub: every Pub/Sub destination publishes to %s at %s (not read back; no poison: only the embedded server refuses it)", o.pubsubTopic, ep))
	}
	return dests, nil
}

func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// onLoopback reports whether endpoint is a URL on this machine: an
// emulator, never Amazon SQS.
func onLoopback(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil || u.Hostname() == "" {
		return false
	}
	if u.Hostname() == "localhost" {
		return true
	}
	ip := net.ParseIP(u.Hostname())
	return ip != nil && ip.IsLoopback()
}
