package sqs_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

const testQueue = "https://sqs.us-east-1.amazonaws.com/123456789012/orders"

func baseConfig() sqs.Config {
	return sqs.Config{
		QueueURL: testQueue,
		AWS: aws.Config{
			Region:      "us-east-1",
			Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "wJalrXUtnFEMI-very-secret", ""),
		},
	}
}

func mustNew(t *testing.T, cfg sqs.Config) *sqs.Codec {
	t.Helper()
	c, err := sqs.New(cfg)
	require.NoError(t, err)
	return c
}

func TestNewRefusesBadConfig(t *testing.T) {
	client := awssqs.NewFromConfig(baseConfig().AWS)
	tests := []struct {
		name string
		edit func(*sqs.Config)
		want string
	}{
		{"empty queue URL", func(c *sqs.Config) { c.QueueURL = "" }, "QueueURL is empty"},
		{"no scheme", func(c *sqs.Config) { c.QueueURL = "sqs.us-east-1.amazonaws.com/1/q" }, "not a queue URL"},
		{"ftp", func(c *sqs.Config) { c.QueueURL = "ftp://host/1/q" }, "not a queue URL"},
		{"no queue name", func(c *sqs.Config) { c.QueueURL = "https://host/" }, "not a queue URL"},
		{"bad queue name", func(c *sqs.Config) { c.QueueURL = "https://host/1/my queue" }, "not a queue URL"},
		{"unparsable", func(c *sqs.Config) { c.QueueURL = "https://host/%zz" }, "QueueURL"},
		{"MaxEntries over 10", func(c *sqs.Config) { c.Tuning.MaxEntries = 11 }, "sinkbatch/sqs: New: sinkbatch: Tuning.MaxEntries 11 is above the destination's limit 10"},
		{"MaxEntries negative", func(c *sqs.Config) { c.Tuning.MaxEntries = -1 }, "MaxEntries -1"},
		{"MaxBytes over 1 MiB", func(c *sqs.Config) { c.Tuning.MaxBytes = sqs.MaxBytes + 1 }, "MaxBytes 1048577"},
		{"negative Linger", func(c *sqs.Config) { c.Tuning.Linger = -time.Millisecond }, "Linger"},
		{"negative RetryAfterMax", func(c *sqs.Config) { c.Tuning.RetryAfterMax = -time.Second }, "RetryAfterMax"},
		{"negative IdleTimeout", func(c *sqs.Config) { c.Tuning.IdleTimeout = -time.Second }, "IdleTimeout"},
		{"negative QueueMax", func(c *sqs.Config) { c.Tuning.QueueMax = -1 }, "Tuning.QueueMax -1 is negative"},
		{"negative MaxInflight", func(c *sqs.Config) { c.Tuning.MaxInflight = -2 }, "Tuning.MaxInflight -2 is negative"},
		{"unknown WhenFull", func(c *sqs.Config) { c.Tuning.WhenFull = 7 }, "Tuning.WhenFull"},
		{"QueueMaxBytes below a request", func(c *sqs.Config) { c.Tuning.QueueMaxBytes = 1000 }, "Tuning.QueueMaxBytes 1000"},
		{"bad idempotency attribute", func(c *sqs.Config) { c.IdempotencyAttribute = "AWS.key" }, "IdempotencyAttribute"},
		{"no region", func(c *sqs.Config) { c.AWS.Region = "" }, "no region"},
		{"no credentials", func(c *sqs.Config) { c.AWS.Credentials = nil }, "no credentials"},
		{"both AWS and Client", func(c *sqs.Config) { c.Client = client }, "not both"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := baseConfig()
			tt.edit(&cfg)
			c, err := sqs.New(cfg)
			require.Error(t, err)
			assert.Nil(t, c)
			assert.Contains(t, err.Error(), tt.want)
			assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch/sqs: "), err.Error())
			assert.NotContains(t, err.Error(), "very-secret")
		})
	}
}

func TestNewAcceptsTheEdges(t *testing.T) {
	cfg := baseConfig()
	cfg.Tuning = codec.Tuning{MaxEntries: sqs.MaxEntries, MaxBytes: sqs.MaxBytes}
	c := mustNew(t, cfg)
	assert.False(t, c.FIFO())

	cfg.QueueURL = "http://127.0.0.1:4566/000000000000/orders.fifo"
	assert.True(t, mustNew(t, cfg).FIFO())

	withClient := sqs.Config{QueueURL: testQueue, Client: awssqs.NewFromConfig(baseConfig().AWS)}
	mustNew(t, withClient)
}

func TestIdentity(t *testing.T) {
	base := mustNew(t, baseConfig())
	assert.Equal(t, base.Identity(), mustNew(t, baseConfig()).Identity(), "equal configs share an Identity")
	assert.Equal(t, "sqs", base.Name())

	otherHTTP := &http.Client{}
	differ := map[string]func(*sqs.Config){
		"queue":    func(c *sqs.Config) { c.QueueURL += "2" },
		"region":   func(c *sqs.Config) { c.AWS.Region = "eu-west-1" },
		"endpoint": func(c *sqs.Config) { c.AWS.BaseEndpoint = aws.String("http://127.0.0.1:1") },
		"access key": func(c *sqs.Config) {
			c.AWS.Credentials = credentials.NewStaticCredentialsProvider("AKID2", "wJalrXUtnFEMI-very-secret", "")
		},
		"secret": func(c *sqs.Config) {
			c.AWS.Credentials = credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "other-secret", "")
		},
		"http client":  func(c *sqs.Config) { c.AWS.HTTPClient = otherHTTP },
		"max attempts": func(c *sqs.Config) { c.AWS.RetryMaxAttempts = 7 },
		"api options": func(c *sqs.Config) {
			c.AWS.APIOptions = append(c.AWS.APIOptions, func(*middleware.Stack) error { return nil })
		},
		"tuning":    func(c *sqs.Config) { c.Tuning.Linger = time.Millisecond },
		"cbd":       func(c *sqs.Config) { c.ContentBasedDeduplication = true },
		"idem attr": func(c *sqs.Config) { c.IdempotencyAttribute = "dedup" },
	}
	seen := map[string]string{string(base.Identity()): "base"}
	for name, edit := range differ {
		cfg := baseConfig()
		edit(&cfg)
		id := string(mustNew(t, cfg).Identity())
		prev, dup := seen[id]
		assert.False(t, dup, "%s shares an Identity with %s", name, prev)
		seen[id] = name
	}

	// The secret is only ever digested.
	secret := []byte("wJalrXUtnFEMI-very-secret")
	assert.False(t, bytes.Contains(base.Identity(), secret))
	assert.NotContains(t, base.Name(), "secret")
}

func TestSize(t *testing.T) {
	c := mustNew(t, baseConfig()) // idempotency attribute "idempotency-key"
	tests := []struct {
		name string
		m    codec.Message
		want int
	}{
		{"body", codec.Message{Body: []byte("hello")}, 5},
		{"multibyte body", codec.Message{Body: []byte("héllo")}, 6},
		{"attribute", codec.Message{Body: []byte("hello"), Attributes: map[string]string{"k": "vv"}}, 5 + 1 + 6 + 2},
		{"idempotency key", codec.Message{Body: []byte("hello"), IdempotencyKey: "abc"}, 5 + len("idempotency-key") + 6 + 3},
		{"group is free", codec.Message{Body: []byte("hello"), Group: "g"}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, c.Size(tt.m)) })
	}
}

func TestValidate(t *testing.T) {
	std := mustNew(t, baseConfig())
	fifoCfg := baseConfig()
	fifoCfg.QueueURL = testQueue + ".fifo"
	fifo := mustNew(t, fifoCfg)
	fifoCfg.ContentBasedDeduplication = true
	cbd := mustNew(t, fifoCfg)

	ok := codec.Message{Body: []byte("ok"), Group: "g-1", IdempotencyKey: "k-1", Attributes: map[string]string{"a": "b"}}
	with := func(f func(*codec.Message)) codec.Message {
		m := ok
		m.Attributes = map[string]string{"a": "b"}
		f(&m)
		return m
	}
	tenAttrs := map[string]string{}
	for i := range 10 {
		tenAttrs[string(rune('a'+i))] = "v"
	}
	tests := []struct {
		name string
		c    *sqs.Codec
		m    codec.Message
		code string // "" valid; "TooLarge" for ErrTooLarge
	}{
		{"valid standard", std, ok, ""},
		{"valid fifo", fifo, ok, ""},
		{"standard without group or key", std, codec.Message{Body: []byte("x")}, ""},
		{"all allowed characters", std, with(func(m *codec.Message) { m.Body = []byte("\t\n\r \uD7FF\uE000\uFFFD\U00010000\U0010FFFF") }), ""},
		{"empty body", std, with(func(m *codec.Message) { m.Body = nil }), sqs.CodeEmptyBody},
		{"NUL", std, with(func(m *codec.Message) { m.Body = []byte("a\x00b") }), sqs.CodeInvalidMessageContent},
		{"control character", std, with(func(m *codec.Message) { m.Body = []byte("\x1f") }), sqs.CodeInvalidMessageContent},
		{"U+FFFE", std, with(func(m *codec.Message) { m.Body = []byte("\uFFFE") }), sqs.CodeInvalidMessageContent},
		{"invalid UTF-8", std, with(func(m *codec.Message) { m.Body = []byte{'a', 0xff, 'b'} }), sqs.CodeInvalidMessageContent},
		{"encoded surrogate", std, with(func(m *codec.Message) { m.Body = []byte{0xed, 0xa0, 0x80} }), sqs.CodeInvalidMessageContent},
		{"ten attributes and a key", std, with(func(m *codec.Message) { m.Attributes = tenAttrs }), sqs.CodeTooManyAttributes},
		{"ten attributes, no key", std, with(func(m *codec.Message) { m.Attributes = tenAttrs; m.IdempotencyKey = "" }), ""},
		{"attribute name with space", std, with(func(m *codec.Message) { m.Attributes["a b"] = "v" }), sqs.CodeInvalidAttributeName},
		{"reserved attribute prefix", std, with(func(m *codec.Message) { m.Attributes["amazon.x"] = "v" }), sqs.CodeInvalidAttributeName},
		{"doubled period", std, with(func(m *codec.Message) { m.Attributes["a..b"] = "v" }), sqs.CodeInvalidAttributeName},
		{"attribute named like the key", std, with(func(m *codec.Message) { m.Attributes["idempotency-key"] = "v" }), sqs.CodeInvalidAttributeName},
		{"empty attribute value", std, with(func(m *codec.Message) { m.Attributes["a"] = "" }), sqs.CodeInvalidAttributeValue},
		{"bad attribute value", std, with(func(m *codec.Message) { m.Attributes["a"] = "\x01" }), sqs.CodeInvalidAttributeValue},
		{"fifo without group", fifo, with(func(m *codec.Message) { m.Group = "" }), sqs.CodeMissingGroup},
		{"fifo without key", fifo, with(func(m *codec.Message) { m.IdempotencyKey = "" }), sqs.CodeMissingDeduplication},
		{"cbd fifo without key", cbd, with(func(m *codec.Message) { m.IdempotencyKey = "" }), ""},
		{"group with space", std, with(func(m *codec.Message) { m.Group = "a b" }), sqs.CodeInvalidGroup},
		{"group too long", fifo, with(func(m *codec.Message) { m.Group = strings.Repeat("g", 129) }), sqs.CodeInvalidGroup},
		{"fifo key too long", fifo, with(func(m *codec.Message) { m.IdempotencyKey = strings.Repeat("k", 129) }), sqs.CodeInvalidDeduplication},
		{"standard long key is an attribute", std, with(func(m *codec.Message) { m.IdempotencyKey = strings.Repeat("k", 129) }), ""},
		{"exactly 1 MiB", std, codec.Message{Body: bytes.Repeat([]byte("x"), sqs.MaxBytes)}, ""},
		{"1 MiB and an attribute", std, codec.Message{Body: bytes.Repeat([]byte("x"), sqs.MaxBytes), Attributes: map[string]string{"a": "b"}}, "TooLarge"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Validate(tt.m)
			if tt.code == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, codec.IsPermanent(err), "%v", err)
			assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch"), err.Error())
			if tt.code == "TooLarge" {
				assert.ErrorIs(t, err, codec.ErrTooLarge)
				return
			}
			var ee *codec.EntryError
			require.True(t, errors.As(err, &ee), "%T", err)
			assert.Equal(t, tt.code, ee.Code)
			assert.True(t, ee.Permanent)
			assert.NotEmpty(t, ee.Message)
		})
	}
}

// TestAttributesMD5OnFauxqs checks the codec's MD5OfMessageAttributes
// against what fauxqs computes for the same attributes, through the plain
// SDK.
func TestAttributesMD5OnFauxqs(t *testing.T) {
	e := newFauxqs(t)
	q := e.createQueue(t, false, false)
	attrs := map[string]types.MessageAttributeValue{
		"zeta":  {DataType: aws.String("String"), StringValue: aws.String("last ✓")},
		"alpha": {DataType: aws.String("String"), StringValue: aws.String("first")},
		"num":   {DataType: aws.String("Number"), StringValue: aws.String("42")},
	}
	out, err := e.admin.SendMessageBatch(ctx(t), &awssqs.SendMessageBatchInput{
		QueueUrl: aws.String(q),
		Entries:  []types.SendMessageBatchRequestEntry{{Id: aws.String("a"), MessageBody: aws.String("b"), MessageAttributes: attrs}},
	})
	require.NoError(t, err)
	require.Len(t, out.Successful, 1)
	require.NotEmpty(t, aws.ToString(out.Successful[0].MD5OfMessageAttributes), "fauxqs returns MD5OfMessageAttributes")
	assert.Equal(t, aws.ToString(out.Successful[0].MD5OfMessageAttributes), sqs.AttributesMD5(attrs))
}

func TestIdentityCredentialsAndClients(t *testing.T) {
	base := mustNew(t, baseConfig())

	// A cache around static credentials (what config.LoadDefaultConfig
	// builds) is identified by the credentials' values.
	cached := baseConfig()
	cached.AWS.Credentials = aws.NewCredentialsCache(cached.AWS.Credentials)
	assert.Equal(t, base.Identity(), mustNew(t, cached).Identity())
	otherSecret := baseConfig()
	otherSecret.AWS.Credentials = aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "another", ""))
	assert.NotEqual(t, base.Identity(), mustNew(t, otherSecret).Identity())

	// A func cannot be told apart from another closure of its literal:
	// every codec built with one gets an identity of its own, even from
	// the same func value.
	fn := aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) { return aws.Credentials{}, nil })
	dyn := baseConfig()
	dyn.AWS.Credentials = fn
	dynID := mustNew(t, dyn).Identity()
	assert.NotEqual(t, dynID, mustNew(t, dyn).Identity())
	assert.NotEqual(t, base.Identity(), dynID)

	// A provider behind a pointer is the same provider at the same
	// address (the codec keeps it alive), another one elsewhere.
	ptr := baseConfig()
	ptr.AWS.Credentials = &tenantProvider{key: "AKID1"}
	assert.Equal(t, mustNew(t, ptr).Identity(), mustNew(t, ptr).Identity())
	ptr2 := baseConfig()
	ptr2.AWS.Credentials = &tenantProvider{key: "AKID1"}
	assert.NotEqual(t, mustNew(t, ptr).Identity(), mustNew(t, ptr2).Identity())

	// A provider held by value is compared by value.
	val := baseConfig()
	val.AWS.Credentials = tenantProvider{key: "AKID1"}
	assert.Equal(t, mustNew(t, val).Identity(), mustNew(t, val).Identity())
	val2 := baseConfig()
	val2.AWS.Credentials = tenantProvider{key: "AKID2"}
	assert.NotEqual(t, mustNew(t, val).Identity(), mustNew(t, val2).Identity())

	// A ready client: the same client, the same identity; another client
	// (with its own HTTP client and retryer), another identity.
	client := awssqs.NewFromConfig(baseConfig().AWS)
	a := mustNew(t, sqs.Config{QueueURL: testQueue, Client: client})
	b := mustNew(t, sqs.Config{QueueURL: testQueue, Client: client})
	assert.Equal(t, a.Identity(), b.Identity())
	other := mustNew(t, sqs.Config{QueueURL: testQueue, Client: awssqs.NewFromConfig(baseConfig().AWS)})
	assert.NotEqual(t, a.Identity(), other.Identity())
}

// tenantProvider is a credentials provider of a type the codec does not
// know.
type tenantProvider struct{ key string }

func (p tenantProvider) Retrieve(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: p.key, SecretAccessKey: "secret-" + p.key}, nil
}

// TestIdentityOpaqueParts: each part of an aws.Config the codec cannot
// compare makes two codecs built from equal configs differ, where equal
// configs without it share an identity.
func TestIdentityOpaqueParts(t *testing.T) {
	base := baseConfig()
	require.Equal(t, mustNew(t, base).Identity(), mustNew(t, base).Identity())
	opaque := map[string]func(*aws.Config){
		"credentials closure": func(a *aws.Config) { a.Credentials = tenantCredentials("AKID1") },
		"retryer":             func(a *aws.Config) { a.Retryer = func() aws.Retryer { return aws.NopRetryer{} } },
		"api options": func(a *aws.Config) {
			a.APIOptions = []func(*middleware.Stack) error{func(*middleware.Stack) error { return nil }}
		},
		"service options": func(a *aws.Config) { a.ServiceOptions = []func(string, any){func(string, any) {}} },
		"deprecated endpoint resolver": func(a *aws.Config) {
			a.EndpointResolver = aws.EndpointResolverFunc(func(string, string) (aws.Endpoint, error) { return aws.Endpoint{}, nil })
		},
		"endpoint resolver with options": func(a *aws.Config) {
			a.EndpointResolverWithOptions = aws.EndpointResolverWithOptionsFunc(func(string, string, ...any) (aws.Endpoint, error) {
				return aws.Endpoint{}, nil
			})
		},
		"interceptor": func(a *aws.Config) {
			a.Interceptors.AddBeforeSigning(beforeSigning(func(context.Context, *smithyhttp.InterceptorContext) error { return nil }))
		},
	}
	for name, edit := range opaque {
		t.Run(name, func(t *testing.T) {
			cfg := baseConfig()
			edit(&cfg.AWS)
			a, b := mustNew(t, cfg), mustNew(t, cfg)
			assert.NotEqual(t, a.Identity(), b.Identity())
			assert.Equal(t, a.Identity(), a.Identity(), "stable per codec value")
		})
	}
	// Data the SDK reads enters by value.
	for name, edit := range map[string]func(*aws.Config){
		"app id":               func(a *aws.Config) { a.AppID = "other" },
		"defaults mode":        func(a *aws.Config) { a.DefaultsMode = aws.DefaultsModeStandard },
		"compression":          func(a *aws.Config) { a.DisableRequestCompression = true },
		"clock skew":           func(a *aws.Config) { a.DisableClockSkewCorrection = true },
		"auth preference":      func(a *aws.Config) { a.AuthSchemePreference = []string{"sigv4a"} },
		"checksum calculation": func(a *aws.Config) { a.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired },
	} {
		cfg := baseConfig()
		edit(&cfg.AWS)
		a, b := mustNew(t, cfg), mustNew(t, cfg)
		assert.Equal(t, a.Identity(), b.Identity(), name)
		assert.NotEqual(t, mustNew(t, base).Identity(), a.Identity(), name)
	}
}

// beforeSigning adapts a func to an interceptor.
type beforeSigning func(context.Context, *smithyhttp.InterceptorContext) error

func (f beforeSigning) BeforeSigning(ctx context.Context, in *smithyhttp.InterceptorContext) error {
	return f(ctx, in)
}

// tenantCredentials is a per-tenant factory: one closure literal, a key per
// call.
func tenantCredentials(key string) aws.CredentialsProvider {
	return aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{AccessKeyID: key, SecretAccessKey: "secret-" + key, Source: "tenant"}, nil
	})
}

// TestIdentityLoadDefaultConfig: codecs built from one config that
// config.LoadDefaultConfig loaded (static keys from the environment, the
// SDK's default HTTP client) share an Identity; other keys do not. (A second
// load makes another HTTP client, and so another Identity.)
func TestIdentityLoadDefaultConfig(t *testing.T) {
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
	t.Setenv("AWS_REGION", "eu-west-1")
	load := func() aws.Config {
		cfg, err := config.LoadDefaultConfig(context.Background())
		require.NoError(t, err)
		return cfg
	}
	loaded := load()
	a := mustNew(t, sqs.Config{QueueURL: testQueue, AWS: loaded})
	b := mustNew(t, sqs.Config{QueueURL: testQueue, AWS: loaded})
	assert.Equal(t, a.Identity(), b.Identity(), "one loaded config")

	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDOTHER")
	other := loaded
	other.Credentials = load().Credentials
	assert.NotEqual(t, a.Identity(), mustNew(t, sqs.Config{QueueURL: testQueue, AWS: other}).Identity(), "other keys")
}

func TestDescribeNamesTheQueue(t *testing.T) {
	var c codec.Describer = mustNew(t, baseConfig())
	system, dest := c.Describe()
	assert.Equal(t, "aws_sqs", system)
	assert.Equal(t, testQueue[strings.LastIndexByte(testQueue, '/')+1:], dest)
	assert.NotContains(t, dest, "/")
}
