package adversary_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// childScenario names the scenario a re-executed test binary runs: a process
// that may die cannot be judged from inside.
const childScenario = "SINKBATCH_ADVERSARY_CHILD"

// runChild re-runs the test binary on test name with scenario set, and
// returns its exit error and output.
func runChild(t *testing.T, name, scenario string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), childScenario+"="+scenario)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	return string(out), err
}

// A codec that reports an entry's outcome through a *codec.EntryError
// variable, nil for the entries that succeeded, hands back a Result whose
// Err is a non-nil interface holding a nil pointer (Go's typed-nil error);
// the same for the batch error, and an error whose every method panics.
// The batcher reads such an error once, under SendBatch's recover, and
// answers it as one wrapping codec.ErrCodecPanic (retryable; from Validate,
// permanent): the process lives on, every caller is answered, and the
// instance still serves other destinations. Each scenario runs in a child
// process, since a process that may die cannot be judged from inside.
func TestUnreadableCodecErrorsAreContained(t *testing.T) {
	if s := os.Getenv(childScenario); s != "" {
		unreadableErrorChild(t, s)
		return
	}
	for _, scenario := range []string{"result", "batch", "panicking", "validate"} {
		t.Run(scenario, func(t *testing.T) {
			out, err := runChild(t, "TestUnreadableCodecErrorsAreContained", scenario)
			if err != nil || !strings.Contains(out, "CHILD ANSWERED") {
				lines := strings.Split(out, "\n")
				if len(lines) > 30 {
					lines = lines[:30]
				}
				t.Fatalf("a codec answering with an error the batcher cannot read (%s): the process died, or its caller was not answered with codec.ErrCodecPanic (%v):\n%s", scenario, err, strings.Join(lines, "\n"))
			}
		})
	}
}

func unreadableErrorChild(t *testing.T, scenario string) {
	_, inst := testinst.Start(t, actors.Config{Name: "typednil"})
	c := fakecodec.New("typednil-"+scenario, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		var failure *codec.EntryError // set only when an entry fails
		res := make([]codec.Result, len(batch))
		for i := range batch {
			res[i] = codec.Result{ID: fmt.Sprint("id-", i), Err: failure}
		}
		if scenario == "panicking" {
			res[0].Err = panickingError{}
		}
		if scenario == "batch" {
			var batchErr *codec.EntryError
			return res, batchErr
		}
		return res, nil
	}
	var dest codec.Codec = c
	if scenario == "validate" {
		dest = panickingValidator{c}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := inst.Deliver(ctx, dest, codec.Message{Body: []byte("x")})
	fmt.Printf("CHILD ANSWERED: %v\n", err)
	require.ErrorIs(t, err, codec.ErrCodecPanic, "a typed-nil error is not answered as an error the batcher could not read")
	// From Validate, the same message gets the same error: permanent.
	require.Equal(t, scenario == "validate", codec.IsPermanent(err), "%v", err)
	// The instance still serves another destination.
	ok := fakecodec.New("typednil-ok", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	_, err = inst.Deliver(ctx, ok, codec.Message{Body: []byte("y")})
	require.NoError(t, err)
}

// panickingError is an error whose every method panics.
type panickingError struct{}

func (panickingError) Error() string { panic("Error") }
func (panickingError) Is(error) bool { panic("Is") }
func (panickingError) Unwrap() error { panic("Unwrap") }
func (panickingError) As(any) bool   { panic("As") }

// panickingValidator is a codec whose Validate returns an error whose every
// method panics.
type panickingValidator struct{ *fakecodec.Codec }

func (panickingValidator) Validate(codec.Message) error { return panickingError{} }

// describePanicker is a fake codec whose Describe (codec.Describer, read
// when a traced destination's batcher starts) panics.
type describePanicker struct{ *fakecodec.Codec }

func (describePanicker) Describe() (string, string) { panic("adversary: Describe panics") }

// With tracing on, a codec whose Describe panics (read when its batcher
// starts) does not crash the batcher: the panic is logged once, the spans
// are named by the codec's Name, the destination takes deliveries, and Stop
// answers as Instance.Stop promises.
func TestADescribePanicIsContained(t *testing.T) {
	logs := &testinst.Buffer{}
	system := testinst.System()
	inst, err := actors.Start(system, actors.Config{
		Name:           "describe",
		TracerProvider: noop.NewTracerProvider(),
		Logger:         slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer system.Shutdown()
	c := describePanicker{fakecodec.New("describe", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = inst.Deliver(ctx, c, codec.Message{Body: []byte("x")})
	assert.NoError(t, err)
	assert.Len(t, c.Sent(), 1)
	assert.Zero(t, logs.Count("batcher crashed; restarting it"), "the batcher crashed")
	assert.Equal(t, 1, logs.Count("codec panicked in Describe"), "the panic was not logged once")

	stopCtx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	assert.NoError(t, inst.Stop(stopCtx))
	_, err = inst.Deliver(ctx, c, codec.Message{Body: []byte("y")})
	assert.ErrorIs(t, err, messages.ErrStopped)
}

// A Name, Identity, Limits or Tuning that panics while the destination is
// resolved is answered with a permanent error wrapping codec.ErrCodecPanic,
// which a caller can branch on.
func TestAPanicResolvingTheDestinationIsPermanent(t *testing.T) {
	for _, method := range []string{"Name", "Identity", "Limits", "Tuning"} {
		t.Run(method, func(t *testing.T) {
			_, inst := testinst.Start(t, actors.Config{Name: "meta" + method})
			d := &metaPanicker{method: method}
			ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
			defer cancel()
			_, err := inst.Deliver(ctx, d, codec.Message{Body: []byte("x")})
			require.Error(t, err)
			assert.ErrorIs(t, err, codec.ErrCodecPanic, "%q", err)
			assert.True(t, codec.IsPermanent(err), "%q is retryable: a codec that always panics is retried forever", err)
		})
	}
}

// metaPanicker is a pointer codec that panics in one of its describing
// methods, every time.
type metaPanicker struct{ method string }

func (c *metaPanicker) boom(m string) {
	if c.method == m {
		panic("adversary: " + m + " panics")
	}
}
func (c *metaPanicker) Name() string     { c.boom("Name"); return "meta" }
func (c *metaPanicker) Identity() []byte { c.boom("Identity"); return []byte("meta") }
func (c *metaPanicker) Limits() codec.Limits {
	c.boom("Limits")
	return codec.Limits{MaxEntries: 1, MaxBytes: 100}
}
func (c *metaPanicker) Tuning() codec.Tuning { c.boom("Tuning"); return codec.Tuning{} }
func (c *metaPanicker) Size(m codec.Message) int {
	return len(m.Body)
}
func (c *metaPanicker) SendBatch(context.Context, []codec.Message) ([]codec.Result, error) {
	return nil, fmt.Errorf("adversary: never sent")
}

// A Name that panics when the supervisor spawns the batcher (its second
// call; the first, when the destination was resolved, passed) does not
// crash the supervisor: the delivery it held is answered.
func TestANamePanicAtSpawnIsAnswered(t *testing.T) {
	_, inst := testinst.Start(t, actors.Config{Name: "namespawn"})
	c := &nameOnce{}
	ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
	defer cancel()
	_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte("x")})
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "the delivery was held and never answered: %v", err)
}

// nameOnce is a codec whose Name panics after its first call.
type nameOnce struct{ calls atomic.Int64 }

func (c *nameOnce) Name() string {
	if c.calls.Add(1) > 1 {
		panic("adversary: Name panics after its first call")
	}
	return "nameonce"
}
func (c *nameOnce) Identity() []byte         { return []byte("nameonce") }
func (c *nameOnce) Limits() codec.Limits     { return codec.Limits{MaxEntries: 1, MaxBytes: 100} }
func (c *nameOnce) Tuning() codec.Tuning     { return codec.Tuning{} }
func (c *nameOnce) Size(m codec.Message) int { return len(m.Body) }
func (c *nameOnce) SendBatch(_ context.Context, b []codec.Message) ([]codec.Result, error) {
	return make([]codec.Result, len(b)), nil
}
