package httpserver

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// TestEventsStream: GET /v1/events answers text/event-stream and sends
// each event as one flushed "data: {json}" block the Event schema admits;
// when the client goes, the backend's stream context ends.
func TestEventsStream(t *testing.T) {
	h := newHarness(t)
	h.be.expect("Events", 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, _ := http.NewRequestWithContext(ctx, "GET", h.ts.URL+"/v1/events", nil)
	r.Header.Set("Authorization", "Bearer "+h.tokens["alice"])
	resp, err := h.hc.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("events: %d %q", resp.StatusCode, ct)
	}
	sc := bufio.NewScanner(resp.Body)
	at := time.Date(2026, 12, 6, 19, 0, 0, 0, time.UTC)
	sent := []api.Event{
		{Seq: 1, Computer: "c1", Owner: "alice", From: "", To: api.StateQueued, At: at, QueuePosition: 2},
		{Seq: 2, Computer: "c1", Owner: "alice", From: api.StateQueued, To: api.StateRunning, At: at, Reason: "claimed"},
	}
	for _, ev := range sent {
		h.be.events <- ev // unbuffered: the handler took it before the next
		if !sc.Scan() {
			t.Fatalf("stream ended: %v", sc.Err())
		}
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			t.Fatalf("line %q is no data line", sc.Text())
		}
		checkEventSchema(t, []byte(data))
		var got api.Event
		if err := jsonDecode([]byte(data), &got); err != nil || got.Seq != ev.Seq || got.To != ev.To {
			t.Errorf("event %q (%v), want %+v", data, err, ev)
		}
		if !sc.Scan() || sc.Text() != "" {
			t.Errorf("event not ended by a blank line: %q", sc.Text())
		}
	}
	cancel()
	resp.Body.Close()
	select {
	case <-h.be.eventsDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's event stream did not end when the client went")
	}
}

// TestEventsRefusedWithoutCredential: the stream is no way around auth.
func TestEventsRefusedWithoutCredential(t *testing.T) {
	h := newHarness(t)
	wantError(t, "events without token", h.do(req{method: "GET", path: "/v1/events"}), 401, api.CodeUnauthorized)
	if h.be.callCount() != 0 {
		t.Fatal("the backend was called")
	}
}
