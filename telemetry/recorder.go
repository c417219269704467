package telemetry

import (
	"fmt"
	"time"

	"github.com/ankusa/sinkbatch/messages"
)

// Trigger says what made a batcher send a batch.
type Trigger int

// The reasons a batch goes out.
const (
	TriggerEntries Trigger = iota // the sendable entries reached MaxEntries
	TriggerBytes                  // the sendable entries reached MaxBytes
	TriggerLinger                 // Linger passed since the queue became non-empty or the last batch left
	TriggerDrain                  // the instance is stopping and sends everything at once
)

func (t Trigger) String() string {
	switch t {
	case TriggerEntries:
		return "entries"
	case TriggerBytes:
		return "bytes"
	case TriggerLinger:
		return "linger"
	case TriggerDrain:
		return "drain"
	}
	return fmt.Sprintf("Trigger(%d)", int(t))
}

// Flush describes one batch once its last request has been answered.
type Flush struct {
	Trigger    Trigger
	Entries    int
	Bytes      int
	Requests   int           // requests the batch took, bisections included
	Bisections int           // the extra requests spent isolating refused messages
	Duration   time.Duration // from the first request's start to the last one's answer
}

// Gauges is a snapshot of an instance's queue state.
type Gauges struct {
	Batchers    int
	Queued      int
	QueuedBytes int64
}

// Recorder receives an instance's reports. Implementations must be safe for
// concurrent use and must not block: batchers call them from their Receive and
// from request goroutines.
type Recorder interface {
	// Sink returns the recorder for one codec kind (Codec.Name()). A batcher
	// calls it once when it starts, so an implementation can build its
	// attribute sets there and nowhere on the delivery path.
	Sink(sink string) SinkRecorder
}

// SinkRecorder receives one sink kind's reports.
type SinkRecorder interface {
	// Flushed reports a batch once its last request has been answered.
	Flushed(f Flush)
	// Refused reports a delivery refused because the queue was full.
	Refused(reason messages.FullReason)
}

// Nop is a Recorder that records nothing.
type Nop struct{}

// Sink returns a SinkRecorder that records nothing.
func (Nop) Sink(string) SinkRecorder { return Nop{} }

// Flushed does nothing.
func (Nop) Flushed(Flush) {}

// Refused does nothing.
func (Nop) Refused(messages.FullReason) {}
