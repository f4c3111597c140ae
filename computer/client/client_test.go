package client

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/httpserver"
)

// fakeBackend answers Get and Events; any other call panics through the
// nil embedded interface, which fails the test.
type fakeBackend struct {
	api.Backend
	events chan api.Event
}

func (fakeBackend) Get(_ context.Context, c api.Caller, id string) (api.Computer, error) {
	if id != "c1" || c.Owner != "alice" {
		return api.Computer{}, api.Errorf(api.CodeNotFound, "no computer %q", id)
	}
	return api.Computer{ID: "c1", Owner: c.Owner, State: api.StateRunning, Tier: api.TierNamespaced, CreatedAt: time.Now()}, nil
}

func (b fakeBackend) Events(ctx context.Context, _ api.Caller) (<-chan api.Event, error) {
	return b.events, nil
}

// newTLSClient serves a Server over TLS 1.3 and returns a client with
// alice's token.
func newTLSClient(t *testing.T, be api.Backend) (*Client, *httptest.Server) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tokens.json")
	tok, err := httpserver.AddToken(file, "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := httpserver.OpenTokens(file)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := httpserver.New(httpserver.Config{Backend: be, Tokens: toks, Logger: slog.New(slog.DiscardHandler),
		Audit: func(httpserver.AuditRecord) {}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(srv)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	tlsConf := ts.Client().Transport.(*http.Transport).TLSClientConfig
	c, err := HTTPS(ts.URL, tok, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c, ts
}

// TestErrorAnswersAreAPIErrors: an error answer comes back as *api.Error
// with the server's code; a success decodes; a bad token is unauthorized.
func TestErrorAnswersAreAPIErrors(t *testing.T) {
	c, ts := newTLSClient(t, fakeBackend{})
	ctx := context.Background()
	if comp, err := c.Get(ctx, "c1"); err != nil || comp.ID != "c1" {
		t.Fatalf("Get c1: %+v %v", comp, err)
	}
	_, err := c.Get(ctx, "c2")
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeNotFound {
		t.Errorf("Get c2: %v, want *api.Error not_found", err)
	}
	if _, err := c.Renew(ctx, "c1", 0); api.CodeOf(err) != api.CodeBadRequest {
		t.Errorf("Renew 0s: %v, want bad_request", err)
	}
	if err := c.Health(ctx); err != nil {
		t.Errorf("Health: %v", err)
	}
	if doc, err := c.OpenAPI(ctx); err != nil || string(doc) != string(api.OpenAPI) {
		t.Errorf("OpenAPI: %d bytes, %v", len(doc), err)
	}
	bad, err := HTTPS(ts.URL, httpserver.TokenPrefix+"00", ts.Client().Transport.(*http.Transport).TLSClientConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.CloseIdleConnections()
	if _, err := bad.List(ctx); api.CodeOf(err) != api.CodeUnauthorized {
		t.Errorf("List with a bad token: %v, want unauthorized", err)
	}
}

// TestHTTPSRefusesPlainURL: the client never sends a token over http.
func TestHTTPSRefusesPlainURL(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:1", "https://", "https://h/path", "unix:///x"} {
		if _, err := HTTPS(u, "t", nil); err == nil {
			t.Errorf("HTTPS(%q) accepted", u)
		}
	}
	if _, err := HTTPS("https://127.0.0.1:1", "t", nil); err != nil {
		t.Errorf("positive control: %v", err)
	}
}

// TestEventStream reads events until the client closes the stream.
func TestEventStream(t *testing.T) {
	be := fakeBackend{events: make(chan api.Event, 2)}
	c, _ := newTLSClient(t, be)
	be.events <- api.Event{Seq: 1, Computer: "c1", Owner: "alice", To: api.StateRunning, At: time.Now()}
	close(be.events)
	s, err := c.Events(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev, err := s.Next()
	if err != nil || ev.Seq != 1 || ev.To != api.StateRunning {
		t.Fatalf("Next: %+v %v", ev, err)
	}
	if _, err := s.Next(); !errors.Is(err, ErrStreamEnded) {
		t.Errorf("after the backend closed: %v, want ErrStreamEnded", err)
	}
}

// TestAnswersDecodedStrictly: an answer with an unknown field is refused.
func TestAnswersDecodedStrictly(t *testing.T) {
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"c1","owner":"a","owner":"b"}`))
	}))
	defer ts.Close()
	c, err := HTTPS(ts.URL, "t", ts.Client().Transport.(*http.Transport).TLSClientConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	if _, err := c.Get(context.Background(), "c1"); err == nil {
		t.Fatal("an answer with a duplicate key was accepted")
	}
}
