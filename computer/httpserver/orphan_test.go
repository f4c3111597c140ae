package httpserver

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tetherdev/tether/computer/api"
)

// slowBackend makes its computer; with leave set, only once the
// request's context has ended, as a create does whose client goes away
// while the machine is made. Every method but Create and Delete panics
// (a nil Backend), so no other call can pass unnoticed.
type slowBackend struct {
	api.Backend
	leave   bool
	deleted chan string
}

func (b *slowBackend) Create(ctx context.Context, c api.Caller, _ api.CreateRequest) (api.Computer, error) {
	if b.leave {
		<-ctx.Done()
	}
	return api.Computer{ID: "c1", Owner: c.Owner, State: api.StateRunning, Tier: api.TierNamespaced}, nil
}

func (b *slowBackend) Delete(ctx context.Context, _ api.Caller, id string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	b.deleted <- id
	return nil
}

// TestCreateForGoneClientIsDeleted: a computer made for a client that
// went away meanwhile is deleted, and the delete audited. Positive
// control: for a client that stays, the create answers 201 and nothing
// is deleted.
func TestCreateForGoneClientIsDeleted(t *testing.T) {
	for _, leave := range []bool{true, false} {
		b := &slowBackend{leave: leave, deleted: make(chan string, 1)}
		var audits []AuditRecord
		srv, err := New(Config{Backend: b, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Audit: func(r AuditRecord) { audits = append(audits, r) }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), peerKey{}, api.Caller{Owner: "alice"}))
		if leave {
			cancel() // the client is gone before its computer is made
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/computers", strings.NewReader("{}")).WithContext(ctx)
		req.Header.Set("Content-Type", "application/json")
		srv.ServeHTTP(rec, req)
		cancel()
		var deleted string
		select {
		case deleted = <-b.deleted:
		default:
		}
		if len(audits) == 0 {
			t.Fatalf("nothing audited; answer %d %s", rec.Code, rec.Body)
		}
		last := audits[len(audits)-1]
		switch {
		case leave && (deleted != "c1" || !strings.Contains(last.Outcome, "client gone; deleted")):
			t.Errorf("client gone: deleted %q, last audit %+v; want c1 deleted and audited", deleted, last)
		case !leave && (deleted != "" || rec.Code != http.StatusCreated):
			t.Errorf("client stays: deleted %q, status %d; want nothing deleted, 201", deleted, rec.Code)
		}
	}
}
