package adversary_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// adv16Child names the scenario a re-executed test binary runs: a process
// that may die cannot be judged from inside.
const adv16Child = "SINKBATCH_ADV16_CHILD"

// runAdv16Child re-runs the test binary on test name with scenario set, and
// returns its exit error and output.
func runAdv16Child(t *testing.T, name, scenario string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), adv16Child+"="+scenario)
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
// Err is a non-nil interface holding a nil pointer: Go's typed-nil error,
// the commonest error bug there is. The same for the batch error. The
// package doc (actors/doc.go, Failure) contains a misbehaving codec to the
// batch it sent: "one that panics in SendBatch, or returns the wrong number
// of results, fails that batch only", and a batcher that panics "is
// restarted at once". Before, the batcher's own code on the request
// goroutine (learn: codec.IsThrottled, which calls (*EntryError).Is on the
// nil pointer) panicked outside any recover, and the whole process died:
// nobody was answered, every other destination was gone too. An error
// whose methods panic did the same. Now such an error is read once under
// SendBatch's recover and answered as one wrapping codec.ErrCodecPanic
// (retryable). One from Validate reached the caller as it was, whose own
// reading of it panicked; it is now a permanent ErrCodecPanic.
func TestAdv16TypedNilEntryErrorIsContained(t *testing.T) {
	if s := os.Getenv(adv16Child); s != "" {
		adv16TypedNilChild(t, s)
		return
	}
	for _, scenario := range []string{"result", "batch", "panicking", "validate"} {
		t.Run(scenario, func(t *testing.T) {
			out, err := runAdv16Child(t, "TestAdv16TypedNilEntryErrorIsContained", scenario)
			if err != nil || !strings.Contains(out, "ADV16 ANSWERED") {
				lines := strings.Split(out, "\n")
				if len(lines) > 30 {
					lines = lines[:30]
				}
				t.Fatalf("a codec answering with an error the batcher cannot read (%s): the process died, or its caller was not answered with codec.ErrCodecPanic (%v):\n%s", scenario, err, strings.Join(lines, "\n"))
			}
		})
	}
}

func adv16TypedNilChild(t *testing.T, scenario string) {
	_, inst := testinst.Start(t, actors.Config{Name: "typednil"})
	c := fakecodec.New("typednil-"+scenario, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		var failure *codec.EntryError // set only when an entry fails
		res := make([]codec.Result, len(batch))
		for i := range batch {
			res[i] = codec.Result{ID: fmt.Sprint("id-", i), Err: failure}
		}
		if scenario == "panicking" {
			res[0].Err = adv16PanickingError{}
		}
		if scenario == "batch" {
			var batchErr *codec.EntryError
			return res, batchErr
		}
		return res, nil
	}
	var dest codec.Codec = c
	if scenario == "validate" {
		dest = adv16Validator{c}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := inst.Deliver(ctx, dest, codec.Message{Body: []byte("x")})
	fmt.Printf("ADV16 ANSWERED: %v\n", err)
	require.ErrorIs(t, err, codec.ErrCodecPanic, "a typed-nil error is not answered as an error the batcher could not read")
	// From Validate, the same message gets the same error: permanent.
	require.Equal(t, scenario == "validate", codec.IsPermanent(err), "%v", err)
	// The instance still serves another destination.
	ok := fakecodec.New("typednil-ok", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	_, err = inst.Deliver(ctx, ok, codec.Message{Body: []byte("y")})
	require.NoError(t, err)
}

// adv16PanickingError is an error whose every method panics.
type adv16PanickingError struct{}

func (adv16PanickingError) Error() string { panic("Error") }
func (adv16PanickingError) Is(error) bool { panic("Is") }
func (adv16PanickingError) Unwrap() error { panic("Unwrap") }
func (adv16PanickingError) As(any) bool   { panic("As") }

// adv16Validator is a codec whose Validate returns an error whose every
// method panics.
type adv16Validator struct{ *fakecodec.Codec }

func (adv16Validator) Validate(codec.Message) error { return adv16PanickingError{} }
