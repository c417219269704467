package pubsub

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	apiv1 "cloud.google.com/go/pubsub/v2/apiv1"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"

	"github.com/ankusa/sinkbatch/codec"
)

// Defaults a zero Config field takes.
const (
	// DefaultIdempotencyAttribute is the attribute that carries
	// Message.IdempotencyKey.
	DefaultIdempotencyAttribute = "idempotency-key"
	// DefaultTimeout bounds a Publish call whose ctx has no deadline. The
	// batcher always passes one (the batch's deadline), which then wins.
	DefaultTimeout = 60 * time.Second
)

// The attributes Message.Trace travels in: the W3C traceparent and
// tracestate headers under the prefix "googclient_", as Google's client
// library injects them and its subscriber (and its NewMessageCarrierFromPB)
// extracts them.
const (
	TraceParentAttribute = "googclient_traceparent"
	TraceStateAttribute  = "googclient_tracestate"
)

// maxParallelPublishes bounds the Publish calls one SendBatch makes at once
// when its batch holds several ordering keys (see the package doc).
const maxParallelPublishes = 16

// Config describes one Pub/Sub topic and how to reach it. Either Client is
// set, or the codec dials its own client from Endpoint, CredentialsJSON,
// Insecure and ClientOptions.
type Config struct {
	// Topic is the topic's full name, projects/{project}/topics/{topic}.
	// Required. New refuses a name Pub/Sub would refuse: the topic id must
	// be 3 to 255 letters, digits or - _ . ~ + %, start with a letter and
	// not start with "goog".
	Topic string

	// Endpoint is the service's host:port; "" is pubsub.googleapis.com:443
	// (or $PUBSUB_EMULATOR_HOST when that is set).
	Endpoint string
	// CredentialsJSON authenticates the calls; nil uses Application Default
	// Credentials. Identity holds only its SHA-256 digest.
	CredentialsJSON []byte
	// CredentialsType is the kind of CredentialsJSON; "" is
	// option.ServiceAccount.
	CredentialsType option.CredentialsType
	// Insecure dials without TLS and without authentication, as an emulator
	// or pstest needs. It excludes CredentialsJSON.
	Insecure bool
	// ClientOptions are appended to the options above when the codec dials.
	// They are opaque to the codec: see IdentityExtra.
	ClientOptions []option.ClientOption

	// Client is a ready client for the codec to use instead of dialling its
	// own; it excludes Endpoint, CredentialsJSON, Insecure and ClientOptions.
	// Close leaves it open: its owner closes it.
	Client *apiv1.TopicAdminClient

	// IdentityExtra stands for what the codec cannot see in ClientOptions or
	// Client (credentials, transport options): codecs whose explicit fields
	// and IdentityExtra are equal must be interchangeable, since sinkbatch may
	// send one's messages through the other. When ClientOptions or Client is
	// set and IdentityExtra is empty, the codec's identity is unique to the
	// codec value, so it shares batches with no other codec.
	IdentityExtra []byte

	// IdempotencyAttribute is the attribute Message.IdempotencyKey travels
	// in; "" is DefaultIdempotencyAttribute.
	IdempotencyAttribute string

	// DisableTracePropagation leaves Message.Trace out of the message. By
	// default a message whose Trace.Parent is set carries it in
	// TraceParentAttribute, and its Trace.State (when set) in
	// TraceStateAttribute, replacing any attribute of those names the
	// message has: a subscriber then continues the publisher's trace.
	DisableTracePropagation bool

	// CompressionBytesThreshold turns on gzip compression: a Publish
	// request whose serialized size is above it goes gzip-compressed, as
	// with the Google client's PublishSettings.EnableCompression and
	// CompressionBytesThreshold (which defaults to 240 when enabled). 0, the
	// default, never compresses; a negative value is refused. Compression
	// trades CPU at both ends for bytes on the wire: it pays for bodies that
	// compress well (JSON, text) on a link that costs. Pub/Sub's request
	// limits count the request before compression.
	CompressionBytesThreshold int

	// Tuning is the batch tuning; it may only tighten Codec.Limits. New
	// refuses a Tuning that codec.Tuning.Check refuses, naming the field.
	Tuning codec.Tuning
}

// Codec is the codec.Codec (and codec.Validator) for one Pub/Sub topic. It
// is safe for concurrent use and never changes after New.
type Codec struct {
	client   *apiv1.TopicAdminClient
	owned    bool // the codec dialled client and closes it
	topic    string
	idemAttr string
	limits   codec.Limits
	tuning   codec.Tuning
	identity []byte
	callOpts []gax.CallOption
	// propagate is !Config.DisableTracePropagation.
	propagate bool
	// compressAbove is Config.CompressionBytesThreshold; 0 is off.
	compressAbove int
	// gzipOpts are callOpts with the gzip compressor.
	gzipOpts []gax.CallOption
	// traceDropped counts messages sent without (part of) their trace
	// context (see traceCarried).
	traceDropped atomic.Uint64

	closeOnce sync.Once
	closeErr  error
}

// TraceContextsDropped is the number of messages the codec has sent
// without their whole trace context because Pub/Sub could not take it (a
// tracestate over MaxAttributeValueBytes, or no attribute left for it): the
// message is published, its trace is cut there. Safe for concurrent use.
func (c *Codec) TraceContextsDropped() uint64 { return c.traceDropped.Load() }

var (
	_ codec.Codec     = (*Codec)(nil)
	_ codec.Validator = (*Codec)(nil)
)

// New checks cfg and returns a codec for its topic, dialling a client unless
// cfg.Client is set. A bad cfg is refused with an error that starts
// "sinkbatch/pubsub: New: " and names the field (Config.Topic,
// Tuning.MaxBytes). Dialling is lazy: New does not wait for a connection,
// and ctx only bounds the dial's set-up. Call Close when no batcher uses the
// codec any more.
func New(ctx context.Context, cfg Config) (*Codec, error) {
	if err := checkTopic(cfg.Topic); err != nil {
		return nil, fmt.Errorf("sinkbatch/pubsub: New: Config.Topic: %w", err)
	}
	idemAttr := cfg.IdempotencyAttribute
	if idemAttr == "" {
		idemAttr = DefaultIdempotencyAttribute
	}
	if err := checkAttribute(idemAttr, ""); err != nil {
		return nil, fmt.Errorf("sinkbatch/pubsub: New: Config.IdempotencyAttribute %.32q: %w", idemAttr, err)
	}
	if idemAttr == TraceParentAttribute || idemAttr == TraceStateAttribute {
		return nil, fmt.Errorf("sinkbatch/pubsub: New: Config.IdempotencyAttribute %q is where the trace context travels", idemAttr)
	}
	limits := codec.Limits{
		MaxEntries: MaxRequestMessages,
		MaxBytes:   MaxRequestBytes - topicOverhead(cfg.Topic),
		// Every message of one Publish must carry the same ordering key.
		OneGroupPerRequest: true,
	}
	if err := cfg.Tuning.Check(limits); err != nil {
		return nil, fmt.Errorf("sinkbatch/pubsub: New: %w", err)
	}
	dialling := cfg.Endpoint != "" || cfg.CredentialsJSON != nil || cfg.Insecure || len(cfg.ClientOptions) > 0
	if cfg.Client != nil && dialling {
		return nil, errors.New("sinkbatch/pubsub: New: Config.Client excludes Endpoint, CredentialsJSON, Insecure and ClientOptions")
	}
	if cfg.Insecure && cfg.CredentialsJSON != nil {
		return nil, errors.New("sinkbatch/pubsub: New: Config.Insecure excludes CredentialsJSON")
	}
	if cfg.CompressionBytesThreshold < 0 {
		return nil, fmt.Errorf("sinkbatch/pubsub: New: Config.CompressionBytesThreshold %d is negative", cfg.CompressionBytesThreshold)
	}

	c := &Codec{
		client:   cfg.Client,
		topic:    cfg.Topic,
		idemAttr: idemAttr,
		limits:   limits,
		tuning:   cfg.Tuning,
		// No retries at this layer: see "Retries" in the package doc. The
		// timeout applies only when ctx has no deadline of its own.
		callOpts:      []gax.CallOption{gax.WithRetry(nil), gax.WithTimeout(DefaultTimeout)},
		compressAbove: cfg.CompressionBytesThreshold,
		propagate:     !cfg.DisableTracePropagation,
	}
	c.gzipOpts = append(slices.Clip(c.callOpts), gax.WithGRPCOptions(grpc.UseCompressor(gzip.Name)))
	identity, err := identityOf(cfg, idemAttr)
	if err != nil {
		return nil, err
	}
	c.identity = identity
	if c.client == nil {
		client, err := apiv1.NewTopicAdminClient(ctx, dialOptions(cfg)...)
		if err != nil {
			return nil, fmt.Errorf("sinkbatch/pubsub: New: dial: %w", err)
		}
		c.client, c.owned = client, true
	}
	return c, nil
}

// checkTopic reports why Pub/Sub would refuse topic as a topic's full name:
// projects/{project}/topics/{topic id}, the id 3 to 255 characters from
// [A-Za-z0-9-_.~+%], starting with a letter and not with "goog". A name the
// service refuses would otherwise have every batch refused and bisected down
// to single messages.
func checkTopic(topic string) error {
	rest, ok := strings.CutPrefix(topic, "projects/")
	project, id, ok2 := strings.Cut(rest, "/topics/")
	if !ok || !ok2 || project == "" || strings.Contains(project, "/") || id == "" || strings.Contains(id, "/") {
		return fmt.Errorf("%q is not of the form projects/{project}/topics/{topic}", topic)
	}
	isLetter := func(r byte) bool { return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' }
	switch {
	case len(id) < minTopicID || len(id) > maxTopicID:
		return fmt.Errorf("topic id %.32q is %d characters long; Pub/Sub allows %d to %d", id, len(id), minTopicID, maxTopicID)
	case !isLetter(id[0]):
		return fmt.Errorf("topic id %q does not start with a letter", id)
	case strings.HasPrefix(id, "goog"):
		return fmt.Errorf("topic id %q starts with \"goog\", which Pub/Sub reserves", id)
	}
	for _, r := range id {
		if r >= utf8.RuneSelf || !isLetter(byte(r)) && !('0' <= r && r <= '9') && !strings.ContainsRune("-_.~+%", r) {
			return fmt.Errorf("topic id %q holds %q; Pub/Sub allows ASCII letters, digits and - _ . ~ + %%", id, r)
		}
	}
	return nil
}

func dialOptions(cfg Config) []option.ClientOption {
	var opts []option.ClientOption
	if cfg.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(cfg.Endpoint))
	}
	if cfg.Insecure {
		opts = append(opts,
			option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	}
	if cfg.CredentialsJSON != nil {
		typ := cfg.CredentialsType
		if typ == "" {
			typ = option.ServiceAccount
		}
		opts = append(opts, option.WithAuthCredentialsJSON(typ, cfg.CredentialsJSON))
	}
	return append(opts, cfg.ClientOptions...)
}

// identityOf encodes every Config field that shapes a request, each
// length-prefixed so that no two configs encode alike.
func identityOf(cfg Config, idemAttr string) ([]byte, error) {
	var b []byte
	field := func(p []byte) {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	num := func(v int64) { b = binary.AppendVarint(b, v) }
	flag := func(v bool) int64 {
		if v {
			return 1
		}
		return 0
	}

	field([]byte("sinkbatch/pubsub/1"))
	field([]byte(cfg.Topic))
	field([]byte(cfg.Endpoint))
	if cfg.Client == nil {
		// When this is set the client library dials the emulator in
		// plaintext, whatever the endpoint.
		field([]byte(os.Getenv("PUBSUB_EMULATOR_HOST")))
	} else {
		field(nil)
	}
	if cfg.CredentialsJSON != nil {
		d := sha256.Sum256(cfg.CredentialsJSON)
		field(d[:])
	} else {
		field(nil)
	}
	field([]byte(cfg.CredentialsType))
	num(flag(cfg.Insecure))
	field([]byte(idemAttr))
	num(int64(cfg.CompressionBytesThreshold))
	num(flag(cfg.DisableTracePropagation))
	t := cfg.Tuning
	for _, v := range []int64{int64(t.MaxEntries), int64(t.MaxBytes), int64(t.Linger), int64(t.MaxInflight),
		int64(t.QueueMax), t.QueueMaxBytes, int64(t.TenantMax), int64(t.RetryAfterMax), int64(t.IdleTimeout),
		int64(t.WhenFull), flag(t.StrictGroups), int64(t.GroupPauseMax), flag(t.Adaptive)} {
		num(v)
	}
	opaque := cfg.Client != nil || len(cfg.ClientOptions) > 0
	switch {
	case len(cfg.IdentityExtra) > 0:
		field([]byte("extra"))
		field(cfg.IdentityExtra)
	case opaque:
		// Options the codec cannot see: share with nobody.
		nonce := make([]byte, 16)
		if _, err := rand.Read(nonce); err != nil {
			return nil, fmt.Errorf("sinkbatch/pubsub: New: identity nonce: %w", err)
		}
		field([]byte("unique"))
		field(nonce)
	default:
		field(nil)
	}
	return b, nil
}

// Name returns "pubsub".
func (c *Codec) Name() string { return "pubsub" }

// Describe names the destination for tracing: "gcp_pubsub" and the topic's
// id (the last segment of its full name).
func (c *Codec) Describe() (system, destination string) {
	return "gcp_pubsub", c.topic[strings.LastIndexByte(c.topic, '/')+1:]
}

// Identity returns the codec's identity: topic, endpoint, a digest of the
// credentials, Insecure, the idempotency attribute, trace propagation, the
// compression threshold, the tuning and IdentityExtra (or a per-codec nonce;
// see Config.IdentityExtra). It holds no raw credentials. The caller must not
// modify it.
func (c *Codec) Identity() []byte { return c.identity }

// Limits returns 1000 messages and MaxRequestBytes less the encoded topic
// field (1 tag byte, its length's varint and the topic's bytes), so that a
// request whose messages' Sizes sum to MaxBytes is exactly MaxRequestBytes.
func (c *Codec) Limits() codec.Limits { return c.limits }

// Tuning returns Config.Tuning as given; zero fields take the batcher's
// defaults.
func (c *Codec) Tuning() codec.Tuning { return c.tuning }

// Topic returns the topic's full name.
func (c *Codec) Topic() string { return c.topic }

// Close closes the client the codec dialled; a Config.Client is left open.
// Call it once no batcher sends through the codec. Close is idempotent.
func (c *Codec) Close() error {
	c.closeOnce.Do(func() {
		if c.owned {
			c.closeErr = c.client.Close()
		}
	})
	return c.closeErr
}
