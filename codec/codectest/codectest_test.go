package codectest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/codectest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memory is a destination that stores what it is sent.
type memory struct {
	mu   sync.Mutex
	name string
	msgs []codectest.Received
}

// memCodec is a minimal well-behaved codec, to show that Run passes a codec
// that keeps its contract.
type memCodec struct {
	dst    *memory
	tuning codec.Tuning
}

func (c *memCodec) Name() string { return "memory" }
func (c *memCodec) Identity() []byte {
	return fmt.Appendf(nil, "%s|%+v", c.dst.name, c.tuning)
}
func (c *memCodec) Limits() codec.Limits { return codec.Limits{MaxEntries: 4, MaxBytes: 1 << 10} }
func (c *memCodec) Tuning() codec.Tuning { return c.tuning }
func (c *memCodec) Size(m codec.Message) int {
	n := len(m.Body) + len(m.IdempotencyKey)
	for k, v := range m.Attributes {
		n += len(k) + len(v)
	}
	return n
}

func (c *memCodec) Validate(m codec.Message) error {
	if len(m.Body) == 0 {
		return &codec.EntryError{Code: "Empty", Message: "empty body", Permanent: true}
	}
	return nil
}

func (c *memCodec) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.dst.mu.Lock()
	defer c.dst.mu.Unlock()
	res := make([]codec.Result, len(batch))
	for i, m := range batch {
		if err := c.Validate(m); err != nil {
			res[i].Err = err
			continue
		}
		id := fmt.Sprintf("%s-%d", c.dst.name, len(c.dst.msgs))
		c.dst.msgs = append(c.dst.msgs, codectest.Received{
			ID: id, Body: m.Body, Attributes: m.Attributes, Group: m.Group, IdempotencyKey: m.IdempotencyKey,
		})
		res[i].ID = id
	}
	return res, nil
}

type harness struct {
	n      int
	latest *memory
}

func (h *harness) MakeCodec(t *testing.T, tuning codec.Tuning) codec.Codec {
	h.n++
	h.latest = &memory{name: fmt.Sprintf("dst%d", h.n)}
	return &memCodec{dst: h.latest, tuning: tuning}
}

func (h *harness) Retune(t *testing.T, c codec.Codec, tuning codec.Tuning) codec.Codec {
	mc, ok := c.(*memCodec)
	if !ok {
		t.Fatalf("not a memory codec: %T", c)
	}
	return &memCodec{dst: mc.dst, tuning: tuning}
}

func (h *harness) Received(t *testing.T) []codectest.Received {
	h.latest.mu.Lock()
	defer h.latest.mu.Unlock()
	return append([]codectest.Received(nil), h.latest.msgs...)
}

func TestRunMemory(t *testing.T) {
	codectest.Run(t, &harness{})
}
