package actors_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/manybench"
)

// BenchmarkLightLoad measures Linger's promise at light load: one caller
// sends to one destination (Linger 5ms) one message at a time, waiting for
// each answer, with requests that take 0 and 20ms. Each iteration is one
// message. It reports the p50 and p90 of a message's time from Deliver to its
// answer, and the p50 over Linger plus the request time (p50-ratio; the
// promise is at most 1, plus what scheduling adds).
func BenchmarkLightLoad(b *testing.B) {
	const linger = 5 * time.Millisecond
	for _, latency := range []time.Duration{0, 20 * time.Millisecond} {
		b.Run(fmt.Sprintf("request=%v", latency), func(b *testing.B) {
			_, inst := start(b, actors.Config{})
			c := fakecodec.New("light", codec.Limits{MaxEntries: 1000, MaxBytes: 1 << 20})
			c.Tune = codec.Tuning{Linger: linger}
			c.Latency = latency
			c.Discard = true
			m := codec.Message{Body: []byte("light")}
			took := make([]float64, 0, b.N)
			for b.Loop() {
				t0 := time.Now()
				if _, err := inst.Deliver(context.Background(), c, m); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(t0).Seconds())
			}
			p50 := manybench.Median(took) // sorts took
			b.ReportMetric(p50*1e3, "p50-ms")
			b.ReportMetric(took[len(took)*9/10]*1e3, "p90-ms")
			b.ReportMetric(p50/(linger+latency).Seconds(), "p50-ratio")
		})
	}
}
