package sqs_test

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

// BenchmarkSendBatch sends 10-message requests to kumo through the codec
// and, as the baseline in the same run, as the bare SDK call the codec
// makes. The difference is the codec's cost: validation, mapping, MD5
// checks.
func BenchmarkSendBatch(b *testing.B) {
	for _, size := range []int{100, 10 << 10} {
		b.Run(fmt.Sprintf("body=%dB", size), func(b *testing.B) {
			e := newKumo(b)
			q := e.createQueue(b, false, false)
			batch := batchOf("bench", 0, sqs.MaxEntries, 1)
			for i := range batch {
				batch[i].Group = ""
				batch[i].Body = bytes.Repeat([]byte("x"), size)
			}
			b.Run("sdk", func(b *testing.B) {
				entries := make([]types.SendMessageBatchRequestEntry, len(batch))
				for i, m := range batch {
					entries[i] = types.SendMessageBatchRequestEntry{
						Id:          aws.String(strconv.Itoa(i)),
						MessageBody: aws.String(string(m.Body)),
						MessageAttributes: map[string]types.MessageAttributeValue{
							"n":    {DataType: aws.String("String"), StringValue: aws.String(m.Attributes["n"])},
							"idem": {DataType: aws.String("String"), StringValue: aws.String(m.IdempotencyKey)},
						},
					}
				}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := e.admin.SendMessageBatch(b.Context(), &awssqs.SendMessageBatchInput{QueueUrl: aws.String(q), Entries: entries}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("codec", func(b *testing.B) {
				c, err := sqs.New(sqs.Config{QueueURL: q, AWS: e.cfg, IdempotencyAttribute: "idem", AttributeChecksumsOptional: e.kind == "kumo"})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.SendBatch(b.Context(), batch); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkValidate measures the admission check, which scans every body.
func BenchmarkValidate(b *testing.B) {
	cfg := baseConfig()
	c, err := sqs.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		unit string
		size int
	}{{"ascii", "x", 1 << 10}, {"ascii", "x", 256 << 10}, {"utf8", "ü", 256 << 10}} {
		b.Run(fmt.Sprintf("%s/body=%dB", tc.name, tc.size), func(b *testing.B) {
			m := codec.Message{Body: bytes.Repeat([]byte(tc.unit), tc.size/len(tc.unit)), Attributes: map[string]string{"a": "b"}, IdempotencyKey: "k"}
			b.SetBytes(int64(tc.size))
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Validate(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
