package pubsub

import (
	"fmt"
	"math/bits"
	"unicode/utf8"

	"github.com/ankusa/sinkbatch/codec"
)

// Pub/Sub's documented limits for one Publish request and one message. The
// Google client library names the first two MaxPublishRequestCount and
// MaxPublishRequestBytes. pstest enforces none of them, so the codec does.
const (
	// MaxRequestMessages is the number of messages one Publish request may hold.
	MaxRequestMessages = 1000
	// MaxRequestBytes is the size of one serialized PublishRequest, topic
	// included. Limits().MaxBytes is this minus the topic field (see Codec.Limits).
	MaxRequestBytes = 10_000_000
	// MaxDataBytes is the size of one message's data.
	MaxDataBytes = 10_000_000
	// MaxAttributes is the number of attributes of one message, the
	// idempotency attribute included.
	MaxAttributes = 100
	// MaxAttributeKeyBytes is the length of one attribute key.
	MaxAttributeKeyBytes = 256
	// MaxAttributeValueBytes is the length of one attribute value.
	MaxAttributeValueBytes = 1024
	// MaxOrderingKeyBytes is the length of one ordering key.
	MaxOrderingKeyBytes = 1024
)

// The length of a topic id, the last segment of a topic's name.
const (
	minTopicID = 3
	maxTopicID = 255
)

// The PublishRequest and PubsubMessage field tags, each one byte on the wire:
// (field number << 3) | wire type 2 (length-delimited).
const (
	tagLen = 1
)

// sizeVarint is the number of bytes protobuf's varint encoding of v takes.
func sizeVarint(v uint64) int {
	// Same formula as protowire.SizeVarint: 7 bits per byte.
	return int(9*uint32(bits.Len64(v))+64) / 64
}

// sizeBytesField is the encoded size of a non-empty length-delimited field.
func sizeBytesField(n int) int {
	return tagLen + sizeVarint(uint64(n)) + n
}

// sizeMapEntry is the encoded size of one map<string,string> entry as Go's
// protobuf runtime writes it: key and value are always written, even empty.
func sizeMapEntry(k, v string) int {
	e := sizeBytesField(len(k)) + sizeBytesField(len(v))
	return sizeBytesField(e)
}

// topicOverhead is the encoded size of the PublishRequest's topic field.
func topicOverhead(topic string) int {
	if topic == "" {
		return 0
	}
	return sizeBytesField(len(topic))
}

// messageSize is proto.Size of the PubsubMessage m becomes (without the
// enclosing field's tag and length).
func (c *Codec) messageSize(m codec.Message) int {
	n := 0
	if len(m.Body) > 0 {
		n += sizeBytesField(len(m.Body))
	}
	if len(m.Attributes) > 0 {
		n += attributesSize(m.Attributes)
	}
	if m.IdempotencyKey != "" {
		n += sizeMapEntry(c.idemAttr, m.IdempotencyKey)
	}
	if parent, state := c.traceCarried(m); parent != "" {
		n += sizeMapEntry(TraceParentAttribute, parent)
		if state != "" {
			n += sizeMapEntry(TraceStateAttribute, state)
		}
		// The user's attributes of these names are replaced (see
		// fillProto).
		for _, k := range traceAttributes {
			if v, ok := m.Attributes[k]; ok {
				n -= sizeMapEntry(k, v)
			}
		}
	}
	if m.Group != "" {
		n += sizeBytesField(len(m.Group))
	}
	return n
}

// attributesSize is the encoded size of attrs as a message's attributes.
// It is a function of its own, apart from messageSize: a map iterator is
// large, and on the batcher's goroutine, whose stack starts small each time
// its mailbox wakes, messageSize's frame with one in it made the stack grow
// (a copy of it) for many a delivery that has no attributes at all.
func attributesSize(attrs map[string]string) int {
	n := 0
	for k, v := range attrs {
		n += sizeMapEntry(k, v)
	}
	return n
}

// checkAttributes is checkAttribute of each of attrs, apart from Validate
// for the reason given at attributesSize.
func checkAttributes(attrs map[string]string) error {
	for k, v := range attrs {
		if err := checkAttribute(k, v); err != nil {
			return err
		}
	}
	return nil
}

// traceAttributes are the attributes the trace context travels in.
var traceAttributes = [...]string{TraceParentAttribute, TraceStateAttribute}

// traceCarried is the trace context m carries in its attributes: its
// Trace.Parent and Trace.State, or less where Pub/Sub would refuse them. A
// trace context never costs a message its delivery: a tracestate Pub/Sub
// cannot take (over MaxAttributeValueBytes, not valid UTF-8) is dropped, and
// so is the whole context when its traceparent cannot travel or its
// attributes would take the message past MaxAttributes (the tracestate goes
// first). Size, Validate and SendBatch agree on it; SendBatch counts each
// message sent without what it had (TraceContextsDropped).
func (c *Codec) traceCarried(m codec.Message) (parent, state string) {
	if !c.propagate || m.Trace.Parent == "" || checkAttribute(TraceParentAttribute, m.Trace.Parent) != nil {
		return "", ""
	}
	state = m.Trace.State
	if state != "" && checkAttribute(TraceStateAttribute, state) != nil {
		state = ""
	}
	n := len(m.Attributes) + 1
	if m.IdempotencyKey != "" {
		n++
	}
	for _, k := range traceAttributes {
		if _, ok := m.Attributes[k]; ok {
			n--
		}
	}
	if state != "" {
		n++
	}
	if n > MaxAttributes && state != "" {
		n, state = n-1, ""
	}
	if n > MaxAttributes {
		return "", ""
	}
	return m.Trace.Parent, state
}

// Size is the number of bytes m adds to a PublishRequest: the PubsubMessage's
// encoded size plus the repeated field's tag and length prefix. The sum of
// Size over a request's messages plus the topic field is the request's exact
// proto.Size. Size does not validate m.
func (c *Codec) Size(m codec.Message) int {
	return sizeBytesField(c.messageSize(m))
}

// Validate reports why Pub/Sub can never accept m, or nil. Every error it
// returns is a permanent *codec.EntryError (see IsPermanent) whose Code names
// the rule and whose Message says what is wrong; an over-long message's error
// also wraps codec.ErrTooLarge. The batcher calls it at admission; SendBatch
// calls it again and never sends a message it refuses.
func (c *Codec) Validate(m codec.Message) error {
	if len(m.Body) > MaxDataBytes {
		return tooLarge("DataTooLarge", "data is %d bytes; Pub/Sub allows %d", len(m.Body), MaxDataBytes)
	}
	nattr := len(m.Attributes)
	if m.IdempotencyKey != "" {
		nattr++
	}
	parent, state := c.traceCarried(m)
	if parent != "" {
		for _, k := range traceAttributes {
			if _, ok := m.Attributes[k]; ok {
				nattr--
			}
		}
		nattr++
		if state != "" {
			nattr++
		}
	}
	if len(m.Body) == 0 && len(m.Attributes) == 0 {
		// The idempotency attribute alone does not count: it is sinkbatch's
		// bookkeeping, and a message without payload is refused by every codec.
		return invalid("EmptyMessage", "a message needs non-empty data (Body) or at least one attribute")
	}
	if nattr > MaxAttributes {
		return invalid("TooManyAttributes", "%d attributes (the idempotency and trace attributes included); Pub/Sub allows %d", nattr, MaxAttributes)
	}
	if len(m.Attributes) > 0 {
		if err := checkAttributes(m.Attributes); err != nil {
			return err
		}
	}
	if m.IdempotencyKey != "" {
		if _, ok := m.Attributes[c.idemAttr]; ok {
			return invalid("IdempotencyAttributeTaken", "attribute %q is set and so is IdempotencyKey, which travels in that attribute", c.idemAttr)
		}
		if err := checkAttribute(c.idemAttr, m.IdempotencyKey); err != nil {
			return err
		}
	}
	if len(m.Group) > MaxOrderingKeyBytes {
		return invalid("OrderingKeyTooLong", "ordering key (Group) is %d bytes; Pub/Sub allows %d", len(m.Group), MaxOrderingKeyBytes)
	}
	if !utf8.ValidString(m.Group) {
		return invalid("InvalidUTF8", "ordering key (Group) is not valid UTF-8")
	}
	if s := c.Size(m); s > c.limits.MaxBytes {
		return tooLarge("MessageTooLarge", "message encodes to %d bytes; a request to this topic holds at most %d", s, c.limits.MaxBytes)
	}
	return nil
}

func checkAttribute(k, v string) error {
	switch {
	case k == "":
		return invalid("EmptyAttributeKey", "an attribute key is empty")
	case len(k) > MaxAttributeKeyBytes:
		return invalid("AttributeKeyTooLong", "attribute key %.32q... is %d bytes; Pub/Sub allows %d", k, len(k), MaxAttributeKeyBytes)
	case len(v) > MaxAttributeValueBytes:
		return invalid("AttributeValueTooLong", "value of attribute %q is %d bytes; Pub/Sub allows %d", k, len(v), MaxAttributeValueBytes)
	case !utf8.ValidString(k):
		return invalid("InvalidUTF8", "attribute key %q is not valid UTF-8", k)
	case !utf8.ValidString(v):
		return invalid("InvalidUTF8", "value of attribute %q is not valid UTF-8", k)
	}
	return nil
}

func invalid(code, format string, args ...any) error {
	return &codec.EntryError{Code: code, Message: fmt.Sprintf(format, args...), Permanent: true}
}

// tooLargeError is a permanent EntryError that also wraps codec.ErrTooLarge.
type tooLargeError struct{ *codec.EntryError }

func (e tooLargeError) Unwrap() []error { return []error{e.EntryError, codec.ErrTooLarge} }

func tooLarge(code, format string, args ...any) error {
	return tooLargeError{invalid(code, format, args...).(*codec.EntryError)}
}
