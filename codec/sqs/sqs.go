package sqs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ankusa/sinkbatch/codec"
)

// SQS's hard limits for one SendMessageBatch request and its messages.
const (
	// MaxEntries is the number of messages in one SendMessageBatch request.
	MaxEntries = 10
	// MaxBytes is the most a message may weigh, and the most the messages
	// of one request may weigh together: body plus each attribute's name,
	// data type and value.
	MaxBytes = 1 << 20
	// MaxAttributes is the number of message attributes one message may
	// carry, the idempotency attribute included.
	MaxAttributes = 10
	// MaxIDLength is the longest MessageGroupId and MessageDeduplicationId.
	MaxIDLength = 128
)

// QueueAttributesTimeout bounds New's GetQueueAttributes call when
// Config.ReadQueueAttributes is set, the SDK's retries included.
const QueueAttributesTimeout = 10 * time.Second

// minMessageSize is the smallest MaximumMessageSize SQS allows a queue.
const minMessageSize = 1024

// DefaultIdempotencyAttribute is the message attribute that carries a
// message's IdempotencyKey when Config.IdempotencyAttribute is empty.
const DefaultIdempotencyAttribute = "idempotency-key"

// stringType is the data type of every attribute the codec sends.
const stringType = "String"

// Config says which queue a Codec sends to and how to reach it. Set either
// AWS or Client.
type Config struct {
	// QueueURL is the queue's URL, e.g.
	// https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo. A name
	// ending in ".fifo" makes it a FIFO queue.
	QueueURL string
	// AWS is how to reach SQS: region, credentials, BaseEndpoint, HTTP
	// client and retry settings. The codec builds its own client from it.
	AWS aws.Config
	// Client is a ready client, used instead of AWS. The codec turns off its
	// MD5 check per call and checks each entry itself. Codecs built on one
	// client, with equal other fields, share an Identity, whatever the
	// client's options hold.
	Client *awssqs.Client
	// ContentBasedDeduplication says the FIFO queue has content-based
	// deduplication on, so a message without an IdempotencyKey is accepted.
	ContentBasedDeduplication bool
	// IdempotencyAttribute names the message attribute that carries a
	// message's IdempotencyKey on every queue, so that consumers can
	// deduplicate. Default DefaultIdempotencyAttribute.
	IdempotencyAttribute string
	// MaxMessageBytes is the most one message may weigh, as Size counts it;
	// 0 is SQS's MaxBytes (1 MiB). Set it to the queue's MaximumMessageSize
	// when that is smaller (queues created before 2025 often still allow
	// 256 KiB), or set ReadQueueAttributes. Validate refuses a heavier
	// message at admission with an error wrapping codec.ErrTooLarge, so it
	// never reaches SQS. Requests stay within MaxBytes either way.
	MaxMessageBytes int
	// ReadQueueAttributes makes New read the queue's MaximumMessageSize with
	// one GetQueueAttributes call, bounded by QueueAttributesTimeout; the
	// smaller of it and MaxMessageBytes is the limit. New returns an error
	// when the call fails. The read is in New, not lazy: Validate runs at
	// admission, in the batcher's mailbox, where it must not wait on the
	// network, and a limit learnt after admission would come too late for
	// the messages already admitted. The credentials need
	// sqs:GetQueueAttributes.
	ReadQueueAttributes bool
	// TracePropagation says how a message's trace context (Message.Trace)
	// travels to consumers: by default (TraceAWSHeader) in the
	// AWSTraceHeader system attribute, which costs none of the 10 message
	// attributes; TraceW3CAttributes as the traceparent and tracestate
	// message attributes; TraceBoth; or TraceOff. What is carried counts in
	// Size, and W3C attributes count toward MaxAttributes in Validate.
	TracePropagation TracePropagation
	// AttributeChecksumsOptional accepts a successful entry whose answer
	// lacks MD5OfMessageAttributes for the attributes it carried; one that
	// is there is still checked. Amazon SQS always returns it: leave this
	// false there. Some emulators never do (kumo); without this, every
	// message with an attribute (an IdempotencyKey is one) is answered a
	// retryable CodeMissingChecksum.
	AttributeChecksumsOptional bool
	// Tuning is the batch tuning; MaxEntries and MaxBytes may only tighten
	// MaxEntries and MaxBytes.
	Tuning codec.Tuning
}

// Codec is the codec.Codec (and codec.Validator) for one SQS queue. It is
// safe for concurrent use; its fields never change after New.
type Codec struct {
	client    *awssqs.Client
	queueURL  string
	queueName string
	fifo      bool
	cbd       bool
	idemAttr  string
	// maxMessage is the most one message may weigh, and maxMessageFrom
	// where that limit comes from, for Validate's error.
	maxMessage     int
	maxMessageFrom string
	trace          TracePropagation
	// attrChecksumsOptional is Config.AttributeChecksumsOptional.
	attrChecksumsOptional bool
	tuning                codec.Tuning
	identity              []byte
	// keep holds the aws.Config the client was made from, so that what
	// Identity names by address stays alive as long as the codec.
	keep aws.Config
}

var _ interface {
	codec.Codec
	codec.Validator
} = (*Codec)(nil)

// queueNameRE is SQS's rule for queue names: up to 80 alphanumerics,
// hyphens and underscores, and ".fifo" for a FIFO queue.
var queueNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,80}(\.fifo)?$`)

// New returns a codec for cfg's queue. It checks cfg and returns an error
// when it is incomplete or out of SQS's limits. It makes no request unless
// cfg.ReadQueueAttributes is set.
func New(cfg Config) (*Codec, error) {
	if cfg.QueueURL == "" {
		return nil, errors.New("sinkbatch/sqs: Config.QueueURL is empty")
	}
	u, err := url.Parse(cfg.QueueURL)
	if err != nil {
		return nil, fmt.Errorf("sinkbatch/sqs: Config.QueueURL %q: %w", cfg.QueueURL, err)
	}
	segs := strings.Split(strings.Trim(u.Path, "/"), "/")
	name := segs[len(segs)-1]
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !queueNameRE.MatchString(name) || u.RawQuery != "" {
		return nil, fmt.Errorf("sinkbatch/sqs: Config.QueueURL %q is not a queue URL (want http[s]://host/account/queue-name)", cfg.QueueURL)
	}
	if err := cfg.Tuning.Check(limits); err != nil {
		return nil, fmt.Errorf("sinkbatch/sqs: New: %w", err)
	}
	if cfg.MaxMessageBytes < 0 || cfg.MaxMessageBytes > MaxBytes {
		return nil, fmt.Errorf("sinkbatch/sqs: Config.MaxMessageBytes %d is outside [0, %d]", cfg.MaxMessageBytes, MaxBytes)
	}
	attr := cfg.IdempotencyAttribute
	if attr == "" {
		attr = DefaultIdempotencyAttribute
	}
	if err := checkAttributeName(attr); err != "" {
		return nil, fmt.Errorf("sinkbatch/sqs: Config.IdempotencyAttribute: %s", err)
	}
	if p := cfg.TracePropagation; p < TraceAWSHeader || p > TraceOff {
		return nil, fmt.Errorf("sinkbatch/sqs: Config.TracePropagation %v is not one of TraceAWSHeader, TraceW3CAttributes, TraceBoth, TraceOff", p)
	}
	if p := cfg.TracePropagation; (p == TraceW3CAttributes || p == TraceBoth) && (attr == TraceParentAttribute || attr == TraceStateAttribute) {
		return nil, fmt.Errorf("sinkbatch/sqs: Config.IdempotencyAttribute %q is the trace context's with Config.TracePropagation %v", attr, p)
	}

	c := &Codec{
		queueURL:  cfg.QueueURL,
		queueName: name,
		fifo:      strings.HasSuffix(name, ".fifo"),
		cbd:       cfg.ContentBasedDeduplication,
		idemAttr:  attr,
		tuning:    cfg.Tuning,

		attrChecksumsOptional: cfg.AttributeChecksumsOptional,
		trace:                 cfg.TracePropagation,
		maxMessage:            MaxBytes,
		maxMessageFrom:        "SQS's limit",
	}
	if cfg.MaxMessageBytes > 0 {
		c.maxMessage, c.maxMessageFrom = cfg.MaxMessageBytes, "Config.MaxMessageBytes"
	}
	id := newIdentity()
	id.field("kind", "sqs")
	id.field("queue", c.queueURL)
	id.field("content-based-deduplication", c.cbd)
	id.field("idempotency-attribute", c.idemAttr)
	id.field("attribute-checksums-optional", c.attrChecksumsOptional)
	id.field("trace-propagation", c.trace)
	id.field("tuning", c.tuning)
	if cfg.Client != nil {
		a := cfg.AWS
		if a.Region != "" || a.Credentials != nil || a.BaseEndpoint != nil || a.HTTPClient != nil {
			return nil, errors.New("sinkbatch/sqs: set Config.AWS or Config.Client, not both")
		}
		o := cfg.Client.Options()
		if o.Region == "" {
			return nil, errors.New("sinkbatch/sqs: no region: set it in the client")
		}
		if o.Credentials == nil {
			return nil, errors.New("sinkbatch/sqs: no credentials: set them in the client")
		}
		// A client's options never change after it is made: the same
		// client sends alike. Options() copies them with the client's own
		// default HTTP client, retryer and resolver in, which could only
		// be compared by address anyway.
		c.client = cfg.Client
		id.field("client", cfg.Client)
	} else {
		a := cfg.AWS
		if a.Region == "" {
			return nil, errors.New("sinkbatch/sqs: no region: set it in the aws.Config or the client")
		}
		if a.Credentials == nil {
			return nil, errors.New("sinkbatch/sqs: no credentials: set them in the aws.Config or the client")
		}
		c.client = awssqs.NewFromConfig(a)
		c.keep = a
		// Read the aws.Config, not the client's options: the SDK gives each
		// client its own default HTTP client and retryer, and two codecs
		// made from one aws.Config should share a batcher. Every field
		// counts, so that one a later SDK adds is not overlooked, except
		// the logger, which shapes no request, and ConfigSources, whose
		// effect on an SQS client (FIPS, dual-stack, a service-specific
		// endpoint) is read from the client below.
		rv := reflect.ValueOf(a)
		for i := range rv.NumField() {
			switch f := rv.Type().Field(i).Name; f {
			case "Credentials":
				id.credentials(a.Credentials)
			case "Logger", "ConfigSources":
			default:
				id.field(f, rv.Field(i).Interface())
			}
		}
		o := c.client.Options()
		id.field("resolved-endpoint", aws.ToString(o.BaseEndpoint))
		id.field("resolved-endpoint-options", fmt.Sprintf("https=%t dualstack=%v fips=%v",
			!o.EndpointOptions.DisableHTTPS, o.EndpointOptions.UseDualStackEndpoint, o.EndpointOptions.UseFIPSEndpoint))
	}
	if cfg.ReadQueueAttributes {
		n, err := c.readMaxMessageSize()
		if err != nil {
			return nil, err
		}
		if n < c.maxMessage {
			c.maxMessage, c.maxMessageFrom = n, "the queue's MaximumMessageSize"
		}
	}
	id.field("max-message-bytes", c.maxMessage)
	c.identity = id.digest()
	return c, nil
}

// readMaxMessageSize asks SQS for the queue's MaximumMessageSize.
func (c *Codec) readMaxMessageSize() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), QueueAttributesTimeout)
	defer cancel()
	const attr = types.QueueAttributeNameMaximumMessageSize
	out, err := c.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(c.queueURL),
		AttributeNames: []types.QueueAttributeName{attr},
	}, func(o *awssqs.Options) {
		if o.HTTPClient != nil {
			o.HTTPClient = readOnlyBodies{o.HTTPClient}
		}
	})
	if err != nil {
		return 0, fmt.Errorf("sinkbatch/sqs: New: reading %s of %s (Config.ReadQueueAttributes): %w", attr, c.queueName, err)
	}
	v, ok := out.Attributes[string(attr)]
	if !ok {
		return 0, fmt.Errorf("sinkbatch/sqs: New: the queue %s did not report its %s (Config.ReadQueueAttributes)", c.queueName, attr)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < minMessageSize || n > MaxBytes {
		return 0, fmt.Errorf("sinkbatch/sqs: New: the queue %s reported %s %q, not a size in [%d, %d]", c.queueName, attr, v, minMessageSize, MaxBytes)
	}
	return n, nil
}

// MaxMessageBytes is the most one message may weigh on this codec: the
// smallest of SQS's MaxBytes, Config.MaxMessageBytes and, with
// Config.ReadQueueAttributes, the queue's MaximumMessageSize.
func (c *Codec) MaxMessageBytes() int { return c.maxMessage }

// Name is "sqs".
func (c *Codec) Name() string { return "sqs" }

// Describe names the destination for tracing: "aws_sqs" and the queue's
// name (the last segment of its URL).
func (c *Codec) Describe() (system, destination string) { return "aws_sqs", c.queueName }

// Identity is a SHA-256 digest over the queue URL, the aws.Config (or the
// client), the codec's options and its tuning. Codec values whose
// configuration holds a func (a credentials or retryer func, APIOptions,
// ServiceOptions, an endpoint resolver func) get an identity of their own:
// the codec cannot tell two funcs apart. See the package doc.
func (c *Codec) Identity() []byte { return c.identity }

// limits are SQS's request limits.
var limits = codec.Limits{MaxEntries: MaxEntries, MaxBytes: MaxBytes}

// Limits are SQS's: MaxEntries messages and MaxBytes bytes per request.
func (c *Codec) Limits() codec.Limits { return limits }

// Tuning is Config.Tuning as given.
func (c *Codec) Tuning() codec.Tuning { return c.tuning }

// QueueURL is the queue the codec sends to.
func (c *Codec) QueueURL() string { return c.queueURL }

// attributesSize is the weight of attrs as SQS counts it. It is a function
// of its own, apart from Size: a map iterator is large, and Size runs on the
// batcher's goroutine, whose stack starts small each time its mailbox
// wakes; with one in Size's frame, the stack grew (a copy of it) for many a
// delivery that has no attributes at all.
func attributesSize(attrs map[string]string) int {
	n := 0
	for k, v := range attrs {
		n += len(k) + len(stringType) + len(v)
	}
	return n
}

// FIFO reports whether the queue is a FIFO queue.
func (c *Codec) FIFO() bool { return c.fifo }

// Size is m's weight as SQS counts it: its body plus each attribute's name,
// data type ("String") and value, the idempotency attribute and the trace
// context the codec carries included (see Config.TracePropagation).
func (c *Codec) Size(m codec.Message) int {
	n := len(m.Body) + c.carried(m).size(m)
	if len(m.Attributes) > 0 {
		n += attributesSize(m.Attributes)
	}
	if m.IdempotencyKey != "" {
		n += len(c.idemAttr) + len(stringType) + len(m.IdempotencyKey)
	}
	return n
}
