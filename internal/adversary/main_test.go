package adversary_test

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := goleak.Find(); err != nil && code == 0 {
		fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
		code = 1
	}
	// goleak waited for every goroutine to end, request goroutines too.
	if v := late.all(); len(v) > 0 {
		for _, line := range v {
			fmt.Fprintln(os.Stderr, "FAIL: a promise broken after its round was judged:", line)
		}
		code = 1
	}
	os.Exit(code)
}

// late holds the violations that came after their round's report.
var late lateViolations

type lateViolations struct {
	mu    sync.Mutex
	lines []string
}

func (l *lateViolations) add(seed uint64, kind, what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf("round %d: %s: %s", seed, kind, what))
}

func (l *lateViolations) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// answerWithin is a bound a loaded machine cannot miss for an answer that
// needs no request: it tells an answer from a wait for a deadline.
const answerWithin = 5 * time.Second

func errorsAs(err error, target any) bool { return errors.As(err, target) }
