package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// visibleLines is what a terminal shows for out: each line as it stands
// after its last clearLine.
func visibleLines(out string) []string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if j := strings.LastIndex(l, clearLine); j >= 0 {
			lines[i] = l[j+len(clearLine):]
		}
	}
	return lines
}

func TestConsoleOnATerminal(t *testing.T) {
	var buf bytes.Buffer
	c := &console{w: &buf, tty: true, width: 20}
	c.progress("1s one")
	fmt.Fprintln(c, "log A")
	c.progress("2s a line too long for the terminal")
	c.endProgress()
	fmt.Fprintln(c, "log B")
	assert.Equal(t,
		clearLine+"1s one"+
			clearLine+"log A\n"+"1s one"+
			clearLine+"2s a line too long "+ // cut to width-1 columns
			"\n"+
			"log B\n",
		buf.String())
	assert.Equal(t, []string{"log A", "2s a line too long ", "log B", ""}, visibleLines(buf.String()))
}

func TestConsoleElsewhere(t *testing.T) {
	var buf bytes.Buffer
	c := &console{w: &buf, width: 20}
	c.progress("1s one")
	fmt.Fprintln(c, "log A")
	c.progress("2s a line too long for the terminal")
	c.endProgress()
	assert.Equal(t, "1s one\nlog A\n2s a line too long for the terminal\n", buf.String())
}

// TestConsoleLogsNeverShareTheProgressLine writes log records and progress
// lines from many goroutines: on the terminal every line shows either a
// whole log record or a whole progress line.
func TestConsoleLogsNeverShareTheProgressLine(t *testing.T) {
	var buf bytes.Buffer
	c := &console{w: &buf, tty: true, width: 200}
	logger := slog.New(slog.NewTextHandler(c, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				logger.Info("event", "g", g, "i", i)
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			c.progress(fmt.Sprintf("%3ds progress", i))
		}
	})
	wg.Wait()
	c.endProgress()

	logs, progress := 0, 0
	for _, l := range visibleLines(buf.String()) {
		switch {
		case l == "":
		case strings.HasPrefix(l, "level=INFO msg=event g="):
			logs++
		case strings.HasSuffix(l, "s progress") && len(l) == len("100s progress"):
			progress++
		default:
			require.Failf(t, "a line mixes a log record and the progress line", "%q", l)
		}
	}
	assert.Equal(t, 800, logs)
	assert.Equal(t, 1, progress, "only the last progress line stays on screen")
}
