package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
)

// console is the demo's stderr: the logger, flag errors and the progress
// line all write through it, one whole line per call, under one lock.
//
// On a terminal the progress line is a status line redrawn in place at the
// bottom: a log line first clears it, and it is drawn again below the log
// line, so the two never share a line and the logs scroll above it. It is
// cut to the terminal's width ($COLUMNS, else 80), since a wrapped line
// cannot be cleared in place. Anywhere else (a file, a pipe, a test) each
// progress line is an ordinary line.
type console struct {
	mu     sync.Mutex
	w      io.Writer
	tty    bool
	width  int    // columns a status line may use; tty only
	status string // the status line on screen, without a newline; "" when none is
}

// clearLine returns the cursor to the line's start and erases the line.
const clearLine = "\r\x1b[K"

func newConsole(w io.Writer) *console {
	c := &console{w: w, tty: isTerminal(w), width: 80}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 1 {
		c.width = n
	}
	return c
}

// isTerminal reports whether w is a character device, as a terminal is.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Write writes p, which ends a line (a log record, a message), above the
// status line.
func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status == "" {
		return c.w.Write(p)
	}
	_, _ = io.WriteString(c.w, clearLine)
	n, err := c.w.Write(p)
	_, _ = io.WriteString(c.w, c.status)
	return n, err
}

// progress shows line, which has no newline, as the progress line.
func (c *console) progress(line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.tty {
		fmt.Fprintln(c.w, line)
		return
	}
	if len(line) > c.width-1 { // the line is ASCII
		line = line[:c.width-1]
	}
	c.status = line
	_, _ = io.WriteString(c.w, clearLine+line)
}

// endProgress leaves the last progress line on screen as an ordinary line;
// later writes go below it.
func (c *console) endProgress() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status != "" {
		_, _ = io.WriteString(c.w, "\n")
		c.status = ""
	}
}
