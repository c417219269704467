package sqs_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// BenchmarkSendBatch sends 10-message requests to kumo through the codec
// and, as the baseline in the same run, as the bare SDK call the codec
// makes. The difference is the codec's cost: validation, mapping, MD5
// checks.
func BenchmarkSendBatch(b *testing.B) {
	for _, size := range []int{100, 10 << 10} {
		b.Run(fmt.Sprintf("body=%dB", size), func(b *testing.B) {
			e := newKumo(b)
			q := e.createQueue(b, false, false)
			batch := batchOf("bench", 0, sqs.MaxEntries, 1)
			for i := range batch {
				batch[i].Group = ""
				batch[i].Body = bytes.Repeat([]byte("x"), size)
			}
			b.Run("sdk", func(b *testing.B) {
				entries := make([]types.SendMessageBatchRequestEntry, len(batch))
				for i, m := range batch {
					entries[i] = types.SendMessageBatchRequestEntry{
						Id:          aws.String(strconv.Itoa(i)),
						MessageBody: aws.String(string(m.Body)),
						MessageAttributes: map[string]types.MessageAttributeValue{
							"n":    {DataType: aws.String("String"), StringValue: aws.String(m.Attributes["n"])},
							"idem": {DataType: aws.String("String"), StringValue: aws.String(m.IdempotencyKey)},
						},
					}
				}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := e.admin.SendMessageBatch(b.Context(), &awssqs.SendMessageBatchInput{QueueUrl: aws.String(q), Entries: entries}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("codec", func(b *testing.B) {
				c, err := sqs.New(sqs.Config{QueueURL: q, AWS: e.cfg, IdempotencyAttribute: "idem", AttributeChecksumsOptional: e.kind == "kumo"})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.SendBatch(b.Context(), batch); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkValidate measures the admission check, which scans every body.
func BenchmarkValidate(b *testing.B) {
	cfg := baseConfig()
	c, err := sqs.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		unit string
		size int
	}{{"ascii", "x", 1 << 10}, {"ascii", "x", 256 << 10}, {"utf8", "ü", 256 << 10}} {
		b.Run(fmt.Sprintf("%s/body=%dB", tc.name, tc.size), func(b *testing.B) {
			m := codec.Message{Body: bytes.Repeat([]byte(tc.unit), tc.size/len(tc.unit)), Attributes: map[string]string{"a": "b"}, IdempotencyKey: "k"}
			b.SetBytes(int64(tc.size))
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Validate(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Parameters of BenchmarkDeliver, shared by sinkbatch and the floor.
const (
	deliverBody  = 100 // bytes
	floorSenders = 8   // goroutines feeding the floor, as many as sinkbatch's default MaxInflight
)

// BenchmarkDeliver compares, in one run on one kumo server and one standard
// queue, sinkbatch (Instance.Deliver through this codec, default tuning: 10
// entries a request, 8 requests in flight) from 256 and 2048 concurrent
// callers, each waiting for its message's id before sending the next, with
// the floor: the bare SendMessageBatch call the codec makes, on a client
// made from the same aws.Config with the same per-call options, fed
// pre-built 10-entry requests of the same 100-byte bodies from 8
// goroutines, with no callers, no validation and no checksum checks. Each
// iteration sends one message through each. The HTTP transport keeps up to
// 64 idle connections, so that neither side pays for new connections.
//
// It reports msgs/s, CPU time (user+sys of the whole process, kumo
// included) per message and heap allocations (runtime.MemStats.Mallocs,
// the whole process, kumo included) per message for both, and sinkbatch's
// ratios to the floor (floor-rate-ratio, floor-cpu-ratio). The queue is
// purged after each half so that kumo's store stays small.
func BenchmarkDeliver(b *testing.B) {
	for _, callers := range []int{256, 2048} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) { benchDeliver(b, callers) })
	}
}

// usage is the process's user+sys CPU time so far.
func usage(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// mallocs is the number of heap objects the process has allocated so far.
func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// side is one of BenchmarkDeliver's two ways to send and what it took.
type side struct {
	name      string
	wall, cpu time.Duration
	allocs    uint64
}

// measure runs f and adds what it took to s. It starts after a collection
// (untimed), so that each side pays for the garbage it makes rather than
// for what the other left. The goroutines f starts carry the label
// side=s.name, so that a CPU profile can be cut by side (go tool pprof
// -tagfocus side=sinkbatch).
func (s *side) measure(b *testing.B, f func()) {
	runtime.GC()
	a0, cpu0, t0 := mallocs(), usage(b), time.Now()
	pprof.Do(context.Background(), pprof.Labels("side", s.name), func(context.Context) { f() })
	s.wall += time.Since(t0)
	s.cpu += usage(b) - cpu0
	s.allocs += mallocs() - a0
}

func benchDeliver(b *testing.B, callers int) {
	e := newKumo(b)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	b.Cleanup(tr.CloseIdleConnections)
	e.cfg.HTTPClient = &http.Client{Transport: tr}
	q := e.createQueue(b, false, false)
	purge := func() {
		_, err := e.admin.PurgeQueue(context.Background(), &awssqs.PurgeQueueInput{QueueUrl: aws.String(q)})
		require.NoError(b, err)
	}
	body := bytes.Repeat([]byte{'x'}, deliverBody)

	c, err := sqs.New(sqs.Config{QueueURL: q, AWS: e.cfg, AttributeChecksumsOptional: true})
	require.NoError(b, err)
	_, inst := testinst.Start(b, actors.Config{})
	tenants := make([]string, callers) // made once, so that no side pays for formatting them
	for i := range tenants {
		tenants[i] = fmt.Sprint("t", i%8)
	}
	sinkbatch := func(n int) func() {
		return func() {
			var (
				next, failed atomic.Int64
				first        atomic.Value
				wg           sync.WaitGroup
			)
			for k := range callers {
				wg.Go(func() {
					m := codec.Message{Tenant: tenants[k], Body: body}
					for int(next.Add(1)) <= n {
						if id, err := inst.Deliver(context.Background(), c, m); err != nil || id == "" {
							failed.Add(1)
							first.CompareAndSwap(nil, fmt.Sprint(err))
						}
					}
				})
			}
			wg.Wait()
			require.Zero(b, failed.Load(), "first failure: %v", first.Load())
		}
	}

	client := awssqs.NewFromConfig(e.cfg) // as the codec makes its own
	callOpt := func(o *awssqs.Options) {  // as the codec's per-call options
		o.DisableMessageChecksumValidation = true
		if o.HTTPClient != nil {
			o.HTTPClient = sqs.ReadOnlyBodies(o.HTTPClient)
		}
	}
	entries := make([]types.SendMessageBatchRequestEntry, sqs.MaxEntries)
	for i := range entries {
		entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(body))}
	}
	floor := func(n int) func() {
		return func() {
			var (
				next, failed atomic.Int64
				first        atomic.Value
				wg           sync.WaitGroup
			)
			requests := (n + sqs.MaxEntries - 1) / sqs.MaxEntries
			for range floorSenders {
				wg.Go(func() {
					for {
						k := int(next.Add(1)) - 1
						if k >= requests {
							return
						}
						in := &awssqs.SendMessageBatchInput{QueueUrl: aws.String(q), Entries: entries[:min(sqs.MaxEntries, n-k*sqs.MaxEntries)]}
						out, err := client.SendMessageBatch(context.Background(), in, callOpt)
						if err == nil && (len(out.Successful) != len(in.Entries) || len(out.Failed) != 0) {
							err = fmt.Errorf("%d successful, %d failed of %d", len(out.Successful), len(out.Failed), len(in.Entries))
						}
						if err != nil {
							failed.Add(1)
							first.CompareAndSwap(nil, err.Error())
						}
					}
				})
			}
			wg.Wait()
			require.Zero(b, failed.Load(), "first failure: %v", first.Load())
		}
	}

	s, f := &side{name: "sinkbatch"}, &side{name: "floor"}
	// Halves in the order sinkbatch, floor, floor, sinkbatch, so that
	// neither always runs first or last.
	first, second := b.N/2, b.N-b.N/2
	b.ReportAllocs()
	b.ResetTimer()
	s.measure(b, sinkbatch(first))
	purge()
	f.measure(b, floor(first))
	purge()
	f.measure(b, floor(second))
	purge()
	s.measure(b, sinkbatch(second))
	purge()
	b.StopTimer()

	n := float64(b.N)
	sRate, fRate := n/s.wall.Seconds(), n/f.wall.Seconds()
	sCPU, fCPU := float64(s.cpu.Microseconds())/n, float64(f.cpu.Microseconds())/n
	b.ReportMetric(sRate, "sinkbatch-msgs/s")
	b.ReportMetric(fRate, "floor-msgs/s")
	b.ReportMetric(sRate/fRate, "floor-rate-ratio")
	b.ReportMetric(sCPU, "sinkbatch-cpu-µs/msg")
	b.ReportMetric(fCPU, "floor-cpu-µs/msg")
	b.ReportMetric(sCPU/fCPU, "floor-cpu-ratio")
	b.ReportMetric(float64(s.allocs)/n, "sinkbatch-allocs/msg")
	b.ReportMetric(float64(f.allocs)/n, "floor-allocs/msg")
}
