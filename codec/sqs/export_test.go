package sqs

import (
	"context"

	"github.com/ankusa/sinkbatch/codec"
)

// SendUnvalidated is SendBatch without the codec's own validation, so that
// tests can make the server refuse a message the codec would have kept back.
func SendUnvalidated(ctx context.Context, c *Codec, batch []codec.Message) ([]codec.Result, error) {
	return c.send(ctx, batch, func(codec.Message) error { return nil })
}

// AttributesMD5 exposes the MD5OfMessageAttributes computation to tests.
var AttributesMD5 = attributesMD5

// XRayHeader and ValidTraceparent expose the trace context conversion.
var (
	XRayHeader       = xrayHeader
	ValidTraceparent = validTraceparent
)
