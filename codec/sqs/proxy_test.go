package sqs_test

// Fault injection: sqstest's proxy between the codec and kumo answers, for
// SendMessageBatch calls, with 500s, throttling, delays, reset connections
// or a doctored answer, and each test asserts the codec's classification and
// that every acknowledged message is in the queue.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/internal/sqstest"
)

// faultEnv is kumo behind a proxy: the codec talks to the proxy, the admin
// client (queues, read back) to kumo.
type faultEnv struct {
	*env
	proxy *sqstest.Proxy
	queue string
	codec *sqs.Codec
}

func newFaultEnv(t *testing.T, fifo bool) *faultEnv {
	e := newKumo(t)
	p := sqstest.New(t, e.endpoint)
	q := e.createQueue(t, fifo, false)
	cfg := e.cfg
	cfg.BaseEndpoint = aws.String(p.URL)
	c, err := sqs.New(sqs.Config{QueueURL: q, AWS: cfg, IdempotencyAttribute: "idem", AttributeChecksumsOptional: true}) // kumo

	require.NoError(t, err)
	return &faultEnv{env: e, proxy: p, queue: q, codec: c}
}

// acknowledgedAreStored reads the queue back and checks that every message
// with a successful result is there, with its body.
func (f *faultEnv) acknowledgedAreStored(t *testing.T, batch []codec.Message, res []codec.Result) []message {
	t.Helper()
	acked := 0
	for _, r := range res {
		if r.Err == nil {
			acked++
		}
	}
	got := f.readBack(t, f.queue, acked)
	byID := map[string]message{}
	for _, g := range got {
		byID[g.ID] = g
	}
	for i, r := range res {
		if r.Err != nil {
			continue
		}
		g, ok := byID[r.ID]
		if assert.True(t, ok, "acknowledged message %d (%s) is missing", i, r.ID) {
			assert.Equal(t, string(batch[i].Body), string(g.Body))
		}
	}
	return got
}

// requireRetryable asserts the whole-request error the SDK gave up on is
// retryable: not permanent, not a refusal.
func requireRetryable(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	assert.False(t, codec.IsPermanent(err), "%v", err)
	assert.False(t, errors.Is(err, codec.ErrRefused), "%v", err)
	var ee *codec.EntryError
	assert.False(t, errors.As(err, &ee), "a retryable request error carries the SDK's error, not an EntryError")
	assert.Contains(t, err.Error(), "sinkbatch/sqs: ")
}

func TestFaultServerError(t *testing.T) {
	f := newFaultEnv(t, false)
	f.proxy.Set(sqstest.Always(sqstest.Error(http.StatusInternalServerError, "InternalError", "injected")))
	batch := batchOf(runName(t), 0, 3, 1)
	_, err := f.codec.SendBatch(ctx(t), batch)
	requireRetryable(t, err)
	var re *awshttp.ResponseError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, http.StatusInternalServerError, re.HTTPStatusCode())
	assert.EqualValues(t, 3, f.proxy.Calls(), "the SDK's standard retryer makes 3 attempts; the codec adds none")
	assert.Empty(t, f.drain(t, f.queue))
}

func TestFaultServerErrorThenSuccess(t *testing.T) {
	f := newFaultEnv(t, true)
	f.proxy.Set(sqstest.First(2, sqstest.Error(http.StatusServiceUnavailable, "ServiceUnavailable", "injected")))
	batch := batchOf(runName(t), 0, 10, 3)
	res, err := f.codec.SendBatch(ctx(t), batch)
	require.NoError(t, err, "the SDK's third attempt succeeds")
	for _, r := range res {
		require.NoError(t, r.Err)
	}
	assert.EqualValues(t, 3, f.proxy.Calls())
	assert.Len(t, f.acknowledgedAreStored(t, batch, res), 10)
}

func TestFaultThrottling(t *testing.T) {
	for _, code := range []string{"ThrottlingException", "RequestThrottled"} {
		t.Run(code, func(t *testing.T) {
			f := newFaultEnv(t, false)
			f.proxy.Set(sqstest.Always(sqstest.Error(http.StatusBadRequest, code, "Rate exceeded")))
			_, err := f.codec.SendBatch(ctx(t), batchOf(runName(t), 0, 2, 1))
			requireRetryable(t, err)
			var api smithy.APIError
			require.ErrorAs(t, err, &api)
			assert.Equal(t, code, api.ErrorCode())
			assert.EqualValues(t, 3, f.proxy.Calls(), "throttling is retried by the SDK")
		})
	}
}

func TestFaultLatencyPastDeadline(t *testing.T) {
	f := newFaultEnv(t, false)
	// Hold the call longer than the caller waits; the server never sees
	// it.
	f.proxy.Set(func(*sqstest.Call) sqstest.Action { return sqstest.Action{Before: 10 * time.Second} })
	c, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := f.codec.SendBatch(c, batchOf(runName(t), 0, 2, 1))
	elapsed := time.Since(start)
	requireRetryable(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, elapsed, 2*time.Second, "SendBatch returns when its context is done")
	assert.Empty(t, f.drain(t, f.queue))
}

func TestFaultConnectionReset(t *testing.T) {
	f := newFaultEnv(t, false)
	f.proxy.Set(sqstest.Always(sqstest.Reset))
	_, err := f.codec.SendBatch(ctx(t), batchOf(runName(t), 0, 2, 1))
	requireRetryable(t, err)
	var api smithy.APIError
	assert.False(t, errors.As(err, &api), "no answer from SQS: %v", err)
	assert.EqualValues(t, 3, f.proxy.Calls(), "the SDK retries a reset connection")
	assert.Empty(t, f.drain(t, f.queue))
}

func TestFaultConnectionResetThenSuccess(t *testing.T) {
	f := newFaultEnv(t, false)
	f.proxy.Set(sqstest.First(1, sqstest.Reset))
	batch := batchOf(runName(t), 0, 5, 1)
	res, err := f.codec.SendBatch(ctx(t), batch)
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err)
	}
	assert.EqualValues(t, 2, f.proxy.Calls(), "the SDK sends the reset call again")
	assert.Len(t, f.acknowledgedAreStored(t, batch, res), 5)
}

// onlyEntryFailed requires every result of res but the i-th to be a
// success and the i-th to be an EntryError, which it returns.
func onlyEntryFailed(t *testing.T, res []codec.Result, i int) *codec.EntryError {
	t.Helper()
	for j, r := range res {
		if j != i {
			require.NoError(t, r.Err, "entry %d", j)
		}
	}
	var ee *codec.EntryError
	require.ErrorAs(t, res[i].Err, &ee)
	return ee
}

// entryIndex is the batch position behind an answer entry's Id.
func entryIndex(e map[string]any) int {
	i, _ := strconv.Atoi(e["Id"].(string))
	return i
}

func TestFaultWrongBodyMD5OnOneEntry(t *testing.T) {
	f := newFaultEnv(t, false)
	f.proxy.Set(sqstest.Rewrite(func(a *sqstest.BatchAnswer) {
		for _, e := range a.Successful {
			if entryIndex(e) == 2 {
				e["MD5OfMessageBody"] = "00000000000000000000000000000000"
			}
		}
	}))
	batch := batchOf(runName(t), 0, 5, 1)
	res, err := f.codec.SendBatch(ctx(t), batch)
	require.NoError(t, err, "one entry's mismatch must not fail the request")
	ee := onlyEntryFailed(t, res, 2)
	assert.Equal(t, sqs.CodeChecksumMismatch, ee.Code)
	assert.False(t, codec.IsPermanent(res[2].Err))
	assert.Contains(t, ee.Message, "MD5OfMessageBody")
	// kumo stored all five; the four acknowledged are among them.
	assert.Len(t, f.acknowledgedAreStored(t, batch, res), 5)
}

func TestFaultWrongAttributesMD5OnOneEntry(t *testing.T) {
	f := newFaultEnv(t, false)
	batch := batchOf(runName(t), 0, 3, 1)
	f.proxy.Set(sqstest.Rewrite(func(a *sqstest.BatchAnswer) {
		// kumo returns no attribute MD5: add the right one to every
		// entry but the second, and a wrong one there.
		for _, e := range a.Successful {
			i := entryIndex(e)
			m := batch[i]
			attrs := map[string]types.MessageAttributeValue{
				"idem": {DataType: aws.String("String"), StringValue: aws.String(m.IdempotencyKey)},
			}
			for k, v := range m.Attributes {
				attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
			}
			e["MD5OfMessageAttributes"] = sqs.AttributesMD5(attrs)
			if i == 1 {
				e["MD5OfMessageAttributes"] = "0123456789abcdef0123456789abcdef"
			}
		}
	}))
	res, err := f.codec.SendBatch(ctx(t), batch)
	require.NoError(t, err)
	ee := onlyEntryFailed(t, res, 1)
	assert.Equal(t, sqs.CodeChecksumMismatch, ee.Code)
	assert.Contains(t, ee.Message, "MD5OfMessageAttributes")
	assert.False(t, codec.IsPermanent(res[1].Err))
	f.acknowledgedAreStored(t, batch, res)
}

func TestFaultAnswerReorderedAndIncomplete(t *testing.T) {
	f := newFaultEnv(t, false)
	f.proxy.Set(sqstest.Rewrite(func(a *sqstest.BatchAnswer) {
		var keep []map[string]any
		for _, e := range a.Successful {
			switch entryIndex(e) {
			case 1: // dropped from both lists
			case 3: // failed by the server's fault: retryable
				a.Failed = append(a.Failed, sqstest.Failure(e["Id"], "InternalError", "injected", false))
			case 4: // failed by the sender's fault: permanent
				a.Failed = append(a.Failed, sqstest.Failure(e["Id"], "InvalidParameterValue", "injected", true))
			default:
				keep = append(keep, e)
			}
		}
		for i, j := 0, len(keep)-1; i < j; i, j = i+1, j-1 {
			keep[i], keep[j] = keep[j], keep[i] // results map by Id, not position
		}
		a.Successful = keep
	}))
	batch := batchOf(runName(t), 0, 6, 1)
	res, err := f.codec.SendBatch(ctx(t), batch)
	require.NoError(t, err)
	var ee *codec.EntryError
	require.ErrorAs(t, res[1].Err, &ee)
	assert.Equal(t, sqs.CodeMissingResult, ee.Code)
	assert.False(t, codec.IsPermanent(res[1].Err))
	require.ErrorAs(t, res[3].Err, &ee)
	assert.Equal(t, "InternalError", ee.Code)
	assert.False(t, codec.IsPermanent(res[3].Err))
	require.ErrorAs(t, res[4].Err, &ee)
	assert.Equal(t, "InvalidParameterValue", ee.Code)
	assert.True(t, codec.IsPermanent(res[4].Err))
	for _, i := range []int{0, 2, 5} {
		require.NoError(t, res[i].Err)
	}
	// acknowledgedAreStored matches each acknowledged id to its body: a
	// position-based mapping of the reversed answer would fail here.
	f.acknowledgedAreStored(t, batch, res)
}

// TestFaultClassification: every whole-request answer SQS (or something in
// front of it) can give, and what the codec makes of it. Only the listed
// codes are permanent; throttling, by code or by HTTP 429, wraps
// codec.ErrThrottled; anything unknown is retryable.
func TestFaultClassification(t *testing.T) {
	const (
		refused = iota
		permanent
		throttled
		retryable
	)
	tests := []struct {
		name   string
		answer func(w http.ResponseWriter)
		code   string // in the error text; "" for none
		want   int
	}{
		{"BatchRequestTooLong", sqsError(400, "BatchRequestTooLong", ""), "BatchRequestTooLong", refused},
		{"TooManyEntriesInBatchRequest", sqsError(400, "TooManyEntriesInBatchRequest", ""), "TooManyEntriesInBatchRequest", refused},
		{"QueueDoesNotExist", sqsError(400, "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"), "AWS.SimpleQueueService.NonExistentQueue", permanent},
		{"AccessDenied", sqsError(403, "AccessDenied", ""), "AccessDenied", permanent},
		{"InvalidClientTokenId", sqsError(403, "InvalidClientTokenId", ""), "InvalidClientTokenId", permanent},
		{"SignatureDoesNotMatch", sqsError(403, "SignatureDoesNotMatch", ""), "SignatureDoesNotMatch", permanent},
		{"KmsAccessDenied as KMS reports it", sqsError(400, "KmsAccessDenied", "KMS.AccessDeniedException"), "KMS.AccessDeniedException", permanent},
		{"KmsDisabled", sqsError(400, "KmsDisabled", ""), "KmsDisabled", permanent},
		{"KmsThrottled as KMS reports it", sqsError(400, "KmsThrottled", "KMS.ThrottlingException"), "KMS.ThrottlingException", throttled},
		{"KmsThrottled", sqsError(400, "KmsThrottled", ""), "KmsThrottled", throttled},
		{"RequestThrottled", sqsError(403, "RequestThrottled", ""), "RequestThrottled", throttled},
		{"ThrottlingException", sqsError(400, "ThrottlingException", ""), "ThrottlingException", throttled},
		{"Throttling", sqsError(400, "Throttling", ""), "Throttling", throttled},
		{"unknown code 400", sqsError(400, "SomethingNew", ""), "SomethingNew", retryable},
		{"unknown code 403", sqsError(403, "SomethingElse", ""), "SomethingElse", retryable},
		{"InternalError 500", sqsError(500, "InternalError", ""), "InternalError", retryable},
		{"a proxy's plain 429", plain(http.StatusTooManyRequests), "429", throttled},
		{"a proxy's plain 403", plain(http.StatusForbidden), "403", retryable},
		{"a proxy's plain 502", plain(http.StatusBadGateway), "502", retryable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFaultEnv(t, false)
			f.proxy.Set(sqstest.Always(tt.answer))
			_, err := f.codec.SendBatch(ctx(t), batchOf(runName(t), 0, 2, 1))
			require.Error(t, err)
			assert.Equal(t, tt.want == refused, errors.Is(err, codec.ErrRefused), "refused: %v", err)
			if tt.want != refused { // IsPermanent holds for a refusal narrowed to one message
				assert.Equal(t, tt.want == permanent, codec.IsPermanent(err), "permanent: %v", err)
			}
			assert.Equal(t, tt.want == throttled, codec.IsThrottled(err), "throttled: %v", err)
			if tt.want == permanent {
				var ee *codec.EntryError
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, tt.code, ee.Code)
			}
			if tt.want == throttled || tt.want == retryable {
				var ee *codec.EntryError
				assert.False(t, errors.As(err, &ee), "a retryable request error carries the SDK's error, not an EntryError")
				var re *awshttp.ResponseError
				assert.ErrorAs(t, err, &re, "the SDK's error is kept")
			}
			assert.Contains(t, err.Error(), tt.code)
			assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch/sqs: "), err.Error())
			assert.NotContains(t, err.Error(), "secret-test")
		})
	}
}

// TestFaultEntryClassification: a failed entry is permanent only for a
// content or a permanent code, throttled for a throttling code, retryable
// otherwise, whatever SenderFault says.
func TestFaultEntryClassification(t *testing.T) {
	tests := []struct {
		code                 string
		senderFault          bool
		permanent, throttled bool
	}{
		{"InvalidMessageContents", true, true, false},
		{"InvalidParameterValue", true, true, false},
		{"KMS.DisabledException", true, true, false},
		{"KmsAccessDenied", true, true, false},
		{"KMS.ThrottlingException", true, false, true},
		{"KmsThrottled", false, false, true},
		{"RequestThrottled", true, false, true},
		{"SomethingNew", true, false, false},
		{"InternalError", false, false, false},
	}
	f := newFaultEnv(t, false)
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			f.proxy.Set(sqstest.Rewrite(func(a *sqstest.BatchAnswer) {
				e := a.Successful[0]
				a.Successful = a.Successful[1:]
				a.Failed = append(a.Failed, sqstest.Failure(e["Id"], tt.code, "injected", tt.senderFault))
			}))
			res, err := f.codec.SendBatch(ctx(t), batchOf(runName(t), 0, 2, 1))
			require.NoError(t, err)
			require.NoError(t, res[1].Err)
			var ee *codec.EntryError
			require.ErrorAs(t, res[0].Err, &ee)
			assert.Equal(t, tt.code, ee.Code)
			assert.Equal(t, tt.permanent, codec.IsPermanent(res[0].Err))
			assert.Equal(t, tt.throttled, codec.IsThrottled(res[0].Err))
		})
	}
}

// sqsError answers with SQS's JSON error shape: the shape's name in
// __type and, when queryCode is set, the AWS-query compatible code SQS also
// sends (the SDK reports that one).
func sqsError(status int, typ, queryCode string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		if queryCode != "" {
			w.Header().Set("X-Amzn-Query-Error", queryCode+";Sender")
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"__type":"com.amazonaws.sqs#%s","message":"injected"}`, typ)
	}
}

// plain answers as a proxy or gateway would: a status and a text body.
func plain(status int) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		fmt.Fprint(w, http.StatusText(status))
	}
}

// TestFaultAnswerLostAfterStore: SQS stores the batch, the answer is lost
// (the connection is reset), the SDK sends the request again. A FIFO queue
// drops the repeat by deduplication id and answers with the first ids: one
// copy of each message. A standard queue stores it twice (at least once);
// every acknowledged message is there, and the idempotency attribute lets a
// consumer drop the repeats.
func TestFaultAnswerLostAfterStore(t *testing.T) {
	for _, fifo := range []bool{true, false} {
		t.Run(map[bool]string{true: "FIFO", false: "Standard"}[fifo], func(t *testing.T) {
			f := newFaultEnv(t, fifo)
			f.proxy.Set(func(c *sqstest.Call) sqstest.Action {
				return sqstest.Action{ResetAfter: c.N == 1} // stored, answer lost
			})
			batch := batchOf(runName(t), 0, 5, 2)
			res, err := f.codec.SendBatch(ctx(t), batch)
			require.NoError(t, err, "the SDK's second attempt is answered")
			assert.EqualValues(t, 2, f.proxy.Calls())
			got := f.acknowledgedAreStored(t, batch, res)
			if fifo {
				assert.Len(t, got, len(batch), "deduplicated")
				return
			}
			assert.Len(t, got, 2*len(batch), "stored twice")
			keys := map[string]int{}
			for _, g := range got {
				keys[g.IdempotencyKey]++
			}
			for _, m := range batch {
				assert.Equal(t, 2, keys[m.IdempotencyKey], "both copies carry the key")
			}
		})
	}
}

// TestFaultSuccessAndFailure: an entry SQS lists both as successful and as
// failed is answered failed and retryable, whatever the failure's code: it
// may be stored, and a retry with the same key is safe.
func TestFaultSuccessAndFailure(t *testing.T) {
	for _, code := range []string{"InternalError", "InvalidParameterValue"} {
		t.Run(code, func(t *testing.T) {
			f := newFaultEnv(t, false)
			f.proxy.Set(sqstest.Rewrite(func(a *sqstest.BatchAnswer) {
				for _, e := range a.Successful {
					if entryIndex(e) == 1 {
						a.Failed = append(a.Failed, sqstest.Failure(e["Id"], code, "injected", true))
					}
				}
			}))
			batch := batchOf(runName(t), 0, 3, 1)
			res, err := f.codec.SendBatch(ctx(t), batch)
			require.NoError(t, err)
			ee := onlyEntryFailed(t, res, 1)
			assert.Equal(t, sqs.CodeConflictingResult, ee.Code)
			assert.False(t, codec.IsPermanent(res[1].Err))
			f.acknowledgedAreStored(t, batch, res)
		})
	}
}

// TestFaultMissingChecksums: a success without MD5OfMessageBody, or without
// MD5OfMessageAttributes for attributes that were sent, cannot be checked
// and is answered retryable.
func TestFaultMissingChecksums(t *testing.T) {
	t.Run("body", func(t *testing.T) {
		f := newFaultEnv(t, false)
		f.proxy.Set(sqstest.Rewrite(func(a *sqstest.BatchAnswer) {
			for _, e := range a.Successful {
				if entryIndex(e) == 2 {
					delete(e, "MD5OfMessageBody")
				}
			}
		}))
		batch := batchOf(runName(t), 0, 4, 1)
		res, err := f.codec.SendBatch(ctx(t), batch)
		require.NoError(t, err)
		ee := onlyEntryFailed(t, res, 2)
		assert.Equal(t, sqs.CodeMissingChecksum, ee.Code)
		assert.Contains(t, ee.Message, "MD5OfMessageBody")
		assert.False(t, codec.IsPermanent(res[2].Err))
		f.acknowledgedAreStored(t, batch, res)
	})
	t.Run("attributes", func(t *testing.T) {
		// kumo's own answer has no MD5OfMessageAttributes.
		e := newKumo(t)
		q := e.createQueue(t, false, false)
		strict := e.codec(t, q, codec.Tuning{}, func(c *sqs.Config) { c.AttributeChecksumsOptional = false })
		lenient := e.codec(t, q, codec.Tuning{})
		assert.NotEqual(t, strict.Identity(), lenient.Identity())
		batch := []codec.Message{
			{Body: []byte("with attributes"), Attributes: map[string]string{"a": "b"}},
			{Body: []byte("with a key"), IdempotencyKey: "k"},
			{Body: []byte("bare")},
		}
		res, err := strict.SendBatch(ctx(t), batch)
		require.NoError(t, err)
		for _, r := range res[:2] {
			var ee *codec.EntryError
			require.ErrorAs(t, r.Err, &ee)
			assert.Equal(t, sqs.CodeMissingChecksum, ee.Code)
			assert.Contains(t, ee.Message, "MD5OfMessageAttributes")
			assert.False(t, codec.IsPermanent(r.Err))
		}
		require.NoError(t, res[2].Err, "no attributes sent, none to check")
		res, err = lenient.SendBatch(ctx(t), batch)
		require.NoError(t, err)
		for _, r := range res {
			require.NoError(t, r.Err)
		}
	})
}
