package sqs

import (
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ankusa/sinkbatch/codec"
)

// TracePropagation says how a message's trace context (codec.Message.Trace,
// set by the batcher when the instance traces) travels to its consumers.
type TracePropagation int

// The ways a trace context can travel. The zero value is TraceAWSHeader.
const (
	// TraceAWSHeader carries it in the AWSTraceHeader message system
	// attribute, in AWS X-Ray's format
	// (Root=1-<8 hex>-<24 hex>;Parent=<16 hex>;Sampled=<0|1>), which the
	// X-Ray SDKs, Lambda and the OpenTelemetry X-Ray propagator read. It
	// costs none of the 10 message attributes.
	TraceAWSHeader TracePropagation = iota
	// TraceW3CAttributes carries it as the W3C message attributes
	// "traceparent" and, when not empty, "tracestate", as the
	// OpenTelemetry text-map propagator reads them. They count toward the
	// 10 message attributes and the message's size.
	TraceW3CAttributes
	// TraceBoth carries it both ways.
	TraceBoth
	// TraceOff carries nothing.
	TraceOff
)

func (p TracePropagation) String() string {
	switch p {
	case TraceAWSHeader:
		return "TraceAWSHeader"
	case TraceW3CAttributes:
		return "TraceW3CAttributes"
	case TraceBoth:
		return "TraceBoth"
	case TraceOff:
		return "TraceOff"
	}
	return fmt.Sprintf("TracePropagation(%d)", int(p))
}

// Names under which a trace context travels.
const (
	// AWSTraceHeader is the message system attribute of TraceAWSHeader.
	AWSTraceHeader = "AWSTraceHeader"
	// TraceParentAttribute and TraceStateAttribute are the message
	// attributes of TraceW3CAttributes.
	TraceParentAttribute = "traceparent"
	TraceStateAttribute  = "tracestate"
)

// awsTraceHeaderLen is the length of every AWSTraceHeader the codec writes:
// "Root=1-" 8 "-" 24 ";Parent=" 16 ";Sampled=" 1.
const awsTraceHeaderLen = 7 + 8 + 1 + 24 + 8 + 16 + 9 + 1

// carried is what of m's trace context the codec sends: the AWSTraceHeader
// (header) and which W3C attributes (parent, state). A Parent that is not a
// valid traceparent, a tracestate SQS would refuse, and a W3C attribute whose
// name m.Attributes already uses (the caller's own value wins) are not
// carried: a malformed trace context must never cost a message its
// delivery, nor an AWSTraceHeader, which SQS does not count (the W3C
// attributes count as the caller's own: see the package doc).
type carried struct {
	header        bool
	parent, state bool
}

func (c *Codec) carried(m codec.Message) carried {
	if c.trace == TraceOff || m.Trace.Parent == "" || !validTraceparent(m.Trace.Parent) {
		return carried{}
	}
	var k carried
	k.header = c.trace == TraceAWSHeader || c.trace == TraceBoth
	if c.trace == TraceW3CAttributes || c.trace == TraceBoth {
		_, taken := m.Attributes[TraceParentAttribute]
		k.parent = !taken
		_, taken = m.Attributes[TraceStateAttribute]
		k.state = k.parent && !taken && m.Trace.State != "" && checkAttributeValue(m.Trace.State) == ""
	}
	if k.header && c.overLimitWithHeader(m, k) {
		// SQS does not count a system attribute toward a message's size,
		// but Size does: a message that fits without the header must not
		// be refused for it.
		k.header = false
	}
	return k
}

// overLimitWithHeader reports whether m, carrying k, weighs more by Size
// than one message or request may (MaxMessageBytes, Tuning.MaxBytes).
func (c *Codec) overLimitWithHeader(m codec.Message, k carried) bool {
	limit := c.maxMessage
	if t := c.tuning.MaxBytes; t > 0 && t < limit {
		limit = t
	}
	n := len(m.Body) + k.size(m)
	if len(m.Attributes) > 0 {
		n += attributesSize(m.Attributes)
	}
	if m.IdempotencyKey != "" {
		n += len(c.idemAttr) + len(stringType) + len(m.IdempotencyKey)
	}
	return n > limit
}

// count is the number of message attributes k adds.
func (k carried) count() int {
	n := 0
	if k.parent {
		n++
	}
	if k.state {
		n++
	}
	return n
}

// size is what k adds to m's Size: each attribute's name, data type and
// value. SQS does not count a system attribute toward a message's size; the
// codec counts the AWSTraceHeader all the same, so that a request never
// depends on that rule.
func (k carried) size(m codec.Message) int {
	n := 0
	if k.header {
		n += len(AWSTraceHeader) + len(stringType) + awsTraceHeaderLen
	}
	if k.parent {
		n += len(TraceParentAttribute) + len(stringType) + len(m.Trace.Parent)
	}
	if k.state {
		n += len(TraceStateAttribute) + len(stringType) + len(m.Trace.State)
	}
	return n
}

// validTraceparent reports whether s is a W3C traceparent the codec can
// carry: version-traceid-parentid-flags in lowercase hex, trace and parent
// ids not all zero, version not ff, and nothing after the flags for version
// 00 (a later version may append fields after a dash).
func validTraceparent(s string) bool {
	if len(s) < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	if len(s) > 55 && (s[:2] == "00" || s[55] != '-') {
		return false
	}
	return s[:2] != "ff" && isHex(s[:2]) && isHex(s[53:55]) &&
		isHex(s[3:35]) && !allZero(s[3:35]) && isHex(s[36:52]) && !allZero(s[36:52])
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if !(s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f') {
			return false
		}
	}
	return true
}

func allZero(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '0' {
			return false
		}
	}
	return true
}

// xrayHeader turns a valid traceparent into an AWSTraceHeader: X-Ray's trace
// id is the W3C one split 8/24 behind the version "1", its parent the span
// id, Sampled the traceparent's sampled flag.
func xrayHeader(traceparent string) string {
	sampled := byte('0')
	if flags := traceparent[53:55]; hexDigit(flags[1])&1 == 1 {
		sampled = '1'
	}
	// One allocation, no fmt: this runs for every message sent.
	b := make([]byte, 0, awsTraceHeaderLen)
	b = append(b, "Root=1-"...)
	b = append(b, traceparent[3:11]...)
	b = append(b, '-')
	b = append(b, traceparent[11:35]...)
	b = append(b, ";Parent="...)
	b = append(b, traceparent[36:52]...)
	b = append(b, ";Sampled="...)
	b = append(b, sampled)
	return string(b)
}

func hexDigit(b byte) byte {
	if b >= 'a' {
		return b - 'a' + 10
	}
	return b - '0'
}

// traceEntry writes k into e and attrs (the entry's message attributes,
// made if nil) and returns the system attributes sent, for the checksum.
func (c *Codec) traceEntry(m codec.Message, k carried, e *types.SendMessageBatchRequestEntry) map[string]types.MessageAttributeValue {
	if k.parent || k.state {
		if e.MessageAttributes == nil {
			e.MessageAttributes = make(map[string]types.MessageAttributeValue, k.count())
		}
		if k.parent {
			e.MessageAttributes[TraceParentAttribute] = stringValue(m.Trace.Parent)
		}
		if k.state {
			e.MessageAttributes[TraceStateAttribute] = stringValue(m.Trace.State)
		}
	}
	if !k.header {
		return nil
	}
	h := xrayHeader(m.Trace.Parent)
	e.MessageSystemAttributes = map[string]types.MessageSystemAttributeValue{
		AWSTraceHeader: {DataType: stringTypeRef, StringValue: aws.String(h)},
	}
	return map[string]types.MessageAttributeValue{AWSTraceHeader: stringValue(h)}
}

// stringTypeRef is the DataType of every attribute the codec sends. The
// requests only read it, so they all share it.
var stringTypeRef = aws.String(stringType)

func stringValue(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: stringTypeRef, StringValue: aws.String(v)}
}
