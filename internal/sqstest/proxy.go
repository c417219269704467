// Package sqstest holds what sinkbatch's tests need around a real
// SQS-compatible server (kumo, fauxqs): a proxy in front of it that injects
// faults into SendMessageBatch calls, SQS's error answers, and a read back
// that empties a queue.
//
// The proxy is how tests fake what neither server does: a 500, throttling,
// a delay, a reset connection, a failed entry, an answer stored but lost, a
// doctored checksum. Everything it does not touch reaches the real server
// unchanged, so what a test reads back is what the server stored.
package sqstest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Call is one SendMessageBatch call as the proxy received it.
type Call struct {
	N      int         // the call's place among SendMessageBatch calls, from 1
	Header http.Header // the request's headers (read only)
	Body   []byte      // the request's JSON body (read only)
}

// Action is what the proxy does with one SendMessageBatch call, step by
// step in the order of its fields. The zero Action forwards the call and
// its answer unchanged.
type Action struct {
	// Before holds the call this long before answering or forwarding it.
	// If the client hangs up meanwhile, the call ends there.
	Before time.Duration
	// Answer, if set, answers the call instead of the server, which never
	// sees it.
	Answer func(w http.ResponseWriter)
	// Fail, if set, sees each entry of the request in order. An entry it
	// returns a failure for (see Failure) is taken out of the request and
	// listed in the answer's Failed: it is not stored. If every entry
	// fails, the server never sees the call.
	Fail func(entry map[string]any) (failure map[string]any)
	// ResetAfter forwards the call and then resets the client's
	// connection: the server stored the messages, the client never learns
	// it.
	ResetAfter bool
	// Rewrite, if set, edits the server's answer when its status is 200.
	Rewrite func(a *BatchAnswer)
	// After holds the server's answer this long before sending it on. If
	// the client hangs up meanwhile, the answer is lost.
	After time.Duration
}

// Fault decides what the proxy does with a SendMessageBatch call. It runs
// on the call's own goroutine, concurrently with other calls.
type Fault func(c *Call) Action

// BatchAnswer is SendMessageBatch's JSON answer, entries as JSON decodes
// them, so that a Rewrite can set, change or delete any field.
type BatchAnswer struct {
	Successful []map[string]any `json:"Successful"`
	Failed     []map[string]any `json:"Failed,omitempty"`
}

// Proxy is an HTTP server on 127.0.0.1 that forwards every call to an
// SQS-compatible server and applies its Fault to each SendMessageBatch
// call. Safe for concurrent use.
type Proxy struct {
	// URL is the proxy's base URL, for aws.Config.BaseEndpoint.
	URL string

	target string
	tr     *http.Transport
	calls  atomic.Int64 // SendMessageBatch calls received

	mu    sync.Mutex
	fault Fault
}

// New starts a proxy in front of the server at target (a base URL such as
// kumo's Server.URL). It forwards every call unchanged until Set gives it a
// Fault, and stops when tb ends.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p := &Proxy{target: target, tr: http.DefaultTransport.(*http.Transport).Clone()}
	p.tr.MaxIdleConnsPerHost = 64
	srv := httptest.NewServer(http.HandlerFunc(p.serve)) // on 127.0.0.1
	tb.Cleanup(func() {
		srv.Close()
		p.tr.CloseIdleConnections()
	})
	p.URL = srv.URL
	return p
}

// Set makes f decide every later SendMessageBatch call; nil forwards them
// unchanged.
func (p *Proxy) Set(f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = f
}

// Calls is the number of SendMessageBatch calls the proxy has received,
// whatever their Fault did with them.
func (p *Proxy) Calls() int64 { return p.calls.Load() }

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the client hung up
	}
	var act Action
	if r.Header.Get("X-Amz-Target") == "AmazonSQS.SendMessageBatch" {
		n := int(p.calls.Add(1))
		p.mu.Lock()
		f := p.fault
		p.mu.Unlock()
		if f != nil {
			act = f(&Call{N: n, Header: r.Header, Body: body})
		}
	}
	if act.Before > 0 && !wait(r.Context(), act.Before) {
		return
	}
	if act.Answer != nil {
		act.Answer(w)
		return
	}
	var failed []map[string]any
	if act.Fail != nil {
		body, failed = failEntries(body, act.Fail)
	}
	status, header, answer := http.StatusOK, http.Header{"Content-Type": {"application/x-amz-json-1.0"}}, []byte(`{"Successful":[]}`)
	if body != nil { // some entry is left for the server
		resp, err := p.forward(r, body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		status, header, answer = resp.status, resp.header, resp.body
	}
	if act.ResetAfter {
		Reset(w)
		return
	}
	if status == http.StatusOK && (act.Rewrite != nil || len(failed) > 0) {
		var a BatchAnswer
		if err := json.Unmarshal(answer, &a); err != nil {
			http.Error(w, "sqstest: the server's answer: "+err.Error(), http.StatusBadGateway)
			return
		}
		a.Failed = append(a.Failed, failed...)
		if act.Rewrite != nil {
			act.Rewrite(&a)
		}
		if answer, err = json.Marshal(a); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
	}
	if act.After > 0 && !wait(r.Context(), act.After) {
		return
	}
	for k, vs := range header {
		w.Header()[k] = vs
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
	w.WriteHeader(status)
	_, _ = w.Write(answer)
}

// reply is the server's answer to a forwarded call.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// forward sends r, with body, to the server and reads its answer.
func (p *Proxy) forward(r *http.Request, body []byte) (reply, error) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header = r.Header.Clone()
	req.Header.Del("Content-Length") // the body may have lost entries
	resp, err := p.tr.RoundTrip(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}, err
}

// failEntries returns the request without the entries fail fails (nil if
// none is left) and their failures.
func failEntries(body []byte, fail func(map[string]any) map[string]any) ([]byte, []map[string]any) {
	var req map[string]any
	if json.Unmarshal(body, &req) != nil {
		return body, nil // the server will say what is wrong with it
	}
	entries, _ := req["Entries"].([]any)
	var keep []any
	var failed []map[string]any
	for _, x := range entries {
		e, _ := x.(map[string]any)
		if f := fail(e); f != nil {
			failed = append(failed, f)
			continue
		}
		keep = append(keep, x)
	}
	switch {
	case len(failed) == 0:
		return body, nil
	case len(keep) == 0:
		return nil, failed
	}
	req["Entries"] = keep
	out, err := json.Marshal(req)
	if err != nil {
		panic(err) // it was decoded from JSON a moment ago
	}
	return out, failed
}

// wait sleeps for d or until ctx ends; it reports whether d passed.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Always is a Fault that answers every SendMessageBatch call with answer.
func Always(answer func(w http.ResponseWriter)) Fault {
	return func(*Call) Action { return Action{Answer: answer} }
}

// First is a Fault that answers the first n SendMessageBatch calls with
// answer and forwards the others.
func First(n int, answer func(w http.ResponseWriter)) Fault {
	return func(c *Call) Action {
		if c.N > n {
			return Action{}
		}
		return Action{Answer: answer}
	}
}

// Rewrite is a Fault that forwards every SendMessageBatch call and edits
// the server's answer with edit.
func Rewrite(edit func(a *BatchAnswer)) Fault {
	return func(*Call) Action { return Action{Rewrite: edit} }
}

// Error is an answer in SQS's JSON error shape: status, the error code in
// __type and in the AWS-query compatible header the SDK reports, and msg.
// A status of 500 or above is the server's fault, anything else the
// sender's, as SQS says.
func Error(status int, code, msg string) func(w http.ResponseWriter) {
	fault := "Sender"
	if status >= http.StatusInternalServerError {
		fault = "Receiver"
	}
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.Header().Set("X-Amzn-Query-Error", code+";"+fault)
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"__type":"com.amazonaws.sqs#%s","message":%q}`, code, msg)
	}
}

// Reset is an answer that is none: it closes the client's connection with
// a TCP RST.
func Reset(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err) // an httptest server's ResponseWriter can always be hijacked
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// Failure is an entry of SendMessageBatch's Failed list for the request
// entry whose Id is id.
func Failure(id any, code, msg string, senderFault bool) map[string]any {
	return map[string]any{"Id": id, "Code": code, "Message": msg, "SenderFault": senderFault}
}
