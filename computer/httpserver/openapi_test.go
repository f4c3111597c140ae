package httpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/tetherdev/tether/computer/api"
)

var (
	docOnce   sync.Once
	docLoaded *openapi3.T
	docRouter routers.Router
	docErr    error
)

// loadDoc loads and validates the embedded OpenAPI document once.
func loadDoc(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	docOnce.Do(func() {
		l := openapi3.NewLoader()
		docLoaded, docErr = l.LoadFromData(api.OpenAPI)
		if docErr == nil {
			docErr = docLoaded.Validate(context.Background())
		}
		if docErr == nil {
			docRouter, docErr = legacy.NewRouter(docLoaded)
		}
	})
	if docErr != nil {
		t.Fatalf("OpenAPI document: %v", docErr)
	}
	return docLoaded, docRouter
}

// expectation says what request validation must find for a request the
// test sends: the valid ones must pass; an attack the document can
// express must fail it too, so the document and the server agree.
type expectation int

const (
	reqValid        expectation = iota
	reqInvalid                  // the document refuses it as well
	reqUnexpressive             // duplicate keys, trailing data, content types: beyond a schema
)

type expectKey struct{}

// withExpect marks ctx's request with what its validation must find.
func withExpect(ctx context.Context, e expectation) context.Context {
	return context.WithValue(ctx, expectKey{}, e)
}

// checkedTransport validates every request and every response that goes
// through it against the OpenAPI document with kin-openapi, and fails
// the test on a mismatch.
type checkedTransport struct {
	t    testing.TB
	next http.RoundTripper
}

func (c checkedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.t.Helper()
	_, router := loadDoc(c.t)
	body := readAll(c.t, &req.Body)
	route, params, err := router.FindRoute(req)
	if err != nil {
		c.t.Errorf("%s %s: no route in the document: %v", req.Method, req.URL.Path, err)
		return c.next.RoundTrip(req)
	}
	in := &openapi3filter.RequestValidationInput{Request: req.Clone(req.Context()), PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, RejectWhenRequestBodyNotSpecified: true}}
	in.Request.Body = io.NopCloser(bytes.NewReader(body))
	verr := openapi3filter.ValidateRequest(req.Context(), in)
	want, _ := req.Context().Value(expectKey{}).(expectation)
	switch {
	case want == reqValid && verr != nil:
		c.t.Errorf("%s %s: request does not match the document: %v", req.Method, req.URL.Path, verr)
	case want == reqInvalid && verr == nil:
		c.t.Errorf("%s %s %q: the document admits a request the server must refuse", req.Method, req.URL.Path, body)
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := c.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	c.checkResponse(in, resp)
	return resp, nil
}

// checkResponse validates resp; an event stream's body is read by the
// test itself, which checks every event against the Event schema.
func (c checkedTransport) checkResponse(in *openapi3filter.RequestValidationInput, resp *http.Response) {
	c.t.Helper()
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	var body []byte
	if !stream {
		body = readAll(c.t, &resp.Body)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body:    io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: stream}}
	if err := openapi3filter.ValidateResponse(in.Request.Context(), out); err != nil {
		c.t.Errorf("%s %s: answer %d %q does not match the document: %v", in.Request.Method, in.Request.URL.Path, resp.StatusCode, body, err)
	}
}

// readAll reads *rc to its end and replaces it with a reader of the same
// bytes.
func readAll(t testing.TB, rc *io.ReadCloser) []byte {
	t.Helper()
	if *rc == nil || *rc == http.NoBody {
		return nil
	}
	b, err := io.ReadAll(*rc)
	if err != nil {
		t.Errorf("read body: %v", err)
	}
	(*rc).Close()
	*rc = io.NopCloser(bytes.NewReader(b))
	return b
}

// checkEventSchema validates one event's JSON against the Event schema.
func checkEventSchema(t testing.TB, data []byte) {
	t.Helper()
	doc, _ := loadDoc(t)
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Errorf("event %q: %v", data, err)
		return
	}
	if err := doc.Components.Schemas["Event"].Value.VisitJSON(v); err != nil {
		t.Errorf("event %q does not match the Event schema: %v", data, err)
	}
}
