package sqs

import (
	"context"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

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

// ReadOnlyBodies wraps an HTTP client as SendBatch does for each call, so
// that a benchmark's bare SDK calls take the same path.
func ReadOnlyBodies(c awssqs.HTTPClient) awssqs.HTTPClient { return readOnlyBodies{c} }
