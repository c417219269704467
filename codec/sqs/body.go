package sqs

import (
	"io"
	"net/http"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
)

// readOnlyBodies is the HTTP client under each SendMessageBatch call. It
// hands net/http a request body that has Read and Close only.
//
// Why: smithy-go closes the request body as soon as the response headers
// are in, and its body's WriteTo answers io.EOF once closed. net/http, having
// written Content-Length bytes, still reads the body once more to check for
// extra bytes; when that read comes after the close and goes through WriteTo,
// the EOF is a write error and net/http closes the connection under the
// response being read. The SDK then retries a request SQS has already stored
// (aws-sdk-go-v2 issue 2737). Read, unlike WriteTo, reports the end of a
// closed body as a clean end.
type readOnlyBodies struct{ next awssqs.HTTPClient }

// Do sends r with its body wrapped.
func (c readOnlyBodies) Do(r *http.Request) (*http.Response, error) {
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = readCloser{r.Body}
	}
	return c.next.Do(r)
}

// readCloser hides every method of its body but Read and Close.
type readCloser struct{ io.ReadCloser }
