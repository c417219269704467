package pubsub_test

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	apiv1 "cloud.google.com/go/pubsub/v2/apiv1"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/googleapis/gax-go/v2"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// Benchmark parameters shared by sinkbatch and the baseline.
const (
	benchBody     = 100 // bytes
	benchKeys     = 16  // ordering keys in the ordered variant; caller c uses key c % benchKeys
	benchMaxCount = 1000
	benchDelay    = 5 * time.Millisecond
	floorSenders  = 8 // goroutines feeding the floor
)

// BenchmarkPublish compares, in one run on one pstest server, sinkbatch with
// this codec against the Pub/Sub client's own batching publisher
// (Publisher.Publish + Get) with the same thresholds (1000 messages, 5ms)
// and the same number of concurrent callers (256 and 2048), each waiting for
// its message's id before sending the next; and against the floor: the same
// low-level TopicAdminClient.Publish the codec calls, with the codec's
// client and call options, fed pre-built 1000-message requests of the same
// messages from 8 goroutines, with no callers at all; and, unordered only,
// against the handoff (see newHandoff): the same callers, each sending its
// message to one bare protoactor actor that batches them and waiting for
// its id, the least a publisher does whose messages pass through one
// actor's mailbox (as they pass through a batcher's); and, unordered only, against the self-batching callers (see
// newSelfBatch), who batch under a lock with no consumer at all. Each iteration publishes one message
// through each. It reports msgs/s and CPU time (user+sys of the whole
// process, the in-process server included) per message and heap allocations
// (runtime.MemStats.Mallocs, the whole process, the server included) per
// message and heap bytes allocated (runtime.MemStats.TotalAlloc, likewise)
// per message for each, and sinkbatch's ratios to google (rate-ratio,
// cpu-ratio), to the floor (floor-rate-ratio, floor-cpu-ratio) and to the
// handoff (handoff-rate-ratio, handoff-cpu-ratio), and the handoff's and
// the self-batching callers' msgs/s ratios to the floor
// (handoff-floor-ratio, selfbatch-floor-ratio).
func BenchmarkPublish(b *testing.B) {
	for _, ordered := range []bool{false, true} {
		for _, callers := range []int{256, 2048} {
			name := "unordered"
			if ordered {
				name = fmt.Sprintf("ordered-%dkeys", benchKeys)
			}
			b.Run(fmt.Sprintf("%s/callers=%d", name, callers), func(b *testing.B) { benchCompare(b, ordered, callers) })
		}
	}
}

// usage is the process's user+sys CPU time so far.
func usage(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// drive runs n sends across callers goroutines and returns the wall
// and CPU time they took. send returns the message id.
func drive(b *testing.B, n, callers int, send func(caller, i int) (string, error)) (wall, cpu time.Duration) {
	var (
		next   atomic.Int64
		failed atomic.Int64
		first  atomic.Value
		wg     sync.WaitGroup
	)
	cpu0, t0 := usage(b), time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if id, err := send(c, i); err != nil || id == "" {
					failed.Add(1)
					first.CompareAndSwap(nil, fmt.Sprint(err))
				}
			}
		}()
	}
	wg.Wait()
	wall, cpu = time.Since(t0), usage(b)-cpu0
	require.Zero(b, failed.Load(), "first failure: %v", first.Load())
	return wall, cpu
}

func benchCompare(b *testing.B, ordered bool, callers int) {
	srv := newServer(b)
	ctx := context.Background()
	body := bytes.Repeat([]byte{'x'}, benchBody)
	key := func(caller int) string {
		if !ordered {
			return ""
		}
		return fmt.Sprint("key-", caller%benchKeys)
	}

	client, err := gpubsub.NewClient(ctx, "p",
		option.WithEndpoint(srv.Addr),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	require.NoError(b, err)
	defer func() { require.NoError(b, client.Close()) }()
	pub := client.Publisher(testTopic)
	pub.PublishSettings.CountThreshold = benchMaxCount
	pub.PublishSettings.DelayThreshold = benchDelay
	pub.PublishSettings.ByteThreshold = 9_000_000 // not the binding threshold, as for sinkbatch
	pub.EnableMessageOrdering = ordered
	defer pub.Stop()

	c := newCodec(b, srv.Addr, testTopic, codec.Tuning{MaxEntries: benchMaxCount, Linger: benchDelay})
	inst := startInstance(b)

	// Names made once, so that neither side pays for formatting them.
	tenants, keys := make([]string, callers), make([]string, callers)
	for i := range callers {
		tenants[i], keys[i] = fmt.Sprint("t", i%8), key(i)
	}
	google := func(n int) (time.Duration, time.Duration) {
		return drive(b, n, callers, func(caller, _ int) (string, error) {
			return pub.Publish(ctx, &gpubsub.Message{Data: body, OrderingKey: keys[caller]}).Get(ctx)
		})
	}
	sinkbatch := func(n int) (time.Duration, time.Duration) {
		return drive(b, n, callers, func(caller, _ int) (string, error) {
			return inst.Deliver(ctx, c, codec.Message{Tenant: tenants[caller], Group: keys[caller], Body: body})
		})
	}
	floor := newFloor(b, srv.Addr, body, keys)
	g, s, f := &side{name: "google", run: google}, &side{name: "sinkbatch", run: sinkbatch}, &side{name: "floor", run: floor}
	var h, sb *side // the handoff and self-batching baselines; unordered only
	order := []*side{g, s, f}
	if !ordered {
		send := newHandoff(b, srv.Addr, body, callers)
		h = &side{name: "handoff", run: func(n int) (time.Duration, time.Duration) { return drive(b, n, callers, send) }}
		self := newSelfBatch(b, srv.Addr, body, callers)
		sb = &side{name: "selfbatch", run: func(n int) (time.Duration, time.Duration) { return drive(b, n, callers, self) }}
		order = []*side{g, s, h, sb, f}
	}
	// Halves in the order google, sinkbatch, (handoff, selfbatch,) floor, then back,
	// so that none always runs first or last.
	first, second := b.N/2, b.N-b.N/2
	b.ReportAllocs()
	b.ResetTimer()
	for _, x := range order {
		x.measure(first)
		srv.ClearMessages()
	}
	for _, x := range slices.Backward(order) {
		x.measure(second)
		srv.ClearMessages()
	}
	b.StopTimer()

	n := float64(b.N)
	gRate, sRate, fRate := n/g.wall.Seconds(), n/s.wall.Seconds(), n/f.wall.Seconds()
	gCPUPer, sCPUPer, fCPUPer := float64(g.cpu.Microseconds())/n, float64(s.cpu.Microseconds())/n, float64(f.cpu.Microseconds())/n
	b.ReportMetric(sRate, "sinkbatch-msgs/s")
	b.ReportMetric(gRate, "google-msgs/s")
	b.ReportMetric(fRate, "floor-msgs/s")
	b.ReportMetric(sRate/gRate, "rate-ratio")
	b.ReportMetric(sRate/fRate, "floor-rate-ratio")
	b.ReportMetric(sCPUPer, "sinkbatch-cpu-µs/msg")
	b.ReportMetric(gCPUPer, "google-cpu-µs/msg")
	b.ReportMetric(fCPUPer, "floor-cpu-µs/msg")
	b.ReportMetric(sCPUPer/gCPUPer, "cpu-ratio")
	b.ReportMetric(sCPUPer/fCPUPer, "floor-cpu-ratio")
	b.ReportMetric(float64(s.allocs)/n, "sinkbatch-allocs/msg")
	b.ReportMetric(float64(g.allocs)/n, "google-allocs/msg")
	b.ReportMetric(float64(f.allocs)/n, "floor-allocs/msg")
	b.ReportMetric(float64(s.bytes)/n, "sinkbatch-B/msg")
	b.ReportMetric(float64(g.bytes)/n, "google-B/msg")
	b.ReportMetric(float64(f.bytes)/n, "floor-B/msg")
	if h != nil {
		hRate, hCPUPer := n/h.wall.Seconds(), float64(h.cpu.Microseconds())/n
		b.ReportMetric(hRate, "handoff-msgs/s")
		b.ReportMetric(hCPUPer, "handoff-cpu-µs/msg")
		b.ReportMetric(float64(h.allocs)/n, "handoff-allocs/msg")
		b.ReportMetric(float64(h.bytes)/n, "handoff-B/msg")
		b.ReportMetric(sRate/hRate, "handoff-rate-ratio")
		b.ReportMetric(sCPUPer/hCPUPer, "handoff-cpu-ratio")
		b.ReportMetric(hRate/fRate, "handoff-floor-ratio")
		sbRate := n / sb.wall.Seconds()
		b.ReportMetric(sbRate, "selfbatch-msgs/s")
		b.ReportMetric(float64(sb.cpu.Microseconds())/n, "selfbatch-cpu-µs/msg")
		b.ReportMetric(sbRate/fRate, "selfbatch-floor-ratio")
	}
}

// newHandoff returns BenchmarkPublish's handoff baseline: about the least a
// publisher does whose callers each wait for their own message's id and
// whose messages pass through one actor's mailbox, as sinkbatch's pass
// through a batcher's. Each caller sends its reply channel to one protoactor
// actor (the collector, default mailbox); the collector makes requests of
// benchMaxCount messages, or of what came within benchDelay of a request's
// first message, publishes up to floorSenders of them at once through the
// floor's client call, and hands each caller its id over the caller's own
// channel. No tenants, bounds, validation, deadlines or ordering keys. The
// returned send is for drive; the collector stops at clean-up.
func newHandoff(b *testing.B, addr string, body []byte, callers int) func(caller, i int) (string, error) {
	client, err := newAPIClient(addr)
	require.NoError(b, err)
	replies := answerChannels(callers)
	system := testinst.System()
	c := &collector{root: system.Root, slots: make(chan struct{}, floorSenders)}
	c.publish = func(calls []chan answer) { publishAnswering(client, body, calls) }
	pid := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return c }))
	b.Cleanup(func() {
		require.NoError(b, system.Root.StopFuture(pid).Wait())
		c.workers.Wait()
		require.NoError(b, client.Close())
		system.Shutdown()
	})
	return func(caller, _ int) (string, error) {
		system.Root.Send(pid, replies[caller])
		a := <-replies[caller]
		return a.id, a.err
	}
}

// collector is the handoff's actor: it batches the reply channels sent to
// it and publishes each batch on a goroutine of its own.
type collector struct {
	root    *actor.RootContext
	publish func(calls []chan answer)
	slots   chan struct{} // at most floorSenders publish at once
	workers sync.WaitGroup
	batch   []chan answer
	gen     int // counts the batches taken; a linger of an older one does nothing
}

// linger is what the collector's timer sends it benchDelay after a batch's
// first message.
type linger struct{ gen int }

func (c *collector) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case chan answer:
		c.batch = append(c.batch, m)
		if len(c.batch) == 1 {
			self, l := ctx.Self(), &linger{gen: c.gen}
			time.AfterFunc(benchDelay, func() { c.root.Send(self, l) })
		}
		if len(c.batch) == benchMaxCount {
			c.take()
		}
	case *linger:
		if m.gen == c.gen {
			c.take()
		}
	}
}

// take publishes the batch and starts the next.
func (c *collector) take() {
	calls := c.batch
	c.batch = make([]chan answer, 0, benchMaxCount)
	c.gen++
	c.slots <- struct{}{}
	c.workers.Go(func() {
		defer func() { <-c.slots }()
		c.publish(calls)
	})
}

// answer is a handoff or self-batching caller's message id or error.
type answer struct {
	id  string
	err error
}

// answerChannels makes one answer channel per caller, who waits for one
// answer at a time.
func answerChannels(callers int) []chan answer {
	replies := make([]chan answer, callers)
	for i := range replies {
		replies[i] = make(chan answer, 1)
	}
	return replies
}

// publishAnswering publishes one message of body per call through client
// as the floor does, and answers each call with its message's id.
func publishAnswering(client *apiv1.TopicAdminClient, body []byte, calls []chan answer) {
	protos := make([]pubsubpb.PubsubMessage, len(calls))
	msgs := make([]*pubsubpb.PubsubMessage, len(calls))
	for j := range msgs {
		protos[j].Data = body
		msgs[j] = &protos[j]
	}
	resp, err := client.Publish(context.Background(), &pubsubpb.PublishRequest{Topic: testTopic, Messages: msgs}, floorCallOpts...)
	if err == nil && len(resp.MessageIds) != len(calls) {
		err = fmt.Errorf("%d ids for %d messages", len(resp.MessageIds), len(calls))
	}
	for j, reply := range calls {
		if err != nil {
			reply <- answer{err: err}
		} else {
			reply <- answer{id: resp.MessageIds[j]}
		}
	}
}

// floorCallOpts are the per-call options the codec calls Publish with.
var floorCallOpts = []gax.CallOption{gax.WithRetry(nil), gax.WithTimeout(pubsub.DefaultTimeout)}

// newSelfBatch returns BenchmarkPublish's self-batching baseline: waiting
// callers with no consumer between them and their request. Each caller
// appends its reply channel to a shared batch under a mutex; the caller
// that fills it to benchMaxCount, or a timer benchDelay after the batch's
// first message, publishes it on a goroutine of its own (at most
// floorSenders at once) through the floor's client call, which hands each
// caller its id. No tenants, bounds, validation, deadlines, actors or
// ordering keys. The returned send is for drive.
func newSelfBatch(b *testing.B, addr string, body []byte, callers int) func(caller, i int) (string, error) {
	client, err := newAPIClient(addr)
	require.NoError(b, err)
	replies := answerChannels(callers)
	var (
		slots   = make(chan struct{}, floorSenders)
		workers sync.WaitGroup
		mu      sync.Mutex
		batch   []chan answer
		gen     int // counts the batches taken; a linger timer of an older one does nothing
		linger  *time.Timer
	)
	b.Cleanup(func() {
		workers.Wait()
		require.NoError(b, client.Close())
	})
	publish := func(calls []chan answer) {
		slots <- struct{}{}
		workers.Go(func() {
			defer func() { <-slots }()
			publishAnswering(client, body, calls)
		})
	}
	// take hands over the batch; mu is held.
	take := func() []chan answer {
		calls := batch
		batch = make([]chan answer, 0, benchMaxCount)
		gen++
		return calls
	}
	return func(caller, _ int) (string, error) {
		var full []chan answer
		mu.Lock()
		batch = append(batch, replies[caller])
		if len(batch) == 1 {
			g := gen
			linger = time.AfterFunc(benchDelay, func() {
				mu.Lock()
				if gen != g {
					mu.Unlock()
					return
				}
				calls := take()
				mu.Unlock()
				publish(calls)
			})
		}
		if len(batch) == benchMaxCount {
			linger.Stop()
			full = take()
		}
		mu.Unlock()
		if full != nil {
			publish(full)
		}
		a := <-replies[caller]
		return a.id, a.err
	}
}

// side is one of BenchmarkPublish's ways to publish and what it took.
type side struct {
	name   string
	run    func(n int) (wall, cpu time.Duration)
	wall   time.Duration
	cpu    time.Duration
	allocs uint64
	bytes  uint64
}

// measure publishes n messages through s and adds what that took. It
// starts after a collection (untimed), so that each side pays for the
// garbage it makes rather than for what the side before it left. The
// goroutines s starts carry the label side=s.name, so that a CPU profile can
// be cut by side (go tool pprof -tagfocus side=sinkbatch).
func (s *side) measure(n int) {
	runtime.GC()
	a0, b0 := mallocs()
	pprof.Do(context.Background(), pprof.Labels("side", s.name), func(context.Context) {
		w, c := s.run(n)
		s.wall += w
		s.cpu += c
	})
	a1, b1 := mallocs()
	s.allocs += a1 - a0
	s.bytes += b1 - b0
}

// mallocs is the number of heap objects, and their bytes, the process has
// allocated so far.
func mallocs() (objects, bytes uint64) {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs, m.TotalAlloc
}

// newFloor returns the floor of BenchmarkPublish: a function that publishes
// n messages of body (ordering keys taken from keys in turn, one key per
// request) as pre-built requests of benchMaxCount messages, from
// floorSenders goroutines, through a TopicAdminClient dialled and called as
// the codec dials and calls it, and returns the wall and CPU time taken.
func newFloor(b *testing.B, addr string, body []byte, keys []string) func(n int) (time.Duration, time.Duration) {
	client, err := newAPIClient(addr) // the options the codec dials with for Insecure
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, client.Close()) })

	var distinct []string // the keys, each once, in first-seen order
	seen := map[string]bool{}
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			distinct = append(distinct, k)
		}
	}
	reqs := make([]*pubsubpb.PublishRequest, len(distinct))
	for i, k := range distinct {
		msgs := make([]*pubsubpb.PubsubMessage, benchMaxCount)
		for j := range msgs {
			msgs[j] = &pubsubpb.PubsubMessage{Data: body, OrderingKey: k}
		}
		reqs[i] = &pubsubpb.PublishRequest{Topic: testTopic, Messages: msgs}
	}
	return func(n int) (wall, cpu time.Duration) {
		var (
			next   atomic.Int64
			failed atomic.Int64
			first  atomic.Value
			wg     sync.WaitGroup
		)
		requests := (n + benchMaxCount - 1) / benchMaxCount
		cpu0, t0 := usage(b), time.Now()
		for range floorSenders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					k := int(next.Add(1)) - 1
					if k >= requests {
						return
					}
					req := reqs[k%len(reqs)]
					if rest := n - k*benchMaxCount; rest < benchMaxCount {
						req = &pubsubpb.PublishRequest{Topic: req.Topic, Messages: req.Messages[:rest]}
					}
					resp, err := client.Publish(context.Background(), req, floorCallOpts...)
					if err == nil && len(resp.MessageIds) != len(req.Messages) {
						err = fmt.Errorf("%d ids for %d messages", len(resp.MessageIds), len(req.Messages))
					}
					if err != nil {
						failed.Add(1)
						first.CompareAndSwap(nil, err.Error())
					}
				}
			}()
		}
		wg.Wait()
		wall, cpu = time.Since(t0), usage(b)-cpu0
		require.Zero(b, failed.Load(), "first failure: %v", first.Load())
		return wall, cpu
	}
}

// jsonBody returns a JSON event of exactly n bytes (n ≥ 300) of the kind
// services publish: ids, timestamps, names and a list of line items, drawn
// from r so that no two bodies are alike.
func jsonBody(r *mrand.Rand, n int) []byte {
	words := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"}
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"event_id":"%08x-%04x-%04x-%04x-%012x","type":"order.created","ts":"2026-12-01T%02d:%02d:%02d.%03dZ",`,
		r.Uint32(), r.Uint32()&0xffff, r.Uint32()&0xffff, r.Uint32()&0xffff, r.Uint64()&0xffffffffffff,
		r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1000))
	fmt.Fprintf(&b, `"customer":{"id":"c-%d","email":"%s.%s@example.com","tier":"%s"},"items":[`,
		r.IntN(1e6), words[r.IntN(10)], words[r.IntN(10)], []string{"free", "pro", "enterprise"}[r.IntN(3)])
	for i := 0; b.Len() < n-120; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%05d","name":"%s %s","qty":%d,"price":%d.%02d}`,
			r.IntN(1e5), words[r.IntN(10)], words[r.IntN(10)], 1+r.IntN(9), r.IntN(500), r.IntN(100))
	}
	b.WriteString(`],"note":"`)
	for b.Len() < n-2 {
		b.WriteString(words[r.IntN(10)][:1])
	}
	b.WriteString(`"}`)
	return b.Bytes()[:n:n]
}

// BenchmarkCompression publishes requests of 1 KiB JSON bodies through two
// codecs on one server, in one run: CompressionBytesThreshold 0 (off) and 1
// (every request gzip-compressed). Each iteration publishes one message
// through each; 4 goroutines each send whole requests. It reports, for
// both, bytes on the wire per message (compressed payload and gRPC framing,
// as the server received them), CPU time per message (user+sys of the whole
// process: the in-process server's decompression is included) and msgs/s,
// and the gzip/off ratios.
func BenchmarkCompression(b *testing.B) {
	for _, perRequest := range []int{10, 1000} {
		b.Run(fmt.Sprintf("messages=%d", perRequest), func(b *testing.B) { benchCompression(b, perRequest) })
	}
}

func benchCompression(b *testing.B, perRequest int) {
	const (
		bodyBytes = 1024
		senders   = 4
		bodies    = 4096 // distinct bodies, reused round-robin
	)
	srv := newServer(b)
	addr, wire := newWireServer(b, srv)
	newC := func(threshold int) *pubsub.Codec {
		c, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: addr, Insecure: true, CompressionBytesThreshold: threshold})
		require.NoError(b, err)
		b.Cleanup(func() { require.NoError(b, c.Close()) })
		return c
	}
	plain, gz := newC(0), newC(1)
	r := mrand.New(mrand.NewPCG(1, 2))
	msgs := make([]codec.Message, bodies)
	for i := range msgs {
		msgs[i] = codec.Message{Body: jsonBody(r, bodyBytes)}
	}

	// run publishes n messages through c in requests of perRequest and
	// returns the wall time, CPU time and bytes on the wire they took.
	run := func(c *pubsub.Codec, n int) (wall, cpu time.Duration, onWire int) {
		var (
			next atomic.Int64
			wg   sync.WaitGroup
		)
		requests := (n + perRequest - 1) / perRequest
		cpu0, t0 := usage(b), time.Now()
		for range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				batch := make([]codec.Message, 0, perRequest)
				for {
					k := int(next.Add(1)) - 1
					if k >= requests {
						return
					}
					batch = batch[:0]
					for j := k * perRequest; j < min(n, (k+1)*perRequest); j++ {
						batch = append(batch, msgs[j%bodies])
					}
					res, err := c.SendBatch(context.Background(), batch)
					for i := 0; err == nil && i < len(res); i++ {
						err = res[i].Err
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		wall, cpu = time.Since(t0), usage(b)-cpu0
		for _, call := range wire.take() {
			onWire += call.wire
		}
		srv.ClearMessages()
		return wall, cpu, onWire
	}

	var pWall, pCPU, gWall, gCPU time.Duration
	var pWire, gWire int
	add := func(wall, cpu *time.Duration, bytes *int) func(time.Duration, time.Duration, int) {
		return func(w, c time.Duration, n int) { *wall += w; *cpu += c; *bytes += n }
	}
	first, second := b.N/2, b.N-b.N/2
	b.ReportAllocs()
	b.ResetTimer()
	add(&pWall, &pCPU, &pWire)(run(plain, first))
	add(&gWall, &gCPU, &gWire)(run(gz, first))
	add(&gWall, &gCPU, &gWire)(run(gz, second))
	add(&pWall, &pCPU, &pWire)(run(plain, second))
	b.StopTimer()

	n := float64(b.N)
	b.ReportMetric(float64(pWire)/n, "off-wire-B/msg")
	b.ReportMetric(float64(gWire)/n, "gzip-wire-B/msg")
	b.ReportMetric(float64(gWire)/float64(pWire), "wire-ratio")
	b.ReportMetric(float64(pCPU.Microseconds())/n, "off-cpu-µs/msg")
	b.ReportMetric(float64(gCPU.Microseconds())/n, "gzip-cpu-µs/msg")
	b.ReportMetric(float64(gCPU)/float64(pCPU), "cpu-ratio")
	b.ReportMetric(n/pWall.Seconds(), "off-msgs/s")
	b.ReportMetric(n/gWall.Seconds(), "gzip-msgs/s")
}

// BenchmarkSendBatch publishes one request of 10 and of 1000 100-byte
// messages per iteration through the codec, and, as the baseline in the
// same run, the same messages pre-built as a PublishRequest through the
// same TopicAdminClient call with the codec's call options. The difference
// is the codec's own cost: validation, sizing, mapping and results.
func BenchmarkSendBatch(b *testing.B) {
	for _, n := range []int{10, benchMaxCount} {
		b.Run(fmt.Sprintf("messages=%d", n), func(b *testing.B) {
			srv := newServer(b)
			body := bytes.Repeat([]byte{'x'}, benchBody)
			batch := make([]codec.Message, n)
			msgs := make([]*pubsubpb.PubsubMessage, n)
			for i := range batch {
				batch[i] = codec.Message{Body: body}
				msgs[i] = &pubsubpb.PubsubMessage{Data: body}
			}
			b.Run("client", func(b *testing.B) {
				client, err := newAPIClient(srv.Addr)
				require.NoError(b, err)
				b.Cleanup(func() { require.NoError(b, client.Close()) })
				req := &pubsubpb.PublishRequest{Topic: testTopic, Messages: msgs}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := client.Publish(b.Context(), req, floorCallOpts...); err != nil {
						b.Fatal(err)
					}
					srv.ClearMessages()
				}
			})
			b.Run("codec", func(b *testing.B) {
				c := newCodec(b, srv.Addr, testTopic, codec.Tuning{})
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.SendBatch(b.Context(), batch); err != nil {
						b.Fatal(err)
					}
					srv.ClearMessages()
				}
			})
		})
	}
}
