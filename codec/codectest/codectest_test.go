package codectest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
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

// memCodec is a minimal codec. With fault "" it keeps its contract; any
// other fault breaks one promise, to show that Run notices.
type memCodec struct {
	dst    *memory
	tuning codec.Tuning
	fault  string
}

// The promises a memCodec can break.
const (
	faultNone            = ""
	faultDropAttributes  = "drop-attributes"
	faultSameIDs         = "same-ids"
	faultReverse         = "reverse"
	faultIgnoreContext   = "ignore-context"
	faultRetryableRefuse = "retryable-refusal"
	faultIdentityTuning  = "identity-ignores-tuning"
	faultFlatSize        = "flat-size"
)

func (c *memCodec) Name() string { return "memory" }

func (c *memCodec) Identity() []byte {
	if c.fault == faultIdentityTuning {
		return []byte(c.dst.name)
	}
	return fmt.Appendf(nil, "%s|%+v", c.dst.name, c.tuning)
}

func (c *memCodec) Limits() codec.Limits { return codec.Limits{MaxEntries: 4, MaxBytes: 1 << 10} }

func (c *memCodec) Tuning() codec.Tuning { return c.tuning }

func (c *memCodec) Size(m codec.Message) int {
	n := len(m.Body) + len(m.IdempotencyKey)
	if c.fault == faultFlatSize {
		return n
	}
	for k, v := range m.Attributes {
		n += len(k) + len(v)
	}
	return n
}

func (c *memCodec) Validate(m codec.Message) error {
	if len(m.Body) == 0 {
		return &codec.EntryError{Code: "Empty", Message: "empty body", Permanent: c.fault != faultRetryableRefuse}
	}
	return nil
}

func (c *memCodec) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	if err := ctx.Err(); err != nil && c.fault != faultIgnoreContext {
		return nil, err
	}
	c.dst.mu.Lock()
	defer c.dst.mu.Unlock()
	res := make([]codec.Result, len(batch))
	order := make([]int, len(batch))
	for i := range order {
		order[i] = i
	}
	if c.fault == faultReverse {
		slices.Reverse(order)
	}
	for _, i := range order {
		m := batch[i]
		if err := c.Validate(m); err != nil {
			res[i].Err = err
			continue
		}
		id := fmt.Sprintf("%s-%d", c.dst.name, len(c.dst.msgs))
		if c.fault == faultSameIDs {
			id = c.dst.name
		}
		attrs := m.Attributes
		if c.fault == faultDropAttributes {
			attrs = nil
		}
		c.dst.msgs = append(c.dst.msgs, codectest.Received{
			ID: id, Body: m.Body, Attributes: attrs, Group: m.Group, IdempotencyKey: m.IdempotencyKey,
		})
		res[i].ID = id
	}
	return res, nil
}

type harness struct {
	fault  string
	n      int
	latest *memory
}

func (h *harness) MakeCodec(t *testing.T, tuning codec.Tuning) codec.Codec {
	h.n++
	h.latest = &memory{name: fmt.Sprintf("dst%d", h.n)}
	return &memCodec{dst: h.latest, tuning: tuning, fault: h.fault}
}

func (h *harness) Retune(t *testing.T, c codec.Codec, tuning codec.Tuning) codec.Codec {
	mc, ok := c.(*memCodec)
	if !ok {
		t.Fatalf("not a memory codec: %T", c)
	}
	return &memCodec{dst: mc.dst, tuning: tuning, fault: mc.fault}
}

func (h *harness) Received(t *testing.T) []codectest.Received {
	h.latest.mu.Lock()
	defer h.latest.mu.Unlock()
	return append([]codectest.Received(nil), h.latest.msgs...)
}

func TestRunMemory(t *testing.T) {
	codectest.Run(t, &harness{})
}

// faultEnv names the fault TestRunBroken runs Run against, in a child
// process of TestSuiteCatchesBrokenCodecs.
const faultEnv = "CODECTEST_FAULT"

// TestRunBroken is TestSuiteCatchesBrokenCodecs's child: it fails on
// purpose, and is skipped in a normal run.
func TestRunBroken(t *testing.T) {
	fault := os.Getenv(faultEnv)
	if fault == "" {
		t.Skip("run by TestSuiteCatchesBrokenCodecs")
	}
	codectest.Run(t, &harness{fault: fault})
}

// TestSuiteCatchesBrokenCodecs runs the suite against codecs that each break
// one promise and checks that the subtest guarding it fails.
func TestSuiteCatchesBrokenCodecs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the test binary again")
	}
	tests := []struct {
		fault, failing string
	}{
		{faultDropAttributes, "SendBatchFull"},
		{faultSameIDs, "SendBatchFull"},
		{faultReverse, "GroupOrder"},
		{faultIgnoreContext, "CancelledContext"},
		{faultRetryableRefuse, "Validate"},
		{faultIdentityTuning, "NameAndIdentity"},
		{faultFlatSize, "Size"},
	}
	for _, tt := range tests {
		t.Run(tt.fault, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestRunBroken$", "-test.v")
			cmd.Env = append(os.Environ(), faultEnv+"="+tt.fault)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !assert.True(t, errors.As(err, &exit), "the suite passed a codec with fault %s:\n%s", tt.fault, out) {
				return
			}
			assert.Contains(t, string(out), "--- FAIL: TestRunBroken/"+tt.failing+" ", "output:\n%s", out)
		})
	}
}
