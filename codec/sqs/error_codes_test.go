package sqs_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/sqstest"
)

// SQS speaks AWS JSON 1.0 with the awsQueryCompatible trait: with each
// error it sends the X-Amzn-Query-Error header, and aws-sdk-go-v2 reports
// that code (ErrorCodeOverride) instead of the shape's name. The codes
// come from the SQS model the SDK is generated from
// (service/sqs@v1.53.0/schemas/schemas.go, the awsQueryError traits):
// KmsInvalidState is sent as "KMS.InvalidStateException" and
// UnsupportedOperation as "AWS.SimpleQueueService.UnsupportedOperation".
//
// The package doc (Errors) promises a permanent *codec.EntryError for "a
// queue whose KMS key cannot be used (KmsAccessDenied, KmsDisabled,
// KmsNotFound, ... and their KMS.* forms)", and permanentCodes lists
// KmsInvalidState and UnsupportedOperation as codes no resend can cure:
// both the shape-name form and the form Amazon SQS sends are permanent, and
// the SDK's error types are matched too, whatever the code's spelling. (Neither kumo nor fauxqs returns these
// errors: the proxy answers as SQS does, the same way TestFaultClassification
// fakes KMS.AccessDeniedException.)
func TestQueryCompatibleCodesKeepTheirClass(t *testing.T) {
	tests := []struct {
		name       string
		typ, query string
	}{
		{"KmsInvalidState (shape name)", "KmsInvalidState", ""},
		{"KmsInvalidState as SQS sends it", "KmsInvalidState", "KMS.InvalidStateException"},
		{"UnsupportedOperation (shape name)", "UnsupportedOperation", ""},
		{"UnsupportedOperation as SQS sends it", "UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation"},
		// Controls that held before.
		{"KmsNotFound as SQS sends it", "KmsNotFound", "KMS.NotFoundException"},
		{"KmsInvalidKeyUsage as SQS sends it", "KmsInvalidKeyUsage", "KMS.InvalidKeyUsageException"},
	}
	f := newFaultEnv(t, false)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.proxy.Set(sqstest.Always(sqsError(400, tt.typ, tt.query)))
			_, err := f.codec.SendBatch(ctx(t), batchOf(runName(t), 0, 2, 1))
			require.Error(t, err)
			assert.False(t, errors.Is(err, codec.ErrRefused), "%v", err)
			assert.False(t, codec.IsThrottled(err), "%v", err)
			var ee *codec.EntryError
			assert.True(t, errors.As(err, &ee) && ee.Permanent && codec.IsPermanent(err),
				"a queue whose KMS key is unusable (or an unsupported operation) is permanent in every form SQS reports it; got: %v", err)
		})
	}
}

// The same code on a failed entry: entryError classifies an entry's code by
// the same tables, so KMS.InvalidStateException (SQS's form of
// KmsInvalidState, listed as permanent) came back retryable there too,
// while its siblings (KMS.DisabledException, TestFaultEntryClassification)
// are permanent.
func TestQueryCompatibleEntryCodeKeepsItsClass(t *testing.T) {
	f := newFaultEnv(t, false)
	for _, code := range []string{"KmsInvalidState", "KMS.InvalidStateException", "KMS.NotFoundException"} {
		t.Run(code, func(t *testing.T) {
			f.proxy.Set(sqstest.Rewrite(func(a *sqstest.BatchAnswer) {
				e := a.Successful[0]
				a.Successful = a.Successful[1:]
				a.Failed = append(a.Failed, sqstest.Failure(e["Id"], code, "injected", true))
			}))
			res, err := f.codec.SendBatch(ctx(t), batchOf(runName(t), 0, 2, 1))
			require.NoError(t, err)
			require.NoError(t, res[1].Err)
			var ee *codec.EntryError
			require.ErrorAs(t, res[0].Err, &ee)
			assert.Equal(t, code, ee.Code)
			assert.True(t, codec.IsPermanent(res[0].Err), "an entry failed for an unusable KMS key is permanent: %v", res[0].Err)
		})
	}
}
