package pubsub_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	gpubsub "cloud.google.com/go/pubsub/v2"
	apiv1 "cloud.google.com/go/pubsub/v2/apiv1"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
)

func TestNewRefusesBadConfig(t *testing.T) {
	ok := pubsub.Config{Topic: testTopic, Endpoint: "127.0.0.1:1", Insecure: true}
	tests := []struct {
		name string
		edit func(*pubsub.Config)
		want string
	}{
		{"no topic", func(c *pubsub.Config) { c.Topic = "" }, "Config.Topic: \"\" is not of the form"},
		{"no project", func(c *pubsub.Config) { c.Topic = "topics/top" }, "Config.Topic: \"topics/top\" is not of the form"},
		{"empty project", func(c *pubsub.Config) { c.Topic = "projects//topics/top" }, "is not of the form"},
		{"topic with extra path", func(c *pubsub.Config) { c.Topic = "projects/p/topics/top/x" }, "is not of the form"},
		{"topic id too short", func(c *pubsub.Config) { c.Topic = "projects/p/topics/tt" }, `Config.Topic: topic id "tt" is 2 characters long; Pub/Sub allows 3 to 255`},
		{"topic id too long", func(c *pubsub.Config) { c.Topic = "projects/p/topics/" + strings.Repeat("t", 256) }, "is 256 characters long; Pub/Sub allows 3 to 255"},
		{"topic id starts with a digit", func(c *pubsub.Config) { c.Topic = "projects/p/topics/1top" }, `Config.Topic: topic id "1top" does not start with a letter`},
		{"topic id starts with goog", func(c *pubsub.Config) { c.Topic = "projects/p/topics/google" }, `starts with "goog"`},
		{"topic id holds a space", func(c *pubsub.Config) { c.Topic = "projects/p/topics/to p" }, `topic id "to p" holds ' '`},
		{"topic id holds a non-ASCII letter", func(c *pubsub.Config) { c.Topic = "projects/p/topics/topé" }, `topic id "topé" holds 'é'; Pub/Sub allows ASCII letters`},
		{"client and endpoint", func(c *pubsub.Config) { c.Client = newClientForTest(t) }, "Config.Client excludes"},
		{"insecure and credentials", func(c *pubsub.Config) { c.CredentialsJSON = []byte(`{}`) }, "Config.Insecure excludes"},
		{"negative tuning", func(c *pubsub.Config) { c.Tuning.Linger = -time.Millisecond }, "Tuning.Linger -1ms is negative"},
		{"negative pause", func(c *pubsub.Config) { c.Tuning.GroupPauseMax = -time.Second }, "Tuning.GroupPauseMax -1s is negative"},
		{"too many entries", func(c *pubsub.Config) { c.Tuning.MaxEntries = 1001 }, "Tuning.MaxEntries 1001 is above the destination's limit 1000"},
		{"too many bytes", func(c *pubsub.Config) { c.Tuning.MaxBytes = pubsub.MaxRequestBytes }, "Tuning.MaxBytes 10000000 is above the destination's limit 9999977"},
		{"queue below a request", func(c *pubsub.Config) { c.Tuning.QueueMaxBytes = 1000 }, "Tuning.QueueMaxBytes 1000 is below the destination's request limit"},
		{"unknown policy", func(c *pubsub.Config) { c.Tuning.WhenFull = 7 }, "Tuning.WhenFull FullPolicy(7) is not Refuse or Block"},
		{"long idempotency attribute", func(c *pubsub.Config) { c.IdempotencyAttribute = strings.Repeat("k", 257) }, "Config.IdempotencyAttribute"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.edit(&cfg)
			c, err := pubsub.New(context.Background(), cfg)
			require.Error(t, err)
			assert.Nil(t, c)
			assert.Contains(t, err.Error(), tt.want)
			assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch/pubsub: New: "), err.Error())
			assert.NotContains(t, err.Error(), "Linger:", "names the field, not the whole struct")
		})
	}

	t.Run("tightest tuning accepted", func(t *testing.T) {
		cfg := ok
		cfg.Tuning = codec.Tuning{MaxEntries: 1000, MaxBytes: pubsub.MaxRequestBytes - 23}
		c, err := pubsub.New(context.Background(), cfg)
		require.NoError(t, err)
		require.NoError(t, c.Close())
		assert.Equal(t, codec.Limits{MaxEntries: 1000, MaxBytes: pubsub.MaxRequestBytes - 23, OneGroupPerRequest: true}, c.Limits(),
			"limits less the topic field: tag, length, 21 bytes")
	})
	t.Run("topic ids at the limits accepted", func(t *testing.T) {
		for _, id := range []string{"abc", "A" + strings.Repeat("z", 254), "t-_.~+%09Zz", "gooH"} {
			cfg := ok
			cfg.Topic = "projects/my-project/topics/" + id
			c, err := pubsub.New(context.Background(), cfg)
			require.NoError(t, err, id)
			require.NoError(t, c.Close())
		}
	})
}

// newClientForTest is a ready client that New must not accept alongside
// dial options; it is closed at clean-up.
func newClientForTest(t *testing.T) *apiv1.TopicAdminClient {
	t.Helper()
	c, err := newAPIClient("127.0.0.1:1")
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestIdentity(t *testing.T) {
	newC := func(cfg pubsub.Config) *pubsub.Codec {
		t.Helper()
		if cfg.Topic == "" {
			cfg.Topic = testTopic
		}
		c, err := pubsub.New(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	base := pubsub.Config{Endpoint: "127.0.0.1:1", Insecure: true}
	a, b := newC(base), newC(base)
	assert.Equal(t, a.Identity(), b.Identity(), "equal explicit configs share an identity")
	assert.Equal(t, "pubsub", a.Name())

	secret, other := serviceAccountJSON(t), serviceAccountJSON(t)
	creds1 := newC(pubsub.Config{Endpoint: "127.0.0.1:1", CredentialsJSON: secret})
	creds1b := newC(pubsub.Config{Endpoint: "127.0.0.1:1", CredentialsJSON: secret})
	creds2 := newC(pubsub.Config{Endpoint: "127.0.0.1:1", CredentialsJSON: other})
	assert.Equal(t, creds1.Identity(), creds1b.Identity())
	assert.NotEqual(t, creds1.Identity(), creds2.Identity(), "different credentials never share")
	assert.False(t, bytes.Contains(creds1.Identity(), secret[40:80]), "identity holds a digest, not the credentials")

	differs := map[string]pubsub.Config{
		"topic":       {Topic: "projects/p/topics/other", Endpoint: "127.0.0.1:1", Insecure: true},
		"endpoint":    {Endpoint: "127.0.0.1:2", Insecure: true},
		"secure":      {Endpoint: "127.0.0.1:1", CredentialsJSON: secret},
		"idempotency": {Endpoint: "127.0.0.1:1", Insecure: true, IdempotencyAttribute: "dedup"},
		"tuning":      {Endpoint: "127.0.0.1:1", Insecure: true, Tuning: codec.Tuning{IdleTimeout: time.Second}},
		"when full":   {Endpoint: "127.0.0.1:1", Insecure: true, Tuning: codec.Tuning{WhenFull: codec.Block}},
		"strict":      {Endpoint: "127.0.0.1:1", Insecure: true, Tuning: codec.Tuning{StrictGroups: true}},
		"pause":       {Endpoint: "127.0.0.1:1", Insecure: true, Tuning: codec.Tuning{GroupPauseMax: time.Second}},
		"adaptive":    {Endpoint: "127.0.0.1:1", Insecure: true, Tuning: codec.Tuning{Adaptive: true}},
		"extra":       {Endpoint: "127.0.0.1:1", Insecure: true, IdentityExtra: []byte("x")},
	}
	for name, cfg := range differs {
		assert.NotEqual(t, a.Identity(), newC(cfg).Identity(), name)
	}

	// Opaque client options: unique per codec unless IdentityExtra speaks for them.
	opaque := pubsub.Config{Endpoint: "127.0.0.1:1", Insecure: true, ClientOptions: []option.ClientOption{option.WithUserAgent("x")}}
	assert.NotEqual(t, newC(opaque).Identity(), newC(opaque).Identity())
	opaque.IdentityExtra = []byte("user-agent x")
	assert.Equal(t, newC(opaque).Identity(), newC(opaque).Identity())
}

// serviceAccountJSON returns service-account credentials with a fresh key.
func serviceAccountJSON(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	b, err := json.Marshal(map[string]string{
		"type":           "service_account",
		"private_key":    string(pemKey),
		"client_email":   "sinkbatch@p.iam.gserviceaccount.com",
		"private_key_id": "k1",
		"project_id":     "p",
		"token_uri":      "http://127.0.0.1:1/token",
	})
	require.NoError(t, err)
	return b
}

func TestMappingAndReadBack(t *testing.T) {
	rec := &recorder{}
	srv := newServer(t, rec.option())
	for _, attr := range []string{"", "dedup-id"} {
		t.Run("idempotency attribute "+attr, func(t *testing.T) {
			srv.ClearMessages()
			c, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: srv.Addr, Insecure: true, IdempotencyAttribute: attr})
			require.NoError(t, err)
			defer func() { require.NoError(t, c.Close()) }()
			wantAttr := attr
			if wantAttr == "" {
				wantAttr = pubsub.DefaultIdempotencyAttribute
			}
			userAttrs := map[string]string{"colour": "blue"}
			batch := []codec.Message{
				{Tenant: "a", Body: []byte("plain")},
				{Tenant: "a", Body: []byte("attributed"), Attributes: userAttrs},
				{Tenant: "b", Body: []byte("keyed"), IdempotencyKey: "k-1", Attributes: map[string]string{"x": "y"}},
				{Tenant: "b", IdempotencyKey: "k-2", Attributes: map[string]string{"only": "attributes"}}, // no body
			}
			res, err := c.SendBatch(context.Background(), batch)
			require.NoError(t, err)
			require.Len(t, res, len(batch))
			assert.Equal(t, map[string]string{"colour": "blue"}, userAttrs, "the caller's map is not modified")

			got := srv.Messages()
			require.Len(t, got, len(batch))
			for i, m := range got {
				assert.Equal(t, res[i].ID, m.ID, "ids map back by position")
				assert.NoError(t, res[i].Err)
				assert.Equal(t, testTopic, m.Topic)
				assert.Equal(t, string(batch[i].Body), string(m.Data))
				want := map[string]string{}
				for k, v := range batch[i].Attributes {
					want[k] = v
				}
				if batch[i].IdempotencyKey != "" {
					want[wantAttr] = batch[i].IdempotencyKey
				}
				if len(want) == 0 {
					want = nil
				}
				assert.Equal(t, want, m.Attributes, "message %d", i)
			}
		})
	}
	t.Run("ordering key", func(t *testing.T) {
		srv.ClearMessages()
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
		batch := []codec.Message{{Group: "g", Body: []byte("1")}, {Group: "g", Body: []byte("2")}}
		before := rec.calls.Load()
		res, err := c.SendBatch(context.Background(), batch)
		require.NoError(t, err)
		assert.Equal(t, before+1, rec.calls.Load(), "one key, one request")
		got := srv.Messages()
		require.Len(t, got, 2)
		for i := range got {
			assert.Equal(t, "g", got[i].OrderingKey)
			assert.Equal(t, res[i].ID, got[i].ID)
			assert.Equal(t, string(batch[i].Body), string(got[i].Data))
		}
	})
}

// randomMessage draws a message whose fields cross varint boundaries.
func randomMessage(r *rand.Rand) codec.Message {
	lengths := []int{0, 1, 5, 126, 127, 128, 129, 255, 256, 1024, 16383, 16384, 16385}
	pick := func() int { return lengths[r.IntN(len(lengths))] }
	str := func(n int) string { return strings.Repeat("é", n/2) + strings.Repeat("a", n%2) }
	m := codec.Message{Body: bytes.Repeat([]byte{0xff}, pick())}
	if r.IntN(2) == 0 {
		m.Group = str(min(pick(), 1024))
	}
	if r.IntN(2) == 0 {
		m.IdempotencyKey = str(min(pick(), 1024))
	}
	if n := r.IntN(4); n > 0 {
		m.Attributes = map[string]string{}
		for i := range n {
			m.Attributes[fmt.Sprintf("k%d", i)+str(min(pick(), 250))] = str(min(pick(), 1024))
		}
	}
	if r.IntN(8) == 0 {
		m.Attributes = map[string]string{"k": ""} // an empty value is still written
	}
	if r.IntN(2) == 0 {
		m.Trace.Parent = "00-" + strings.Repeat("a", 32) + "-" + strings.Repeat("b", 16) + "-01"
		if r.IntN(4) == 0 {
			m.Trace.Parent = str(1 + r.IntN(1024))
		}
		if r.IntN(2) == 0 {
			m.Trace.State = str(min(pick(), 1024))
		}
	}
	if r.IntN(4) == 0 {
		// The user's own trace attributes, which a carried context replaces.
		if m.Attributes == nil {
			m.Attributes = map[string]string{}
		}
		m.Attributes[pubsub.TraceParentAttribute] = str(min(pick(), 1024))
		if r.IntN(2) == 0 {
			m.Attributes[pubsub.TraceStateAttribute] = str(min(pick(), 1024))
		}
	}
	return m
}

// toProto mirrors the codec's documented mapping; propagate is
// !Config.DisableTracePropagation.
func toProto(m codec.Message, idemAttr string, propagate bool) *pubsubpb.PubsubMessage {
	attrs := map[string]string{}
	for k, v := range m.Attributes {
		attrs[k] = v
	}
	if m.IdempotencyKey != "" {
		attrs[idemAttr] = m.IdempotencyKey
	}
	// What Pub/Sub can take of the trace context (see the package doc): a
	// value over 1024 bytes or not UTF-8 does not travel; the state goes
	// first when the attributes would pass 100, then the whole context.
	fits := func(v string) bool { return len(v) <= pubsub.MaxAttributeValueBytes && utf8.ValidString(v) }
	parent, state := m.Trace.Parent, m.Trace.State
	if !fits(state) {
		state = ""
	}
	if !propagate || !fits(parent) {
		parent = ""
	}
	if parent != "" {
		n := len(attrs)
		for _, k := range []string{pubsub.TraceParentAttribute, pubsub.TraceStateAttribute} {
			if _, ok := attrs[k]; ok {
				n--
			}
		}
		if n+2 > pubsub.MaxAttributes || state == "" {
			state = ""
			if n+1 > pubsub.MaxAttributes {
				parent = ""
			}
		}
	}
	if parent != "" {
		delete(attrs, pubsub.TraceStateAttribute)
		attrs[pubsub.TraceParentAttribute] = parent
		if state != "" {
			attrs[pubsub.TraceStateAttribute] = state
		}
	}
	return &pubsubpb.PubsubMessage{Data: m.Body, Attributes: attrs, OrderingKey: m.Group}
}

func TestSizeIsTheEncodedSize(t *testing.T) {
	for _, propagate := range []bool{true, false} {
		c, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: "127.0.0.1:1", Insecure: true, DisableTracePropagation: !propagate})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close()) })
		r := rand.New(rand.NewPCG(1, 2))
		for range 300 {
			batch := make([]codec.Message, 1+r.IntN(5))
			req := &pubsubpb.PublishRequest{Topic: testTopic}
			sum := 0
			for i := range batch {
				batch[i] = randomMessage(r)
				sum += c.Size(batch[i])
				req.Messages = append(req.Messages, toProto(batch[i], pubsub.DefaultIdempotencyAttribute, propagate))
			}
			require.Equal(t, proto.Size(req), pubsub.MaxRequestBytes-c.Limits().MaxBytes+sum,
				"request size = topic field + Σ Size (propagate %v)", propagate)
		}
	}
}

// packedBatch returns messages whose Sizes sum to exactly maxBytes.
func packedBatch(t *testing.T, c *pubsub.Codec, maxBytes int) []codec.Message {
	t.Helper()
	var batch []codec.Message
	left := maxBytes
	for range 9 {
		m := codec.Message{Body: bytes.Repeat([]byte{'x'}, 1_000_000)}
		batch = append(batch, m)
		left -= c.Size(m)
	}
	for d := left; d > 0; d-- {
		m := codec.Message{Body: bytes.Repeat([]byte{'y'}, d), Attributes: map[string]string{"last": "1"}}
		if c.Size(m) == left {
			return append(batch, m)
		}
	}
	t.Fatalf("no data length gives a message of size %d", left)
	return nil
}

func TestFullRequestFitsTheLimit(t *testing.T) {
	rec := &recorder{}
	srv := newServer(t, rec.option())
	addr := newBigServer(t, srv)
	c := newCodec(t, addr, testTopic, codec.Tuning{})

	batch := packedBatch(t, c, c.Limits().MaxBytes)
	sum := 0
	for _, m := range batch {
		require.NoError(t, c.Validate(m))
		sum += c.Size(m)
	}
	require.Equal(t, c.Limits().MaxBytes, sum)

	res, err := c.SendBatch(context.Background(), batch)
	require.NoError(t, err, "a request packed to MaxBytes by Size is accepted")
	require.Len(t, res, len(batch))
	reqs := rec.requests()
	require.Len(t, reqs, 1)
	assert.Equal(t, pubsub.MaxRequestBytes, proto.Size(reqs[0]), "exactly Pub/Sub's limit, never over")
	assert.Len(t, srv.Messages(), len(batch))

	t.Run("one byte over is refused unsent", func(t *testing.T) {
		over := append([]codec.Message(nil), batch...)
		last := over[len(over)-1]
		last.Attributes = map[string]string{"last": "12"}
		over[len(over)-1] = last
		_, err := c.SendBatch(context.Background(), over)
		require.ErrorIs(t, err, codec.ErrRefused)
		assert.Len(t, rec.requests(), 1, "not sent")
	})
	t.Run("1000 entries are accepted, 1001 refused unsent", func(t *testing.T) {
		batch := make([]codec.Message, 1001)
		for i := range batch {
			batch[i] = msg(i)
		}
		_, err := c.SendBatch(context.Background(), batch)
		require.ErrorIs(t, err, codec.ErrRefused)
		assert.Len(t, rec.requests(), 1, "not sent")
		res, err := c.SendBatch(context.Background(), batch[:1000])
		require.NoError(t, err)
		assert.Len(t, res, 1000)
		assert.Len(t, rec.requests(), 2)
	})
}

func TestValidate(t *testing.T) {
	rec := &recorder{}
	srv := newServer(t, rec.option())
	c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
	attrs := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprint("a", i)] = "v"
		}
		return m
	}
	body := []byte("b")
	tests := []struct {
		name     string
		m        codec.Message
		code     string // "" means valid
		tooLarge bool
		text     string
	}{
		{"data only", codec.Message{Body: body}, "", false, ""},
		{"attributes only", codec.Message{Attributes: map[string]string{"k": "v"}}, "", false, ""},
		{"idempotency key only", codec.Message{IdempotencyKey: "k", Group: "g"}, "EmptyMessage", false, "non-empty data"},
		{"limits exactly", codec.Message{Body: body, Attributes: map[string]string{strings.Repeat("k", 256): strings.Repeat("v", 1024)}, Group: strings.Repeat("g", 1024)}, "", false, ""},
		{"100 attributes", codec.Message{Body: body, Attributes: attrs(100)}, "", false, ""},
		{"empty", codec.Message{Tenant: "t", Group: "g"}, "EmptyMessage", false, "non-empty data (Body) or at least one attribute"},
		{"data too large", codec.Message{Body: make([]byte, pubsub.MaxDataBytes+1)}, "DataTooLarge", true, "10000001 bytes"},
		{"message too large", codec.Message{Body: make([]byte, pubsub.MaxDataBytes)}, "MessageTooLarge", true, "encodes to 10000010 bytes"},
		{"101 attributes", codec.Message{Body: body, Attributes: attrs(101)}, "TooManyAttributes", false, "101 attributes"},
		{"100 attributes and a key", codec.Message{Body: body, Attributes: attrs(100), IdempotencyKey: "k"}, "TooManyAttributes", false, "101 attributes"},
		{"empty key", codec.Message{Body: body, Attributes: map[string]string{"": "v"}}, "EmptyAttributeKey", false, "empty"},
		{"long key", codec.Message{Body: body, Attributes: map[string]string{strings.Repeat("k", 257): "v"}}, "AttributeKeyTooLong", false, "257 bytes"},
		{"long value", codec.Message{Body: body, Attributes: map[string]string{"k": strings.Repeat("v", 1025)}}, "AttributeValueTooLong", false, "1025 bytes"},
		{"long idempotency key", codec.Message{Body: body, IdempotencyKey: strings.Repeat("i", 1025)}, "AttributeValueTooLong", false, `"idempotency-key" is 1025 bytes`},
		{"long ordering key", codec.Message{Body: body, Group: strings.Repeat("g", 1025)}, "OrderingKeyTooLong", false, "1025 bytes"},
		{"bad UTF-8 key", codec.Message{Body: body, Attributes: map[string]string{"\xff": "v"}}, "InvalidUTF8", false, "attribute key"},
		{"bad UTF-8 value", codec.Message{Body: body, Attributes: map[string]string{"k": "\xff"}}, "InvalidUTF8", false, `value of attribute "k"`},
		{"bad UTF-8 ordering key", codec.Message{Body: body, Group: "\xff"}, "InvalidUTF8", false, "ordering key"},
		{"bad UTF-8 idempotency key", codec.Message{Body: body, IdempotencyKey: "\xff"}, "InvalidUTF8", false, "idempotency-key"},
		{"idempotency attribute taken", codec.Message{Body: body, IdempotencyKey: "k", Attributes: map[string]string{"idempotency-key": "other"}}, "IdempotencyAttributeTaken", false, `"idempotency-key" is set`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Validate(tt.m)
			if tt.code == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			var ee *codec.EntryError
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, tt.code, ee.Code)
			assert.True(t, ee.Permanent)
			assert.True(t, codec.IsPermanent(err))
			assert.Equal(t, tt.tooLarge, errors.Is(err, codec.ErrTooLarge))
			assert.Contains(t, err.Error(), tt.text)
			assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch: "), err.Error())

			// SendBatch answers it the same way and never sends it.
			before := rec.calls.Load()
			res, err := c.SendBatch(context.Background(), []codec.Message{msg(1), tt.m, msg(2)})
			require.NoError(t, err)
			require.Len(t, res, 3)
			assert.NoError(t, res[0].Err)
			assert.NoError(t, res[2].Err)
			assert.NotEmpty(t, res[0].ID)
			assert.Empty(t, res[1].ID)
			assert.Equal(t, c.Validate(tt.m), res[1].Err)
			assert.Equal(t, before+1, rec.calls.Load())
			last := rec.requests()[len(rec.requests())-1]
			assert.Len(t, last.Messages, 2, "the invalid message is not in the request")
		})
	}
}

func TestErrorClassification(t *testing.T) {
	type kind int
	const (
		refused kind = iota
		permanent
		retryable
	)
	tests := []struct {
		code codes.Code
		want kind
	}{
		{codes.InvalidArgument, refused},
		{codes.NotFound, permanent},
		{codes.PermissionDenied, permanent},
		{codes.Unauthenticated, permanent},
		{codes.FailedPrecondition, permanent},
		{codes.Unimplemented, permanent},
		{codes.Unavailable, retryable},
		{codes.DeadlineExceeded, retryable},
		{codes.ResourceExhausted, retryable},
		{codes.Aborted, retryable},
		{codes.Internal, retryable},
		{codes.Unknown, retryable},
		{codes.Canceled, retryable},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			rec := &recorder{fail: func(int64, *pubsubpb.PublishRequest) error {
				return status.Error(tt.code, "injected "+tt.code.String())
			}}
			srv := newServer(t, rec.option())
			c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})

			res, err := c.SendBatch(context.Background(), []codec.Message{msg(1), msg(2)})
			require.Error(t, err)
			assert.Nil(t, res)
			assert.Equal(t, int64(1), rec.calls.Load(), "exactly one Publish call: no retries under the codec")
			assert.Equal(t, tt.code, status.Code(err), "the gRPC status stays in the chain")
			assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch/pubsub: "), err.Error())
			assert.Contains(t, err.Error(), "injected")
			var ee *codec.EntryError
			switch tt.want {
			case refused:
				assert.ErrorIs(t, err, codec.ErrRefused)
				assert.False(t, errors.As(err, &ee), "a refusal is no entry's verdict yet: the batcher bisects")
			case permanent, retryable:
				assert.NotErrorIs(t, err, codec.ErrRefused)
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, tt.code.String(), ee.Code)
				assert.Equal(t, tt.want == permanent, ee.Permanent)
				assert.Equal(t, tt.want == permanent, codec.IsPermanent(err))
			}
			assert.Empty(t, srv.Messages(), "all or nothing")
		})
	}

	t.Run("missing topic", func(t *testing.T) {
		srv := newServer(t)
		c := newCodec(t, srv.Addr, "projects/p/topics/missing", codec.Tuning{})
		_, err := c.SendBatch(context.Background(), []codec.Message{msg(1)})
		require.Error(t, err)
		assert.Equal(t, codes.NotFound, status.Code(err))
		assert.True(t, codec.IsPermanent(err))
	})
	t.Run("over gRPC's default 4 MiB receive limit", func(t *testing.T) {
		srv := newServer(t)
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
		_, err := c.SendBatch(context.Background(), []codec.Message{{Body: make([]byte, 5<<20)}})
		require.Error(t, err)
		assert.Equal(t, codes.ResourceExhausted, status.Code(err))
		assert.ErrorIs(t, err, codec.ErrRefused, "too large for this server: the batcher bisects")
		assert.False(t, codec.IsThrottled(err), "a size limit is no request to slow down")
		assert.Contains(t, err.Error(), "larger than max")
	})
}

// TestResourceExhaustedIsThrottling injects the service's ResourceExhausted
// (a quota or flow-control refusal): every message gets a retryable answer
// that codec.IsThrottled reports, through the codec and through the batcher.
func TestResourceExhaustedIsThrottling(t *testing.T) {
	srv := pstest.NewServer(pstest.WithErrorInjection("Publish", codes.ResourceExhausted, "Publish quota exceeded"))
	t.Cleanup(func() { _ = srv.Close() })
	c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})

	res, err := c.SendBatch(context.Background(), []codec.Message{msg(1), msg(2)})
	assert.Nil(t, res)
	require.Error(t, err)
	assert.True(t, codec.IsThrottled(err))
	assert.ErrorIs(t, err, codec.ErrThrottled)
	assert.False(t, codec.IsPermanent(err))
	assert.NotErrorIs(t, err, codec.ErrRefused)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	var ee *codec.EntryError
	require.ErrorAs(t, err, &ee)
	assert.True(t, ee.Throttled)
	assert.Contains(t, err.Error(), "ResourceExhausted (retryable, throttled): Publish quota exceeded")

	inst := startInstance(t)
	for _, o := range deliverAll(t, inst, c, []codec.Message{msg(3), msg(4), msg(5)}) {
		require.Error(t, o.err)
		assert.True(t, codec.IsThrottled(o.err), "the caller sees the throttling: %v", o.err)
		assert.False(t, codec.IsPermanent(o.err))
	}
	assert.Empty(t, srv.Messages())

	t.Run("no other code is throttling", func(t *testing.T) {
		for _, code := range []codes.Code{codes.Unavailable, codes.Internal, codes.Aborted, codes.DeadlineExceeded, codes.NotFound} {
			srv := pstest.NewServer(pstest.WithErrorInjection("Publish", code, "injected"))
			t.Cleanup(func() { _ = srv.Close() })
			c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
			_, err := c.SendBatch(context.Background(), []codec.Message{msg(1)})
			require.Error(t, err, code)
			assert.False(t, codec.IsThrottled(err), code)
		}
	})
}

// blockingServer's Publish blocks until the test ends; entered receives a
// value as each call arrives.
func blockingServer(t *testing.T) (addr string, entered <-chan struct{}) {
	t.Helper()
	release := make(chan struct{})
	in := make(chan struct{}, 16)
	rec := &recorder{fail: func(int64, *pubsubpb.PublishRequest) error {
		in <- struct{}{}
		<-release
		return status.Error(codes.Unavailable, "released")
	}}
	srv := newServer(t, rec.option())
	t.Cleanup(func() { close(release) }) // before the server closes
	return srv.Addr, in
}

func TestContextEndsSendBatch(t *testing.T) {
	t.Run("already cancelled: nothing sent", func(t *testing.T) {
		rec := &recorder{}
		srv := newServer(t, rec.option())
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := c.SendBatch(ctx, []codec.Message{msg(1)})
		require.ErrorIs(t, err, context.Canceled)
		assert.False(t, codec.IsPermanent(err))
		assert.Zero(t, rec.calls.Load())
	})
	tests := []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		end  func(cancel context.CancelFunc)
		want error
	}{
		{"cancelled during the call", func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.Background())
		}, func(cancel context.CancelFunc) { cancel() }, context.Canceled},
		{"deadline during the call", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, func(context.CancelFunc) {}, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, entered := blockingServer(t)
			c := newCodec(t, addr, testTopic, codec.Tuning{})
			ctx, cancel := tt.ctx()
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := c.SendBatch(ctx, []codec.Message{msg(1)})
				done <- err
			}()
			<-entered
			start := time.Now()
			tt.end(cancel)
			select {
			case err := <-done:
				require.ErrorIs(t, err, tt.want)
				var ee *codec.EntryError
				require.ErrorAs(t, err, &ee)
				assert.False(t, ee.Permanent)
				assert.Less(t, time.Since(start), 2*time.Second)
			case <-time.After(5 * time.Second):
				t.Fatal("SendBatch did not return when its context ended")
			}
		})
	}
}

func TestMixedOrderingKeys(t *testing.T) {
	t.Run("one request per key, in order", func(t *testing.T) {
		rec := &recorder{}
		srv := newServer(t, rec.option())
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
		var batch []codec.Message
		for i := range 30 {
			batch = append(batch, codec.Message{Group: []string{"a", "b", ""}[i%3], Body: []byte(fmt.Sprint(i))})
		}
		res, err := c.SendBatch(context.Background(), batch)
		require.NoError(t, err)
		require.Len(t, res, len(batch))
		assert.Equal(t, int64(3), rec.calls.Load())
		for _, req := range rec.requests() {
			for _, m := range req.Messages {
				assert.Equal(t, req.Messages[0].OrderingKey, m.OrderingKey, "a request holds one ordering key")
			}
		}
		byID := map[string]int{}
		for i, r := range res {
			require.NoError(t, r.Err)
			byID[r.ID] = i
		}
		last := map[string]int{}
		for _, m := range srv.Messages() {
			i, ok := byID[m.ID]
			require.True(t, ok)
			assert.Equal(t, string(batch[i].Body), string(m.Data))
			assert.Equal(t, batch[i].Group, m.OrderingKey)
			if prev, seen := last[m.OrderingKey]; seen {
				assert.Less(t, prev, i, "key %q in order", m.OrderingKey)
			}
			last[m.OrderingKey] = i
		}
	})

	t.Run("a refusal is bisected within its key", func(t *testing.T) {
		rec := &recorder{fail: refusePoison}
		srv := newServer(t, rec.option())
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
		batch := []codec.Message{
			{Group: "a", Body: []byte("a1")}, {Group: "b", Body: []byte("b1")},
			{Group: "a", Body: []byte("a2")}, {Group: "a", Body: []byte("poison")},
			{Group: "a", Body: []byte("a4")}, {Group: "a", Body: []byte("a5")},
		}
		res, err := c.SendBatch(context.Background(), batch)
		require.NoError(t, err, "siblings were published: answers are per message")
		var published []string
		for _, m := range srv.Messages() {
			published = append(published, string(m.Data))
		}
		assert.ElementsMatch(t, []string{"a1", "a2", "a4", "a5", "b1"}, published, "each once")
		for i, r := range res {
			if string(batch[i].Body) == "poison" {
				assert.ErrorIs(t, r.Err, codec.ErrRefused)
				assert.True(t, codec.IsPermanent(r.Err))
				continue
			}
			assert.NoError(t, r.Err)
			assert.NotEmpty(t, r.ID)
		}
	})

	t.Run("a failed key stops its later messages", func(t *testing.T) {
		rec := &recorder{fail: func(_ int64, req *pubsubpb.PublishRequest) error {
			data := map[string]bool{}
			for _, m := range req.Messages {
				data[string(m.Data)] = true
			}
			switch {
			case data["poison"]:
				return status.Error(codes.InvalidArgument, "poison")
			case data["a1"]:
				return status.Error(codes.Unavailable, "flaky")
			}
			return nil
		}}
		srv := newServer(t, rec.option())
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
		batch := []codec.Message{
			{Group: "a", Body: []byte("a1")}, {Group: "a", Body: []byte("a2")},
			{Group: "a", Body: []byte("poison")}, {Group: "a", Body: []byte("a4")},
			{Group: "b", Body: []byte("b1")},
		}
		res, err := c.SendBatch(context.Background(), batch)
		require.NoError(t, err)
		require.Len(t, srv.Messages(), 1)
		assert.Equal(t, "b1", string(srv.Messages()[0].Data))
		for i := range 4 {
			require.Error(t, res[i].Err, batch[i].Body)
			assert.False(t, codec.IsPermanent(res[i].Err), "nothing of key a was judged: %v", res[i].Err)
		}
		assert.Equal(t, codes.Unavailable, status.Code(res[0].Err))
		assert.Contains(t, res[2].Err.Error(), "not sent after an earlier message")
		assert.NoError(t, res[4].Err)
	})
}

func TestReadyClient(t *testing.T) {
	rec := &recorder{fail: func(n int64, _ *pubsubpb.PublishRequest) error {
		if n == 1 || n == 3 {
			return status.Error(codes.Unavailable, "flaky")
		}
		return nil
	}}
	srv := newServer(t, rec.option())
	client, err := newAPIClient(srv.Addr)
	require.NoError(t, err)
	defer func() { require.NoError(t, client.Close()) }()

	// Control: on its own the client retries Unavailable.
	_, err = client.Publish(context.Background(), &pubsubpb.PublishRequest{Topic: testTopic, Messages: []*pubsubpb.PubsubMessage{{Data: []byte("control")}}})
	require.NoError(t, err)
	require.Equal(t, int64(2), rec.calls.Load())

	c, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Client: client, IdentityExtra: []byte("test client")})
	require.NoError(t, err)
	_, err = c.SendBatch(context.Background(), []codec.Message{msg(1)})
	require.Error(t, err, "the client's own retry of Unavailable is overridden")
	assert.Equal(t, int64(3), rec.calls.Load())
	assert.False(t, codec.IsPermanent(err))

	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "Close is idempotent")
	res, err := c.SendBatch(context.Background(), []codec.Message{msg(2)})
	require.NoError(t, err, "Close left the caller's client open")
	assert.NotEmpty(t, res[0].ID)

	t.Run("a dialled client is closed", func(t *testing.T) {
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
		require.NoError(t, c.Close())
		_, err := c.SendBatch(context.Background(), []codec.Message{msg(3)})
		require.Error(t, err)
		assert.False(t, codec.IsPermanent(err))
	})
}

func FuzzSize(f *testing.F) {
	parent := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	f.Add([]byte("body"), "group", "idem", "key", "value", "", "", false)
	f.Add([]byte{}, "", "", "", "", "", "", false)
	f.Add(bytes.Repeat([]byte{1}, 300), strings.Repeat("g", 200), "", strings.Repeat("k", 127), strings.Repeat("v", 128), parent, "", false)
	f.Add([]byte("b"), "", "", pubsub.TraceParentAttribute, "stale", parent, "vendor=x", false)
	f.Add([]byte("b"), "", "", pubsub.TraceStateAttribute, "stale", parent, "", false)
	f.Add([]byte("b"), "", "i", pubsub.TraceStateAttribute, "stale", parent, strings.Repeat("s", 120), true)
	on := newCodec(f, "127.0.0.1:1", testTopic, codec.Tuning{})
	off, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: "127.0.0.1:1", Insecure: true, DisableTracePropagation: true})
	require.NoError(f, err)
	f.Cleanup(func() { require.NoError(f, off.Close()) })
	f.Fuzz(func(t *testing.T, body []byte, group, idem, key, value, parent, state string, disable bool) {
		c := on
		if disable {
			c = off
		}
		m := codec.Message{Body: body, Group: group, IdempotencyKey: idem, Trace: codec.TraceContext{Parent: parent, State: state}}
		if key != "" || value != "" {
			m.Attributes = map[string]string{key: value}
		}
		req := &pubsubpb.PublishRequest{Topic: testTopic, Messages: []*pubsubpb.PubsubMessage{toProto(m, pubsub.DefaultIdempotencyAttribute, !disable)}}
		if _, taken := m.Attributes[pubsub.DefaultIdempotencyAttribute]; taken && idem != "" {
			t.Skip("invalid: the idempotency attribute is taken")
		}
		require.Equal(t, proto.Size(req), pubsub.MaxRequestBytes-c.Limits().MaxBytes+c.Size(m))
	})
}

// TestAnswerWithoutIDs forges Publish answers that lack message ids, as a
// faulty server or proxy could send: no message without an id is
// acknowledged, and every such message gets a retryable answer saying it may
// have been stored.
func TestAnswerWithoutIDs(t *testing.T) {
	forge := func(t *testing.T, ids func(req *pubsubpb.PublishRequest) []string) *pubsub.Codec {
		srv := newServer(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: reactor(
			func(req *pubsubpb.PublishRequest) (bool, any, error) {
				if err := refusePoison(0, req); err != nil {
					return true, nil, err
				}
				return true, &pubsubpb.PublishResponse{MessageIds: ids(req)}, nil
			})})
		return newCodec(t, srv.Addr, testTopic, codec.Tuning{})
	}
	missing := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		var ee *codec.EntryError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, pubsub.CodeMissingResult, ee.Code)
		assert.False(t, codec.IsPermanent(err), "the message may be stored: retry it with its key")
		assert.Contains(t, err.Error(), "may have been stored")
		assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch/pubsub: "), err.Error())
	}

	t.Run("no ids at all", func(t *testing.T) {
		c := forge(t, func(*pubsubpb.PublishRequest) []string { return nil })
		res, err := c.SendBatch(context.Background(), []codec.Message{msg(1), msg(2)})
		assert.Nil(t, res)
		missing(t, err)
		assert.ErrorIs(t, err, codec.ErrResultCount)
		assert.Contains(t, err.Error(), "0 message ids for 2 messages")
	})
	t.Run("fewer ids than messages", func(t *testing.T) {
		c := forge(t, func(*pubsubpb.PublishRequest) []string { return []string{"m1"} })
		res, err := c.SendBatch(context.Background(), []codec.Message{msg(1), msg(2)})
		assert.Nil(t, res)
		missing(t, err)
		assert.ErrorIs(t, err, codec.ErrResultCount)
	})
	t.Run("more ids than messages", func(t *testing.T) {
		c := forge(t, func(*pubsubpb.PublishRequest) []string { return []string{"m1", "m2", "m3"} })
		_, err := c.SendBatch(context.Background(), []codec.Message{msg(1), msg(2)})
		missing(t, err)
		assert.ErrorIs(t, err, codec.ErrResultCount)
	})
	t.Run("empty ids", func(t *testing.T) {
		c := forge(t, func(*pubsubpb.PublishRequest) []string { return []string{"m1", "", "m3", ""} })
		res, err := c.SendBatch(context.Background(), []codec.Message{msg(1), msg(2), msg(3), msg(4)})
		require.NoError(t, err, "answers are per message")
		require.Len(t, res, 4)
		assert.Equal(t, "m1", res[0].ID)
		assert.NoError(t, res[0].Err)
		assert.Equal(t, "m3", res[2].ID)
		assert.NoError(t, res[2].Err)
		for _, i := range []int{1, 3} {
			assert.Empty(t, res[i].ID)
			missing(t, res[i].Err)
			assert.NotErrorIs(t, res[i].Err, codec.ErrResultCount, "the count was right")
		}
	})
	t.Run("an empty id stops its key's later requests", func(t *testing.T) {
		c := forge(t, func(req *pubsubpb.PublishRequest) []string {
			ids := make([]string, len(req.Messages))
			for i, m := range req.Messages {
				if string(m.Data) != "a1" {
					ids[i] = "id-" + string(m.Data)
				}
			}
			return ids
		})
		// Mixed keys: one request per key; the poison makes key a's request
		// bisect into [a1] and [poison a2], sent only after [a1].
		batch := []codec.Message{
			{Group: "a", Body: []byte("a1")}, {Group: "b", Body: []byte("b1")},
			{Group: "a", Body: []byte("poison")}, {Group: "a", Body: []byte("a2")},
		}
		res, err := c.SendBatch(context.Background(), batch)
		require.NoError(t, err)
		missing(t, res[0].Err)
		assert.Equal(t, "id-b1", res[1].ID)
		for _, i := range []int{2, 3} {
			require.Error(t, res[i].Err, "a later message of key a would overtake a1")
			assert.False(t, codec.IsPermanent(res[i].Err))
		}
	})
}

func TestCompression(t *testing.T) {
	srv := newServer(t)
	addr, wire := newWireServer(t, srv)
	const threshold = 1000
	newC := func(threshold int) *pubsub.Codec {
		c, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: addr, Insecure: true, CompressionBytesThreshold: threshold})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close()) })
		return c
	}
	c := newC(threshold)
	topicField := pubsub.MaxRequestBytes - c.Limits().MaxBytes
	// sized returns a message whose request alone is n bytes.
	sized := func(n int) codec.Message {
		for d := n; d > 0; d-- {
			m := codec.Message{Body: bytes.Repeat([]byte(`{"k":"v"},`), d)[:d], Attributes: map[string]string{"a": "b"}}
			if topicField+c.Size(m) == n {
				return m
			}
		}
		t.Fatalf("no body gives a request of %d bytes", n)
		return codec.Message{}
	}
	send := func(c *pubsub.Codec, batch []codec.Message) wireCall {
		t.Helper()
		srv.ClearMessages()
		res, err := c.SendBatch(context.Background(), batch)
		require.NoError(t, err)
		got := srv.Messages()
		require.Len(t, got, len(batch))
		for i, m := range got {
			require.NoError(t, res[i].Err)
			assert.Equal(t, res[i].ID, m.ID)
			assert.Equal(t, batch[i].Body, m.Data, "the server holds the message intact")
			assert.Equal(t, batch[i].Attributes, m.Attributes)
		}
		calls := wire.take()
		require.Len(t, calls, 1)
		return calls[0]
	}

	at := send(c, []codec.Message{sized(threshold)})
	assert.Equal(t, threshold, at.length)
	assert.NotEqual(t, "gzip", at.compression, "a request of exactly the threshold is not compressed")
	assert.Greater(t, at.wire, at.length, "uncompressed: payload and framing")

	over := send(c, []codec.Message{sized(threshold + 1)})
	assert.Equal(t, threshold+1, over.length)
	assert.Equal(t, "gzip", over.compression, "one byte over is compressed")
	assert.Less(t, over.wire, over.length/4, "repetitive JSON shrinks")

	batch := make([]codec.Message, 100)
	for i := range batch {
		batch[i] = codec.Message{Body: []byte(fmt.Sprintf(`{"order":%d,"status":"paid","items":[1,2,3]}`, i)), Attributes: map[string]string{"n": fmt.Sprint(i)}}
	}
	big := send(c, batch)
	assert.Equal(t, "gzip", big.compression)
	assert.Less(t, big.wire, big.length)

	off := send(newC(0), batch)
	assert.NotEqual(t, "gzip", off.compression, "0 never compresses")
	assert.Equal(t, big.length, off.length)

	t.Run("a negative threshold is refused", func(t *testing.T) {
		_, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: addr, Insecure: true, CompressionBytesThreshold: -1})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "sinkbatch/pubsub: New: Config.CompressionBytesThreshold -1 is negative")
	})
	t.Run("identity", func(t *testing.T) {
		assert.NotEqual(t, newC(0).Identity(), c.Identity(), "compression shapes the request")
		assert.Equal(t, newC(threshold).Identity(), c.Identity())
	})
}

// TestTracePropagation publishes messages with a trace context to pstest and
// reads it back from the stored attributes, with the carrier Google's client
// library extracts it with.
func TestTracePropagation(t *testing.T) {
	const (
		parent1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		parent2 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
		state1  = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
	)
	rec := &recorder{}
	srv := newServer(t, rec.option())
	stale := map[string]string{pubsub.TraceParentAttribute: "00-stale", pubsub.TraceStateAttribute: "stale=1", "colour": "blue"}
	batch := []codec.Message{
		{Body: []byte("with state"), Trace: codec.TraceContext{Parent: parent1, State: state1}},
		{Body: []byte("forwarded"), Attributes: stale, Trace: codec.TraceContext{Parent: parent2}},
		{Body: []byte("untraced"), Attributes: map[string]string{"colour": "red"}},
		{Body: []byte("keyed"), IdempotencyKey: "k-1", Trace: codec.TraceContext{Parent: parent2, State: state1}},
		{Body: []byte("state without parent"), Trace: codec.TraceContext{State: state1}},
	}

	t.Run("carried as Google's client carries it", func(t *testing.T) {
		srv.ClearMessages()
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
		res, err := c.SendBatch(context.Background(), batch)
		require.NoError(t, err)
		for _, r := range res {
			require.NoError(t, r.Err)
		}
		assert.Equal(t, map[string]string{pubsub.TraceParentAttribute: "00-stale", pubsub.TraceStateAttribute: "stale=1", "colour": "blue"}, stale,
			"the caller's map is not modified")

		got := srv.Messages()
		require.Len(t, got, len(batch))
		want := []map[string]string{
			{"googclient_traceparent": parent1, "googclient_tracestate": state1},
			{"googclient_traceparent": parent2, "colour": "blue"}, // the stale tracestate does not travel with a new parent
			{"colour": "red"},
			{"googclient_traceparent": parent2, "googclient_tracestate": state1, pubsub.DefaultIdempotencyAttribute: "k-1"},
			nil,
		}
		for i, m := range got {
			assert.Equal(t, want[i], m.Attributes, "message %d", i)

			// What Google's subscriber does with a received message.
			ctx := propagation.TraceContext{}.Extract(context.Background(),
				gpubsub.NewMessageCarrierFromPB(&pubsubpb.PubsubMessage{Attributes: m.Attributes}))
			back := propagation.MapCarrier{}
			propagation.TraceContext{}.Inject(ctx, back)
			if batch[i].Trace.Parent == "" {
				assert.Empty(t, back, "message %d carries no trace", i)
				continue
			}
			assert.Equal(t, batch[i].Trace.Parent, back.Get("traceparent"), "message %d: the subscriber continues the trace", i)
			assert.Equal(t, batch[i].Trace.State, back.Get("tracestate"), "message %d", i)
		}

		reqs := rec.requests()
		sum := pubsub.MaxRequestBytes - c.Limits().MaxBytes
		for _, m := range batch {
			sum += c.Size(m)
		}
		assert.Equal(t, proto.Size(reqs[len(reqs)-1]), sum, "Size counts what is carried")
	})

	t.Run("DisableTracePropagation", func(t *testing.T) {
		srv.ClearMessages()
		c, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: srv.Addr, Insecure: true, DisableTracePropagation: true})
		require.NoError(t, err)
		defer func() { require.NoError(t, c.Close()) }()
		_, err = c.SendBatch(context.Background(), batch)
		require.NoError(t, err)
		got := srv.Messages()
		require.Len(t, got, len(batch))
		assert.Nil(t, got[0].Attributes)
		assert.Equal(t, stale, got[1].Attributes, "the user's attributes as given")
		assert.Equal(t, map[string]string{pubsub.DefaultIdempotencyAttribute: "k-1"}, got[3].Attributes)
		reqs := rec.requests()
		sum := pubsub.MaxRequestBytes - c.Limits().MaxBytes
		for _, m := range batch {
			sum += c.Size(m)
		}
		assert.Equal(t, proto.Size(reqs[len(reqs)-1]), sum)
		assert.NotEqual(t, newCodec(t, srv.Addr, testTopic, codec.Tuning{}).Identity(), c.Identity())
	})

	t.Run("counts in the attribute limits", func(t *testing.T) {
		on := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
		off, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: srv.Addr, Insecure: true, DisableTracePropagation: true})
		require.NoError(t, err)
		defer func() { require.NoError(t, off.Close()) }()
		attrs := func(n int, extra ...string) map[string]string {
			m := map[string]string{}
			for i := range n {
				m[fmt.Sprint("a", i)] = "v"
			}
			for _, k := range extra {
				m[k] = "old"
			}
			return m
		}
		tests := []struct {
			name string
			m    codec.Message
			code string // from the codec that propagates; "" is valid (a trace context Pub/Sub cannot take is dropped, never the message)
		}{
			{"98 and both trace attributes", codec.Message{Body: []byte("b"), Attributes: attrs(98), Trace: codec.TraceContext{Parent: parent1, State: state1}}, ""},
			{"99 and both trace attributes", codec.Message{Body: []byte("b"), Attributes: attrs(99), Trace: codec.TraceContext{Parent: parent1, State: state1}}, ""}, // the state is dropped
			{"99 and the parent", codec.Message{Body: []byte("b"), Attributes: attrs(99), Trace: codec.TraceContext{Parent: parent1}}, ""},
			{"replaced, not added", codec.Message{Body: []byte("b"), Attributes: attrs(98, pubsub.TraceParentAttribute, pubsub.TraceStateAttribute), Trace: codec.TraceContext{Parent: parent1, State: state1}}, ""},
			{"99, a key and the parent", codec.Message{Body: []byte("b"), Attributes: attrs(98), IdempotencyKey: "k", Trace: codec.TraceContext{Parent: parent1, State: state1}}, ""}, // the state is dropped
			{"long tracestate", codec.Message{Body: []byte("b"), Trace: codec.TraceContext{Parent: parent1, State: strings.Repeat("s", 1025)}}, ""},                                   // the state is dropped
			{"bad UTF-8 traceparent", codec.Message{Body: []byte("b"), Trace: codec.TraceContext{Parent: "\xff"}}, ""},                                                                // the trace is dropped
			{"100 attributes and the parent", codec.Message{Body: []byte("b"), Attributes: attrs(100), Trace: codec.TraceContext{Parent: parent1}}, ""},                               // the trace is dropped
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				assert.NoError(t, off.Validate(tt.m), "without propagation nothing is added")
				err := on.Validate(tt.m)
				if tt.code == "" {
					require.NoError(t, err)
					res, err := on.SendBatch(context.Background(), []codec.Message{tt.m})
					require.NoError(t, err)
					require.NoError(t, res[0].Err, "Pub/Sub takes it")
					return
				}
				var ee *codec.EntryError
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, tt.code, ee.Code)
				assert.True(t, ee.Permanent)
				if tt.code == "AttributeValueTooLong" {
					assert.Contains(t, err.Error(), pubsub.TraceStateAttribute)
				}
			})
		}
	})

	t.Run("the idempotency attribute cannot be a trace attribute", func(t *testing.T) {
		for _, attr := range []string{pubsub.TraceParentAttribute, pubsub.TraceStateAttribute} {
			_, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: srv.Addr, Insecure: true, IdempotencyAttribute: attr})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "sinkbatch/pubsub: New: Config.IdempotencyAttribute")
		}
	})
}

func TestDescribeNamesTheTopic(t *testing.T) {
	c, err := pubsub.New(context.Background(), pubsub.Config{Topic: "projects/p/topics/orders", Endpoint: "127.0.0.1:1", Insecure: true})
	require.NoError(t, err)
	defer func() { assert.NoError(t, c.Close()) }()
	var d codec.Describer = c
	system, dest := d.Describe()
	assert.Equal(t, "gcp_pubsub", system)
	assert.Equal(t, "orders", dest)
}
