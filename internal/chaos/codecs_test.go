package chaos_test

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// realCodec is what the sqs and pubsub codecs implement.
type realCodec interface {
	codec.Codec
	codec.Validator
}

// chaosCodec is a real codec that, while On, panics in SendBatch for some
// batches (before sending, or after the server stored them) and in Size for
// some poison messages, which only that message's caller hears of.
type chaosCodec struct {
	realCodec
	On   atomic.Bool
	Dice *dice

	SendPanicBefore, SendPanicAfter, SizePanic float64

	SendPanics, SizePanics atomic.Int64
}

func (c *chaosCodec) Size(m codec.Message) int {
	if c.On.Load() && strings.Contains(string(m.Body), poisonMark) && c.Dice.chance(c.SizePanic) {
		c.SizePanics.Add(1)
		panic("chaos: Size panics")
	}
	return c.realCodec.Size(m)
}

func (c *chaosCodec) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	if c.On.Load() && c.Dice.chance(c.SendPanicBefore) {
		c.SendPanics.Add(1)
		panic("chaos: SendBatch panics before sending")
	}
	res, err := c.realCodec.SendBatch(ctx, batch)
	if c.On.Load() && c.Dice.chance(c.SendPanicAfter) {
		c.SendPanics.Add(1)
		panic("chaos: SendBatch panics after sending")
	}
	return res, err
}

// shortCodec is a real codec whose SendBatch drops the last result: the
// batcher must answer the batch with codec.ErrResultCount. Its Identity
// differs from the real codec's: codecs of one identity share a batcher, which
// sends through whichever of them it met first.
type shortCodec struct{ realCodec }

func (c shortCodec) Identity() []byte { return append([]byte("short\x00"), c.realCodec.Identity()...) }

func (c shortCodec) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	res, err := c.realCodec.SendBatch(ctx, batch)
	if err != nil || len(res) == 0 {
		return res, err
	}
	return res[:len(res)-1], nil
}

// retuned is a real codec that reports other Limits or another Tuning than
// its own, as a buggy or misconfigured codec would.
type retuned struct {
	realCodec
	limits *codec.Limits
	tuning *codec.Tuning
}

func (c *retuned) Limits() codec.Limits {
	if c.limits != nil {
		return *c.limits
	}
	return c.realCodec.Limits()
}

func (c *retuned) Tuning() codec.Tuning {
	if c.tuning != nil {
		return *c.tuning
	}
	return c.realCodec.Tuning()
}

// crashRecorder is a telemetry.Recorder whose Refused panics now and then
// while On: a bug in the operator's metrics code, which restarts the batcher
// that called it.
type crashRecorder struct {
	On      atomic.Bool
	Dice    *dice
	Chance  float64
	Crashes atomic.Int64
}

func (r *crashRecorder) Sink(string) telemetry.SinkRecorder { return r }
func (r *crashRecorder) Flushed(telemetry.Flush)            {}
func (r *crashRecorder) Refused(messages.FullReason) {
	if r.On.Load() && r.Dice.chance(r.Chance) {
		r.Crashes.Add(1)
		panic("chaos: Recorder.Refused panics")
	}
}
