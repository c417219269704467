package actors_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/sivchari/kumo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// tracedInstance starts an instance whose spans go to a recorder.
func tracedInstance(t *testing.T, name string) (*actors.Instance, *tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, inst := start(t, actors.Config{Name: name, TracerProvider: tp})
	return inst, rec, tp
}

// spansNamed returns the ended spans whose name starts with prefix.
func spansNamed(rec *tracetest.SpanRecorder, prefix string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// One create span per delivery, a child of the caller's span, ended with its
// answer; one send span per request, linked both ways; the message carries
// its create span's context.
func TestTracingCreateAndSendSpans(t *testing.T) {
	inst, rec, tp := tracedInstance(t, "traced")
	c := fakecodec.New("q", lim10)
	c.Tune = codec.Tuning{Linger: time.Hour, MaxEntries: 3}
	ctx, parent := tp.Tracer("test").Start(context.Background(), "dispatch")
	ids := make([]string, 3)
	var chans []<-chan result
	for i := range 3 {
		ch := make(chan result, 1)
		chans = append(chans, ch)
		go func() {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			id, err := inst.Deliver(dctx, c, msg("a", "", fmt.Sprint(i)))
			ch <- result{id, err}
		}()
	}
	for i, ch := range chans {
		r := await(t, ch)
		require.NoError(t, r.err)
		ids[i] = r.id
	}
	parent.End()

	creates := spansNamed(rec, "create ")
	require.Len(t, creates, 3)
	sends := spansNamed(rec, "send ")
	require.Len(t, sends, 1)
	send := sends[0]
	assert.Equal(t, trace.SpanKindClient, send.SpanKind())
	assert.Equal(t, "3", attr(send, "messaging.batch.message_count"))
	assert.Equal(t, "entries", attr(send, "sinkbatch.flush.trigger"))
	assert.Equal(t, "send", attr(send, "messaging.operation.type"))
	assert.Equal(t, "fake", attr(send, "messaging.system"), "a codec without Describer is traced under its Name")
	require.Len(t, send.Links(), 3)

	sent := map[string]codec.Message{}
	for _, m := range c.Sent() {
		sent[string(m.Body)] = m
	}
	var gotIDs []string
	for _, s := range creates {
		assert.Equal(t, trace.SpanKindProducer, s.SpanKind())
		assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID(), "a child of the caller's span")
		assert.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID())
		assert.Equal(t, "create", attr(s, "messaging.operation.type"))
		assert.Equal(t, codes.Unset, s.Status().Code)
		gotIDs = append(gotIDs, attr(s, "messaging.message.id"))
		require.Len(t, s.Links(), 1, "the create span records the send it went out in")
		assert.Equal(t, send.SpanContext().SpanID(), s.Links()[0].SpanContext.SpanID())
		linked := false
		for _, l := range send.Links() {
			linked = linked || l.SpanContext.SpanID() == s.SpanContext().SpanID()
		}
		assert.True(t, linked, "the send span links each create span")
	}
	assert.ElementsMatch(t, ids, gotIDs)
	for _, m := range sent {
		want := "00-" + parent.SpanContext().TraceID().String() + "-"
		assert.True(t, strings.HasPrefix(m.Trace.Parent, want), "the message carries its create span: %q", m.Trace.Parent)
	}
}

// A delivery that fails ends its create span with an error status; a
// bisection's requests are send spans too.
func TestTracingFailuresAndBisections(t *testing.T) {
	inst, rec, _ := tracedInstance(t, "traced-fail")
	c := fakecodec.New("q", codec.Limits{MaxEntries: 4, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Hour}
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		for _, m := range batch {
			if string(m.Body) == "poison" {
				return nil, fmt.Errorf("bad: %w", codec.ErrRefused)
			}
		}
		res := make([]codec.Result, len(batch))
		for i := range res {
			res[i].ID = fmt.Sprint("id-", i)
		}
		return res, nil
	}
	var chans []<-chan result
	for _, body := range []string{"a", "b", "poison", "d"} {
		chans = append(chans, deliverAsync(inst, c, msg("t", "", body), 10*time.Second))
	}
	failed := 0
	for _, ch := range chans {
		if await(t, ch).err != nil {
			failed++
		}
	}
	assert.Equal(t, 1, failed)
	sends := spansNamed(rec, "send ")
	assert.Equal(t, int(c.Requests()), len(sends), "one send span per request")
	assert.Greater(t, len(sends), 1)
	errored := 0
	for _, s := range spansNamed(rec, "create ") {
		if s.Status().Code == codes.Error {
			errored++
			assert.Contains(t, s.Status().Description, "refused")
		}
	}
	assert.Equal(t, 1, errored)
}

// Without a TracerProvider there are no spans and the message carries no
// trace context.
func TestNoTracingWithoutAProvider(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "untraced"})
	c := fakecodec.New("q", lim10)
	c.Tune = codec.Tuning{Linger: time.Millisecond}
	_, err := inst.Deliver(context.Background(), c, msg("a", "", "x"))
	require.NoError(t, err)
	require.Len(t, c.Sent(), 1)
	assert.Equal(t, codec.TraceContext{}, c.Sent()[0].Trace)
}

// An actor caller's span travels in Deliver.SpanContext.
func TestTracingTheActorForm(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	system, inst := start(t, actors.Config{Name: "traced-actor", TracerProvider: tp})
	c := fakecodec.New("q", lim10)
	c.Tune = codec.Tuning{Linger: time.Millisecond}
	_, parent := tp.Tracer("test").Start(context.Background(), "actor")
	res, err := quietFuture(t, system, inst, &messages.Deliver{Codec: c, Message: msg("a", "", "x"), SpanContext: parent.SpanContext()})
	require.NoError(t, err)
	require.NoError(t, res.Err)
	creates := spansNamed(rec, "create ")
	require.Len(t, creates, 1)
	assert.Equal(t, parent.SpanContext().SpanID(), creates[0].Parent().SpanID())
}

// The carried context reaches the consumer: Pub/Sub in the attributes
// Google's subscriber reads, SQS in the W3C attributes when asked for them
// (the emulators do not keep the AWSTraceHeader system attribute).
func TestTracingPropagatesToTheConsumer(t *testing.T) {
	inst, rec, _ := tracedInstance(t, "traced-wire")
	ctx := context.Background()

	srv := pstest.NewServer()
	defer srv.Close()
	const topic = "projects/p/topics/traced"
	_, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: topic})
	require.NoError(t, err)
	ps, err := pubsub.New(ctx, pubsub.Config{Topic: topic, Endpoint: srv.Addr, Insecure: true, Tuning: codec.Tuning{Linger: time.Millisecond}})
	require.NoError(t, err)
	defer func() { assert.NoError(t, ps.Close()) }()
	_, err = inst.Deliver(ctx, ps, msg("a", "", "to pubsub"))
	require.NoError(t, err)

	ks := kumo.NewServer()
	defer ks.Close()
	awsCfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""), BaseEndpoint: aws.String(ks.URL)}
	client := awssqs.NewFromConfig(awsCfg)
	// A name of its own per run: kumo keeps queues across servers in one
	// process, so a second run (-count) would read the first one's message.
	created, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(fmt.Sprint("traced-", time.Now().UnixNano()))})
	require.NoError(t, err)
	q, err := sqs.New(sqs.Config{QueueURL: aws.ToString(created.QueueUrl), AWS: awsCfg, TracePropagation: sqs.TraceW3CAttributes,
		AttributeChecksumsOptional: true, Tuning: codec.Tuning{Linger: time.Millisecond}})
	require.NoError(t, err)
	_, err = inst.Deliver(ctx, q, msg("a", "", "to sqs"))
	require.NoError(t, err)

	want := map[string]string{} // destination → traceparent of its create span
	for _, s := range spansNamed(rec, "create ") {
		sc := s.SpanContext()
		want[attr(s, "messaging.system")] = "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	}
	require.Len(t, want, 2)
	msgs := srv.Messages()
	require.Len(t, msgs, 1)
	assert.Equal(t, want["gcp_pubsub"], msgs[0].Attributes[pubsub.TraceParentAttribute])

	out, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: created.QueueUrl, MessageAttributeNames: []string{"All"}, WaitTimeSeconds: 1})
	require.NoError(t, err)
	require.Len(t, out.Messages, 1)
	assert.Equal(t, want["aws_sqs"], aws.ToString(out.Messages[0].MessageAttributes[sqs.TraceParentAttribute].StringValue))
}

// countingProvider wraps a TracerProvider and counts how often each of its
// spans is ended.
type countingProvider struct {
	trace.TracerProvider
	mu    sync.Mutex
	spans []*countedSpan
}

func (p *countingProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return countingTracer{Tracer: p.TracerProvider.Tracer(name, opts...), p: p}
}

type countingTracer struct {
	trace.Tracer
	p *countingProvider
}

func (t countingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx, s := t.Tracer.Start(ctx, name, opts...)
	cs := &countedSpan{Span: s}
	t.p.mu.Lock()
	t.p.spans = append(t.p.spans, cs)
	t.p.mu.Unlock()
	return trace.ContextWithSpan(ctx, cs), cs
}

type countedSpan struct {
	trace.Span
	ends atomic.Int32
}

func (s *countedSpan) End(opts ...trace.SpanEndOption) {
	s.ends.Add(1)
	s.Span.End(opts...)
}

// Every create span is ended exactly once, by whoever answers it: the
// front door's caller (answered, refused at admission, gone before or
// after its message was sent), or the batcher (an actor's delivery), and
// when Stop's ctx ends with deliveries queued.
func TestEveryCreateSpanIsEndedExactlyOnce(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	tp := &countingProvider{TracerProvider: sdk}
	system := quietSystem()
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "traced-once", TracerProvider: tp})
	require.NoError(t, err)
	c := fakecodec.New("q", lim10)
	c.Tune = codec.Tuning{Linger: 5 * time.Millisecond}
	c.SizeHook = func(m codec.Message) int {
		if string(m.Body) == "too large" {
			return 2 << 20
		}
		return len(m.Body)
	}
	held := fakecodec.New("held", codec.Limits{MaxEntries: 100, MaxBytes: 1 << 20})
	held.Tune = codec.Tuning{Linger: time.Hour}
	held.Hook = func(ctx context.Context, _ []codec.Message) ([]codec.Result, error) {
		<-ctx.Done() // until Stop gives up on it
		return nil, ctx.Err()
	}
	var sized atomic.Int32 // deliveries held has sized: admitted
	held.SizeHook = func(m codec.Message) int {
		sized.Add(1)
		return len(m.Body)
	}

	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if i%3 == 2 {
				_, err := inst.Deliver(ctx, c, msg("a", "", "too large"))
				assert.ErrorIs(t, err, codec.ErrTooLarge)
				return
			}
			_, err := inst.Deliver(ctx, c, msg("a", "", fmt.Sprint(i)))
			assert.NoError(t, err)
		}()
	}
	for i := range 10 {
		res, err := quietFuture(t, system, inst, &messages.Deliver{Codec: c, Message: msg("b", "", fmt.Sprint("actor", i))})
		require.NoError(t, err)
		require.NoError(t, res.Err)
	}
	wg.Wait()
	// Queued behind an hour's linger, then its caller leaves.
	const gone = 10
	for i := range gone {
		ctx, cancel := context.WithCancel(context.Background())
		ch := make(chan error, 1)
		go func() {
			_, err := inst.Deliver(ctx, held, msg("a", "", fmt.Sprint("gone", i)))
			ch <- err
		}()
		require.Eventually(t, func() bool { return inst.Stats().Queued == i+1 }, 5*time.Second, time.Millisecond)
		cancel()
		require.ErrorIs(t, <-ch, context.Canceled)
	}
	// Queued or in flight when Stop's ctx ends.
	stopped := make([]<-chan result, 5)
	for i := range stopped {
		stopped[i] = deliverAsync(inst, held, msg("c", "", fmt.Sprint("stop", i)), 10*time.Second)
	}
	require.Eventually(t, func() bool { return sized.Load() == gone+5 }, 5*time.Second, time.Millisecond)
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_ = inst.Stop(stopCtx)
	for _, ch := range stopped {
		assert.Error(t, await(t, ch).err)
	}

	tp.mu.Lock()
	defer tp.mu.Unlock()
	creates := 0
	for _, s := range tp.spans {
		if s.ends.Load() != 1 {
			t.Errorf("a span was ended %d times", s.ends.Load())
		}
		if strings.HasPrefix(spanName(rec, s), "create") {
			creates++
		}
	}
	assert.Equal(t, 30+10+gone+5, creates, "one create span per delivery")
	left := 0
	for _, s := range spansNamed(rec, "create") {
		if s.Status().Code == codes.Error && strings.Contains(s.Status().Description, "stopped waiting") {
			left++
			assert.True(t, strings.HasPrefix(s.Name(), "create "), "a caller gone after admission still has its destination's name: %q", s.Name())
		}
	}
	assert.Equal(t, gone, left, "each caller that left ends its span so")
}

// spanName is the name s was ended with, as rec recorded it.
func spanName(rec *tracetest.SpanRecorder, s *countedSpan) string {
	for _, r := range rec.Ended() {
		if r.SpanContext().SpanID() == s.SpanContext().SpanID() {
			return r.Name()
		}
	}
	return ""
}

// With tracing on, create spans the callers start and end on their own
// goroutines meet every way a call ends at once: DefaultTimeout's answer
// (errNoAnswer) for no-deadline calls to a destination that never answers,
// a ctx deadline, a cancel, an answer, a refusal for fullness, and a
// batcher restarting under queued entries (a Recorder that panics in
// Refused). Every span, create or send, is ended exactly once, and each
// call started one create span.
func TestEveryTracedSpanEndsOnceUnderTimeoutsAndRestarts(t *testing.T) {
	const (
		timeout = 40 * time.Millisecond
		callers = 16
		each    = 12
	)
	rec := tracetest.NewSpanRecorder()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	tp := &countingProvider{TracerProvider: sdk}
	var calls atomic.Int64
	// Registered before start: it runs after the instance's Stop.
	t.Cleanup(func() {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		creates := 0
		for _, s := range tp.spans {
			assert.EqualValues(t, 1, s.ends.Load(), "a span was ended %d times", s.ends.Load())
			if s.ends.Load() == 1 && len(spanName(rec, s)) >= 6 && spanName(rec, s)[:6] == "create" {
				creates++
			}
		}
		assert.EqualValues(t, calls.Load(), creates, "one create span per call")
	})
	restarts := &panicky{}
	_, inst := start(t, actors.Config{Name: "trace", DefaultTimeout: timeout, TracerProvider: tp, Recorder: restarts})

	lim := codec.Limits{MaxEntries: 4, MaxBytes: 1 << 20}
	silent, _ := silentCodec(t, lim)
	// busy has a small queue, so that deliveries are refused and the
	// Recorder's panics restart its batcher under queued entries.
	busy := fakecodec.New("busy", codec.Limits{MaxEntries: 2, MaxBytes: 1 << 20})
	busy.Tune = codec.Tuning{Linger: time.Millisecond, QueueMax: 2, MaxInflight: 1}
	busy.Latency = 3 * time.Millisecond
	busy.Hook = echoIDs

	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				msg := codec.Message{Tenant: "t", Body: []byte(fmt.Sprintf("g%d-%d", g, i))}
				// Half the calls are children of a caller's span.
				ctx, parent := context.Background(), trace.Span(nil)
				if i%2 == 0 {
					ctx, parent = sdk.Tracer("caller").Start(ctx, "caller")
				}
				began := time.Now()
				calls.Add(1)
				switch rand.IntN(4) {
				case 0: // no deadline: DefaultTimeout ends it
					_, err := inst.Deliver(ctx, silent, msg)
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.GreaterOrEqual(t, time.Since(began), timeout)
				case 1: // a cancel before DefaultTimeout
					cctx, cancel := context.WithCancel(ctx)
					timer := time.AfterFunc(time.Duration(rand.IntN(int(timeout))), cancel)
					_, err := inst.Deliver(cctx, silent, msg)
					timer.Stop()
					cancel()
					assert.Error(t, err)
				case 2: // a deadline
					dctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(int(timeout))))
					_, err := inst.Deliver(dctx, silent, msg)
					cancel()
					assert.Error(t, err)
				default: // a burst: answered, refused or ErrBatcherDown
					var burst sync.WaitGroup
					calls.Add(5)
					for range 6 {
						burst.Add(1)
						go func() {
							defer burst.Done()
							_, _ = inst.Deliver(ctx, busy, msg)
						}()
					}
					burst.Wait()
				}
				if parent != nil {
					parent.End()
				}
			}
		}()
	}
	wg.Wait()
	assert.Positive(t, restarts.n.Load()/3, "busy's batcher restarted")
}
