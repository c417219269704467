package clusterpb

import (
	"log/slog"
	"time"
)

// LogValue keeps the payload out of logs: protoactor logs the messages it
// routes at Debug.
func (x *DeliverRequest) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("tenant", x.GetTenant()),
		slog.String("group", x.GetGroup()),
		slog.Int("bytes", len(x.GetBody())),
		slog.Duration("budget", time.Duration(x.GetBudgetNanos())),
	)
}

// LogValue keeps the payloads out of logs: protoactor logs the messages it
// routes at Debug.
func (x *DeliverBatch) LogValue() slog.Value {
	bytes := 0
	for _, r := range x.GetRequests() {
		bytes += len(r.GetBody())
	}
	return slog.GroupValue(
		slog.String("destination", x.GetDestination()),
		slog.Int("deliveries", len(x.GetRequests())),
		slog.Int("bytes", bytes),
	)
}
