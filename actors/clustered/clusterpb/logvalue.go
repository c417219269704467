package clusterpb

import (
	"log/slog"
	"time"
)

// LogValue keeps the payload out of logs: protoactor logs the messages it
// routes at Debug.
func (x *Message) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("tenant", x.GetTenant()),
		slog.String("group", x.GetGroup()),
		slog.Int("bytes", len(x.GetBody())),
	)
}

// LogValue keeps the payload out of logs: protoactor logs the messages it
// routes at Debug.
func (x *DeliverRequest) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("destination", x.GetDestination()),
		slog.Any("message", x.GetMessage()),
		slog.Duration("budget", time.Duration(x.GetBudgetNanos())),
	)
}
