package sqs

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

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
	// MD5 check per call and checks each entry itself.
	Client *awssqs.Client
	// ContentBasedDeduplication says the FIFO queue has content-based
	// deduplication on, so a message without an IdempotencyKey is accepted.
	ContentBasedDeduplication bool
	// IdempotencyAttribute names the message attribute that carries a
	// message's IdempotencyKey on every queue, so that consumers can
	// deduplicate. Default DefaultIdempotencyAttribute.
	IdempotencyAttribute string
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
	tuning    codec.Tuning
	identity  []byte
}

var _ interface {
	codec.Codec
	codec.Validator
} = (*Codec)(nil)

// queueNameRE is SQS's rule for queue names: up to 80 alphanumerics,
// hyphens and underscores, and ".fifo" for a FIFO queue.
var queueNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,80}(\.fifo)?$`)

// New returns a codec for cfg's queue. It checks cfg and returns an error
// when it is incomplete or out of SQS's limits; it makes no request.
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
	if err := checkTuning(cfg.Tuning); err != nil {
		return nil, err
	}
	attr := cfg.IdempotencyAttribute
	if attr == "" {
		attr = DefaultIdempotencyAttribute
	}
	if err := checkAttributeName(attr); err != "" {
		return nil, fmt.Errorf("sinkbatch/sqs: Config.IdempotencyAttribute: %s", err)
	}

	var tr transport
	client := cfg.Client
	if client != nil {
		if cfg.AWS.Region != "" || cfg.AWS.Credentials != nil || cfg.AWS.BaseEndpoint != nil || cfg.AWS.HTTPClient != nil {
			return nil, errors.New("sinkbatch/sqs: set Config.AWS or Config.Client, not both")
		}
		o := client.Options()
		tr = transport{
			region: o.Region, endpoint: aws.ToString(o.BaseEndpoint), credentials: o.Credentials,
			resolver: o.EndpointResolverV2, httpClient: o.HTTPClient, retryer: o.Retryer,
			retryMaxAttempts: o.RetryMaxAttempts, retryMode: o.RetryMode, appID: o.AppID,
			endpointOptions: o.EndpointOptions, apiOptions: apiOptions(o.APIOptions),
		}
	} else {
		// Read the aws.Config itself, not the client's options: the SDK
		// gives each client its own default HTTP client and retryer, and two
		// codecs made from one aws.Config should share a batcher.
		a := cfg.AWS
		client = awssqs.NewFromConfig(a)
		tr = transport{
			region: a.Region, endpoint: aws.ToString(a.BaseEndpoint), credentials: a.Credentials,
			resolver: a.EndpointResolverWithOptions, httpClient: a.HTTPClient, retryer: a.Retryer,
			retryMaxAttempts: a.RetryMaxAttempts, retryMode: a.RetryMode, appID: a.AppID,
			// FIPS and dual-stack come from the config's sources; the
			// client has resolved them.
			endpointOptions: client.Options().EndpointOptions, apiOptions: apiOptions(a.APIOptions),
		}
	}
	if tr.region == "" {
		return nil, errors.New("sinkbatch/sqs: no region: set it in the aws.Config or the client")
	}
	if tr.credentials == nil {
		return nil, errors.New("sinkbatch/sqs: no credentials: set them in the aws.Config or the client")
	}

	c := &Codec{
		client:    client,
		queueURL:  cfg.QueueURL,
		queueName: name,
		fifo:      strings.HasSuffix(name, ".fifo"),
		cbd:       cfg.ContentBasedDeduplication,
		idemAttr:  attr,
		tuning:    cfg.Tuning,
	}
	c.identity = c.digest(tr)
	return c, nil
}

func checkTuning(t codec.Tuning) error {
	switch {
	case t.MaxEntries < 0 || t.MaxEntries > MaxEntries:
		return fmt.Errorf("sinkbatch/sqs: Tuning.MaxEntries %d is outside [0, %d]", t.MaxEntries, MaxEntries)
	case t.MaxBytes < 0 || t.MaxBytes > MaxBytes:
		return fmt.Errorf("sinkbatch/sqs: Tuning.MaxBytes %d is outside [0, %d]", t.MaxBytes, MaxBytes)
	case t.Linger < 0:
		return fmt.Errorf("sinkbatch/sqs: Tuning.Linger %v is negative", t.Linger)
	case t.RetryAfterMax < 0:
		return fmt.Errorf("sinkbatch/sqs: Tuning.RetryAfterMax %v is negative", t.RetryAfterMax)
	case t.IdleTimeout < 0:
		return fmt.Errorf("sinkbatch/sqs: Tuning.IdleTimeout %v is negative", t.IdleTimeout)
	case t.MaxInflight < 0 || t.QueueMax < 0 || t.QueueMaxBytes < 0 || t.TenantMax < 0:
		return fmt.Errorf("sinkbatch/sqs: Tuning %+v has a negative bound", t)
	}
	return nil
}

// transport is what, besides the queue, shapes a request.
type transport struct {
	region, endpoint string
	credentials      aws.CredentialsProvider
	resolver         any
	httpClient       any
	retryer          any
	retryMaxAttempts int
	retryMode        aws.RetryMode
	appID            string
	endpointOptions  awssqs.EndpointResolverOptions
	apiOptions       []string // middleware that may change the request
}

// apiOptions names each of a client's extra middleware functions.
func apiOptions[F any](fns []F) []string {
	names := make([]string, len(fns))
	for i, f := range fns {
		names[i] = valueIdentity(f)
	}
	return names
}

// digest is the codec's Identity: a SHA-256 over everything that shapes a
// request. Static credentials enter it as their values, so the secret is
// only ever digested; other credential providers, the HTTP client and the
// retryer enter as their type and address, since their settings cannot be
// read back: pass the same values to share a batcher.
func (c *Codec) digest(o transport) []byte {
	h := sha256.New()
	field := func(k string, v any) { fmt.Fprintf(h, "%s=%q\n", k, fmt.Sprint(v)) }
	field("kind", "sqs")
	field("queue", c.queueURL)
	field("content-based-deduplication", c.cbd)
	field("idempotency-attribute", c.idemAttr)
	field("region", o.region)
	field("endpoint", o.endpoint)
	field("endpoint-resolver", valueIdentity(o.resolver))
	field("http-client", valueIdentity(o.httpClient))
	field("retryer", valueIdentity(o.retryer))
	field("retry-max-attempts", o.retryMaxAttempts)
	field("retry-mode", o.retryMode)
	field("app-id", o.appID)
	field("endpoint-options", fmt.Sprintf("https=%t dualstack=%v fips=%v",
		!o.endpointOptions.DisableHTTPS, o.endpointOptions.UseDualStackEndpoint, o.endpointOptions.UseFIPSEndpoint))
	field("api-options", strings.Join(o.apiOptions, ","))
	field("tuning", fmt.Sprintf("%+v", c.tuning))
	if aws.IsCredentialsProvider(o.credentials, credentials.StaticCredentialsProvider{}) {
		// A static provider answers at once, from memory.
		v, err := o.credentials.Retrieve(context.Background())
		if err == nil {
			s := sha256.Sum256([]byte(v.AccessKeyID + "\x00" + v.SecretAccessKey + "\x00" + v.SessionToken))
			field("credentials", fmt.Sprintf("static:%x", s))
		} else {
			field("credentials", "static-error:"+err.Error())
		}
	} else {
		field("credentials", valueIdentity(o.credentials))
	}
	return h.Sum(nil)
}

// valueIdentity names v by its type and, for reference kinds, its address;
// other values by a digest of their contents.
func valueIdentity(v any) string {
	if v == nil {
		return "default"
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Chan, reflect.UnsafePointer, reflect.Slice:
		return fmt.Sprintf("%T@%#x", v, rv.Pointer())
	}
	return fmt.Sprintf("%T:%x", v, sha256.Sum256([]byte(fmt.Sprintf("%#v", v))))
}

// Name is "sqs".
func (c *Codec) Name() string { return "sqs" }

// Identity is a SHA-256 digest over the queue URL, region, endpoint,
// credentials, transport, retry settings, the codec's options and its
// tuning.
func (c *Codec) Identity() []byte { return c.identity }

// Limits are SQS's: MaxEntries messages and MaxBytes bytes per request.
func (c *Codec) Limits() codec.Limits {
	return codec.Limits{MaxEntries: MaxEntries, MaxBytes: MaxBytes}
}

// Tuning is Config.Tuning as given.
func (c *Codec) Tuning() codec.Tuning { return c.tuning }

// QueueURL is the queue the codec sends to.
func (c *Codec) QueueURL() string { return c.queueURL }

// FIFO reports whether the queue is a FIFO queue.
func (c *Codec) FIFO() bool { return c.fifo }

// Size is m's weight as SQS counts it: its body plus each attribute's name,
// data type ("String") and value, the idempotency attribute included.
func (c *Codec) Size(m codec.Message) int {
	n := len(m.Body)
	for k, v := range m.Attributes {
		n += len(k) + len(stringType) + len(v)
	}
	if m.IdempotencyKey != "" {
		n += len(c.idemAttr) + len(stringType) + len(m.IdempotencyKey)
	}
	return n
}
