package adversary_test

// Promises of the doc comments that inputs within their contract break.

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ankusa/sinkbatch/codec"
)

// codec.Permanent's doc: "IsPermanent reports true for it and for anything
// that wraps it". IsPermanent looks for an *EntryError first and believes
// its flag, wherever in the chain it is: a retryable EntryError marked
// Permanent by a wrapper is answered retryable. And its doc counts an error
// that wraps ErrRefused as permanent, but one that also carries the
// destination's code in a retryable EntryError is not: a lone message the
// destination refuses is then retried forever.
func TestIsPermanentThroughWrappers(t *testing.T) {
	entry := &codec.EntryError{Code: "InvalidParameterValue", Message: "the destination's text"}
	for name, err := range map[string]error{
		"Permanent(EntryError)":         codec.Permanent(entry),
		"Permanent(wrapped EntryError)": codec.Permanent(fmt.Errorf("sqs: %w", entry)),
		"ErrRefused with EntryError":    fmt.Errorf("%w: %w", codec.ErrRefused, entry),
	} {
		assert.True(t, codec.IsPermanent(err), "%s: %q", name, err)
	}
}
