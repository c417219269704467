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
	InFlight    int // requests in flight
}

// Outcome is how a batcher answered a delivery.
type Outcome int

// The outcomes the deliveries counter tells apart.
const (
	OutcomeOK        Outcome = iota // the destination accepted the message
	OutcomeRefused                  // *messages.RetryAfterError: the queue was full
	OutcomePermanent                // codec.IsPermanent: never to be sent again
	OutcomeRetryable                // any other failure the caller may retry
	OutcomeDeadline                 // the caller's deadline passed (context.DeadlineExceeded)
	OutcomeDown                     // messages.ErrBatcherDown: the batcher crashed
	OutcomeStopped                  // messages.ErrStopped: the instance stopped
)

func (o Outcome) String() string {
	switch o {
	case OutcomeOK:
		return "ok"
	case OutcomeRefused:
		return "refused"
	case OutcomePermanent:
		return "permanent"
	case OutcomeRetryable:
		return "retryable"
	case OutcomeDeadline:
		return "deadline"
	case OutcomeDown:
		return "down"
	case OutcomeStopped:
		return "stopped"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// DeliveryRecorder is implemented by a SinkRecorder that also records each
// delivery a batcher answers and how long each waited in the queue. A
// batcher checks for it once, when it starts; a SinkRecorder without it
// records flushes and refusals only. Its methods are called on the delivery
// path: they must not block or allocate.
type DeliveryRecorder interface {
	// Answered records one delivery a batcher answered.
	Answered(o Outcome)
	// Waited records the time from a delivery's admission to the start of
	// the request that carries it.
	Waited(d time.Duration)
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
