package sqs_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

// Validate's attribute checks refuse each fault, and report the same fault
// first every time when a message holds several (they are checked in name order, whatever order
// the map iterates in): names SQS reserves in any case, periods, the
// idempotency attribute taken while a key is set (but free without one),
// empty and unprintable values; and the count, in which the idempotency
// key and the W3C trace attributes take a place and the AWSTraceHeader
// none.
func TestValidateRefusesEachAttributeFaultInNameOrder(t *testing.T) {
	cfg := baseConfig()
	cfg.IdempotencyAttribute = "idem"
	c := mustNew(t, cfg)
	cfg.TracePropagation = sqs.TraceW3CAttributes
	w3c := mustNew(t, cfg)
	good := func(n int, extra map[string]string) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprint("good", i)] = "v"
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	parent := sampledParent
	body := []byte("b")
	tests := []struct {
		name string
		c    *sqs.Codec
		m    codec.Message
		code string // "" valid
		text string // in the error, when refused
	}{
		{"AWS. prefix in lower case", c, codec.Message{Body: body, Attributes: good(3, map[string]string{"aws.x": "v"})}, sqs.CodeInvalidAttributeName, `"aws.x" starts with a prefix`},
		{"Amazon. prefix in mixed case", c, codec.Message{Body: body, Attributes: good(3, map[string]string{"AmAzOn.x": "v"})}, sqs.CodeInvalidAttributeName, `"AmAzOn.x" starts with a prefix`},
		{"AWS without a period is a name", c, codec.Message{Body: body, Attributes: good(3, map[string]string{"AWSTraceHeader": "v"})}, "", ""},
		{"doubled period", c, codec.Message{Body: body, Attributes: good(3, map[string]string{"a..b": "v"})}, sqs.CodeInvalidAttributeName, "doubled period"},
		{"trailing period", c, codec.Message{Body: body, Attributes: good(3, map[string]string{"a.": "v"})}, sqs.CodeInvalidAttributeName, "trailing"},
		{"the idempotency attribute with a key", c, codec.Message{Body: body, IdempotencyKey: "k", Attributes: map[string]string{"idem": "v"}}, sqs.CodeInvalidAttributeName, "reserved for the idempotency key"},
		{"the idempotency attribute without a key", c, codec.Message{Body: body, Attributes: map[string]string{"idem": "v"}}, "", ""},
		{"empty value", c, codec.Message{Body: body, Attributes: good(3, map[string]string{"e": ""})}, sqs.CodeInvalidAttributeValue, `attribute "e" is empty`},
		{"NUL in a value", c, codec.Message{Body: body, Attributes: good(3, map[string]string{"n": "a\x00"})}, sqs.CodeInvalidAttributeValue, `attribute "n" holds U+0000`},
		{"bad UTF-8 in a value", c, codec.Message{Body: body, Attributes: good(3, map[string]string{"u": "\xff"})}, sqs.CodeInvalidAttributeValue, `attribute "u" is not valid UTF-8`},
		{"several faults: the first by name", c, codec.Message{Body: body, Attributes: map[string]string{"b": "", "a": "\x01", "c..": "v", "AWS.d": "v"}}, sqs.CodeInvalidAttributeName, `"AWS.d"`},
		{"several value faults: the first by name", c, codec.Message{Body: body, Attributes: map[string]string{"zz": "", "aa": "\x01", "mm": "\xff"}}, sqs.CodeInvalidAttributeValue, `attribute "aa"`},
		{"non-nil empty map", c, codec.Message{Body: body, Attributes: map[string]string{}}, "", ""},
		{"10 attributes", c, codec.Message{Body: body, Attributes: good(10, nil)}, "", ""},
		{"10 attributes and a key", c, codec.Message{Body: body, Attributes: good(10, nil), IdempotencyKey: "k"}, sqs.CodeTooManyAttributes, "11 message attributes"},
		{"9 attributes, a key and the AWSTraceHeader", c, codec.Message{Body: body, Attributes: good(9, nil), IdempotencyKey: "k", Trace: codec.TraceContext{Parent: parent, State: "s=1"}}, "", ""},
		{"8 attributes, a key and W3C parent", w3c, codec.Message{Body: body, Attributes: good(8, nil), IdempotencyKey: "k", Trace: codec.TraceContext{Parent: parent}}, "", ""},
		{"8 attributes, a key and W3C parent and state", w3c, codec.Message{Body: body, Attributes: good(8, nil), IdempotencyKey: "k", Trace: codec.TraceContext{Parent: parent, State: "s=1"}}, sqs.CodeTooManyAttributes, "11 message attributes"},
		{"the caller's own traceparent counts once", w3c, codec.Message{Body: body, Attributes: good(9, map[string]string{"traceparent": parent}), Trace: codec.TraceContext{Parent: parent, State: "s=1"}}, "", ""},
		{"too many and a bad name: the count first", c, codec.Message{Body: body, Attributes: good(11, map[string]string{"AWS.x": "v"})}, sqs.CodeTooManyAttributes, "12 message attributes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var first string
			for range 30 { // map iteration order varies from call to call
				err := tt.c.Validate(tt.m)
				if tt.code == "" {
					require.NoError(t, err)
					continue
				}
				var ee *codec.EntryError
				require.ErrorAs(t, err, &ee)
				require.Equal(t, tt.code, ee.Code, "%v", err)
				require.True(t, codec.IsPermanent(err))
				require.Contains(t, err.Error(), tt.text)
				if first == "" {
					first = err.Error()
				}
				require.Equal(t, first, err.Error(), "the same fault first every time")
			}
		})
	}
}
