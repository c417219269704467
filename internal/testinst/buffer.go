package testinst

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer collects what loggers and programs write from any goroutine, for
// a test to read while they go on.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Count is how many times s occurs in what was written so far.
func (b *Buffer) Count(s string) int { return strings.Count(b.String(), s) }
