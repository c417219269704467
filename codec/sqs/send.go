package sqs

import (
	"context"
	"crypto/md5" //nolint:gosec // SQS's checksums are MD5
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"unsafe"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/ankusa/sinkbatch/codec"
)

// Codes of the retryable *codec.EntryError SendBatch answers when SQS's
// answer for an entry cannot be trusted.
const (
	// CodeChecksumMismatch: SQS's MD5 of the body or attributes differs
	// from the codec's; what SQS stored may differ from what was sent.
	CodeChecksumMismatch = "ChecksumMismatch"
	// CodeMissingResult: SQS's answer named the entry neither among the
	// successful nor among the failed ones, or gave it no message id.
	CodeMissingResult = "MissingResult"
	// CodeConflictingResult: SQS's answer listed the entry both as
	// successful and as failed. It may be stored; a retry with the same
	// IdempotencyKey is safe (a FIFO queue drops it as a duplicate; on a
	// standard queue consumers deduplicate by the key).
	CodeConflictingResult = "ConflictingResult"
	// CodeMissingChecksum: SQS answered success without MD5OfMessageBody,
	// or without MD5OfMessageAttributes when attributes were sent (see
	// Config.AttributeChecksumsOptional), so what it stored cannot be
	// checked.
	CodeMissingChecksum = "MissingChecksum"
)

// Whole-request error codes SQS answers for a request's content: the batcher
// bisects the batch to find the message. Both the JSON code and the
// AWS-query compatible one the SDK may report are listed.
var refusedCodes = map[string]bool{
	"BatchRequestTooLong":                                 true,
	"AWS.SimpleQueueService.BatchRequestTooLong":          true,
	"TooManyEntriesInBatchRequest":                        true,
	"AWS.SimpleQueueService.TooManyEntriesInBatchRequest": true,
	"InvalidMessageContents":                              true,
	"InvalidParameterValue":                               true,
	"InvalidAttributeName":                                true,
	"InvalidAttributeValue":                               true,
	"MissingParameter":                                    true,
}

// permanentCodes are the error codes no resend can cure: the queue, the
// credentials, the permissions or the queue's KMS key are wrong. SQS reports
// a KMS fault by its own code (KmsAccessDenied) or, where the SDK reads the
// AWS-query compatible code, by KMS's (KMS.AccessDeniedException); both are
// listed. Only these, and a content code of refusedCodes for a single entry,
// are permanent: a code or status the codec does not know is retryable, so
// that a proxy's answer or a code SQS adds later never parks a message for
// good.
var permanentCodes = map[string]bool{
	"QueueDoesNotExist":                           true,
	"AWS.SimpleQueueService.NonExistentQueue":     true,
	"AccessDenied":                                true,
	"AccessDeniedException":                       true,
	"InvalidClientTokenId":                        true,
	"UnrecognizedClientException":                 true,
	"SignatureDoesNotMatch":                       true,
	"IncompleteSignature":                         true,
	"MissingAuthenticationToken":                  true,
	"InvalidSecurity":                             true,
	"InvalidAddress":                              true,
	"UnsupportedOperation":                        true,
	"AWS.SimpleQueueService.UnsupportedOperation": true,
	"OptInRequired":                               true,
	"KmsAccessDenied":                             true,
	"KMS.AccessDeniedException":                   true,
	"KmsDisabled":                                 true,
	"KMS.DisabledException":                       true,
	"KmsNotFound":                                 true,
	"KMS.NotFoundException":                       true,
	"KmsInvalidState":                             true,
	"KMS.InvalidStateException":                   true,
	"KmsInvalidKeyUsage":                          true,
	"KMS.InvalidKeyUsageException":                true,
	"KmsOptInRequired":                            true,
	"KMS.OptInRequired":                           true,
}

// throttleCodes are the codes by which SQS, KMS behind it, or a gateway in
// front asks the sender to slow down. A failure with one (or an HTTP 429)
// wraps codec.ErrThrottled: retryable, and an adaptive destination lowers its
// in-flight limit on it.
var throttleCodes = map[string]bool{
	"Throttling":                true,
	"ThrottlingException":       true,
	"ThrottledException":        true,
	"RequestThrottled":          true,
	"RequestThrottledException": true,
	"TooManyRequestsException":  true,
	"RequestLimitExceeded":      true,
	"SlowDown":                  true,
	"KmsThrottled":              true,
	"KMS.ThrottlingException":   true,
}

// sent is what SendBatch remembers of an entry to check SQS's answer.
type sent struct {
	waiting  bool                                   // sent, and SQS's answer has not named it yet
	id       string                                 // the entry's Id
	body     []byte                                 // the message's Body, which stays unchanged until the request ends
	attrs    map[string]types.MessageAttributeValue // message attributes
	sysAttrs map[string]types.MessageAttributeValue // system attributes
}

// SendBatch sends batch as one SendMessageBatch request and maps SQS's
// answer back to it by entry Id. A message Validate refuses is answered with
// that error and not sent. SendBatch sends what it is given: keeping a
// request within Limits is the batcher's job, and SQS's refusal of a request
// past them comes back wrapping codec.ErrRefused.
func (c *Codec) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	return c.send(ctx, batch, c.Validate)
}

// send is SendBatch with the validation as a parameter, so that a test can
// put a message SQS refuses on the wire.
func (c *Codec) send(ctx context.Context, batch []codec.Message, validate func(codec.Message) error) ([]codec.Result, error) {
	results := make([]codec.Result, len(batch))
	entries := make([]types.SendMessageBatchRequestEntry, 0, len(batch))
	// pending is indexed like batch. strs holds each entry's Id and body, so
	// that the request's pointers to them cost one allocation, not two per
	// entry; the request lives no longer than this call.
	pending := make([]sent, len(batch))
	strs := make([]string, 2*len(batch))
	for i, m := range batch {
		if err := validate(m); err != nil {
			results[i].Err = err
			continue
		}
		// Ids only need to be distinct within the request; the index also
		// maps the answer back.
		id, body := &strs[2*i], &strs[2*i+1]
		*id, *body = strconv.Itoa(i), bodyString(m.Body)
		e, s := c.entry(id, body, m)
		entries = append(entries, e)
		pending[i] = s
	}
	if len(entries) == 0 {
		return results, nil
	}

	out, err := c.client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{
		QueueUrl: aws.String(c.queueURL),
		Entries:  entries,
	}, func(o *awssqs.Options) {
		// The SDK fails the whole call, output and all, on one entry's
		// MD5 mismatch; check per entry below instead.
		o.DisableMessageChecksumValidation = true
		if o.HTTPClient != nil {
			o.HTTPClient = readOnlyBodies{o.HTTPClient}
		}
	})
	if err != nil {
		return nil, c.classify(err)
	}

	// An entry SQS lists as failed is never answered as a success, even if
	// it is listed as successful too: see CodeConflictingResult.
	failed := make(map[string]bool, len(out.Failed))
	for _, f := range out.Failed {
		failed[aws.ToString(f.Id)] = true
	}
	for _, s := range out.Successful {
		id := aws.ToString(s.Id)
		i, ok := waiting(pending, id)
		if !ok {
			continue
		}
		pending[i].waiting = false
		if failed[id] {
			results[i].Err = &codec.EntryError{
				Code:    CodeConflictingResult,
				Message: "SQS listed this entry both as successful and as failed; it may be stored",
			}
			continue
		}
		results[i] = c.success(pending[i], s)
	}
	for _, f := range out.Failed {
		i, ok := waiting(pending, aws.ToString(f.Id))
		if !ok {
			continue
		}
		pending[i].waiting = false
		results[i].Err = entryError(aws.ToString(f.Code), aws.ToString(f.Message))
	}
	for i, p := range pending {
		if p.waiting {
			results[i].Err = &codec.EntryError{
				Code:    CodeMissingResult,
				Message: "SQS answered neither success nor failure for this entry",
			}
		}
	}
	return results, nil
}

// waiting finds the entry an answer names by its Id: the index of a sent
// entry whose answer has not come yet. An Id the request did not hold, or
// one already answered, is not found.
func waiting(pending []sent, id string) (int, bool) {
	i, err := strconv.Atoi(id)
	if err != nil || i < 0 || i >= len(pending) || !pending[i].waiting || pending[i].id != id {
		return 0, false
	}
	return i, true
}

// entry maps m onto a request entry with the given Id and body (m.Body as
// a string).
func (c *Codec) entry(id, body *string, m codec.Message) (types.SendMessageBatchRequestEntry, sent) {
	e := types.SendMessageBatchRequestEntry{Id: id, MessageBody: body}
	tr := c.carried(m)
	if n := len(m.Attributes) + tr.count(); n > 0 || m.IdempotencyKey != "" {
		e.MessageAttributes = make(map[string]types.MessageAttributeValue, n+1)
		for k, v := range m.Attributes {
			e.MessageAttributes[k] = stringValue(v)
		}
		if m.IdempotencyKey != "" {
			e.MessageAttributes[c.idemAttr] = stringValue(m.IdempotencyKey)
		}
	}
	sysAttrs := c.traceEntry(m, tr, &e)
	if m.Group != "" {
		e.MessageGroupId = aws.String(m.Group)
	}
	if c.fifo && m.IdempotencyKey != "" {
		e.MessageDeduplicationId = aws.String(m.IdempotencyKey)
	}
	return e, sent{waiting: true, id: *id, body: m.Body, attrs: e.MessageAttributes, sysAttrs: sysAttrs}
}

// bodyString is b as a string, without copying it: the request only reads
// it, keeps it no longer than this call, and a message's Body stays
// unchanged until its request has ended (actors.Instance.Deliver's
// contract), so the string never changes while it is seen.
func bodyString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// success checks a successful entry's checksums and makes its Result. Every
// checksum for what was sent must be there and match: an answer without one
// is as untrustworthy as a wrong one.
func (c *Codec) success(p sent, s types.SendMessageBatchResultEntry) codec.Result {
	mismatch := func(code, format string, args ...any) codec.Result {
		return codec.Result{Err: &codec.EntryError{Code: code, Message: fmt.Sprintf(format, args...)}}
	}
	sum := md5.Sum(p.body) //nolint:gosec // SQS's checksums are MD5
	switch got := aws.ToString(s.MD5OfMessageBody); {
	case got == "":
		return mismatch(CodeMissingChecksum, "SQS answered success without MD5OfMessageBody (want %x)", sum)
	case !isMD5(got, sum):
		return mismatch(CodeChecksumMismatch, "MD5OfMessageBody is %s, want %x", got, sum)
	}
	if len(p.attrs) > 0 {
		want := attributesMD5(p.attrs)
		switch got := aws.ToString(s.MD5OfMessageAttributes); {
		case got == "" && !c.attrChecksumsOptional:
			return mismatch(CodeMissingChecksum, "SQS answered success without MD5OfMessageAttributes (want %s)", want)
		case got != "" && got != want:
			return mismatch(CodeChecksumMismatch, "MD5OfMessageAttributes is %s, want %s", got, want)
		}
	}
	// The AWSTraceHeader is checked when SQS sends its checksum but not
	// required: it is not the message's content, and a trace context must
	// never cost a message its delivery.
	if got := aws.ToString(s.MD5OfMessageSystemAttributes); got != "" && len(p.sysAttrs) > 0 {
		if want := attributesMD5(p.sysAttrs); got != want {
			return mismatch(CodeChecksumMismatch, "MD5OfMessageSystemAttributes is %s, want %s", got, want)
		}
	}
	if aws.ToString(s.MessageId) == "" {
		return codec.Result{Err: &codec.EntryError{Code: CodeMissingResult, Message: "SQS answered success without a message id"}}
	}
	return codec.Result{ID: aws.ToString(s.MessageId), Sequence: aws.ToString(s.SequenceNumber)}
}

// isMD5 reports whether s is sum in lower-case hex, as SQS writes its
// checksums, without allocating.
func isMD5(s string, sum [md5.Size]byte) bool {
	var buf [2 * md5.Size]byte
	hex.Encode(buf[:], sum[:])
	return s == string(buf[:])
}

// attributesMD5 is SQS's MD5OfMessageAttributes: over the attributes sorted
// by name, each as its name, data type, a transport byte (1 for String and
// Number, 2 for Binary) and value, every string prefixed with its length as
// a 4-byte big-endian integer.
func attributesMD5(attrs map[string]types.MessageAttributeValue) string {
	names := make([]string, 0, len(attrs))
	for k := range attrs {
		names = append(names, k)
	}
	sort.Strings(names)
	h := md5.New() //nolint:gosec // SQS's checksums are MD5
	var n [4]byte
	put := func(b []byte) {
		binary.BigEndian.PutUint32(n[:], uint32(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	for _, k := range names {
		v := attrs[k]
		put([]byte(k))
		put([]byte(aws.ToString(v.DataType)))
		if v.BinaryValue != nil {
			h.Write([]byte{2})
			put(v.BinaryValue)
		} else {
			h.Write([]byte{1})
			put([]byte(aws.ToString(v.StringValue)))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// entryError is SQS's failure of one entry: permanent only for a content
// code (the message itself is at fault) or a permanent code, throttled for a
// throttling code, retryable otherwise. SenderFault is not read: SQS sets it
// for throttling too.
func entryError(code, msg string) *codec.EntryError {
	return &codec.EntryError{
		Code:      code,
		Message:   msg,
		Permanent: refusedCodes[code] || permanentCodes[code],
		Throttled: throttleCodes[code],
	}
}

// classify turns the error of a whole SendMessageBatch call (after the SDK's
// own retries) into the codec's answer: a refusal of the request's content
// (wrapping codec.ErrRefused), a permanent failure for every message (an
// *codec.EntryError with Permanent), throttling (wrapping codec.ErrThrottled
// and the SDK's error), or a retryable failure wrapping the SDK's error
// (anything else: 5xx, network faults, codes and statuses the codec does not
// know).
func (c *Codec) classify(err error) error {
	// A verdict from SQS outranks a context that ended since: only an error
	// that is the context's own is answered as such.
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("sinkbatch/sqs: SendMessageBatch to %s: %w", c.queueName, err)
	}
	var (
		apiErr       smithy.APIError
		re           *awshttp.ResponseError
		tooLong      *types.BatchRequestTooLong
		tooMany      *types.TooManyEntriesInBatchRequest
		notExist     *types.QueueDoesNotExist
		throttled    *types.RequestThrottled
		kmsThrottled *types.KmsThrottled
	)
	code, msg, status := "", "", 0
	if errors.As(err, &apiErr) {
		code, msg = apiErr.ErrorCode(), apiErr.ErrorMessage()
	}
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	switch {
	case errors.As(err, &tooLong) || errors.As(err, &tooMany) || refusedCodes[code]:
		return fmt.Errorf("sinkbatch/sqs: SendMessageBatch to %s: %s: %s: %w", c.queueName, code, msg, codec.ErrRefused)
	case errors.As(err, &notExist) || permanentCodes[code] || permanentType(err):
		return c.permanent(code, msg)
	case errors.As(err, &throttled) || errors.As(err, &kmsThrottled) || throttleCodes[code] || status == http.StatusTooManyRequests:
		return fmt.Errorf("sinkbatch/sqs: SendMessageBatch to %s: %w: %w", c.queueName, codec.ErrThrottled, err)
	}
	return fmt.Errorf("sinkbatch/sqs: SendMessageBatch to %s: %w", c.queueName, err)
}

// permanentType reports whether err is one of the SDK's errors for a
// permanent code: it names the error by its shape, whichever spelling of the
// code SQS sent (its own, or the query-compatible one of its
// X-Amzn-Query-Error header, which the SDK reports as the code).
func permanentType(err error) bool {
	var (
		kmsAccessDenied *types.KmsAccessDenied
		kmsDisabled     *types.KmsDisabled
		kmsKeyUsage     *types.KmsInvalidKeyUsage
		kmsState        *types.KmsInvalidState
		kmsNotFound     *types.KmsNotFound
		kmsOptIn        *types.KmsOptInRequired
		unsupported     *types.UnsupportedOperation
		address         *types.InvalidAddress
		security        *types.InvalidSecurity
	)
	return errors.As(err, &kmsAccessDenied) || errors.As(err, &kmsDisabled) || errors.As(err, &kmsKeyUsage) ||
		errors.As(err, &kmsState) || errors.As(err, &kmsNotFound) || errors.As(err, &kmsOptIn) ||
		errors.As(err, &unsupported) || errors.As(err, &address) || errors.As(err, &security)
}

func (c *Codec) permanent(code, msg string) error {
	return fmt.Errorf("sinkbatch/sqs: SendMessageBatch to %s: %w", c.queueName, &codec.EntryError{Code: code, Message: msg, Permanent: true})
}
