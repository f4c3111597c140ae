package httpserver

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// events serves GET /v1/events: Server-Sent Events, one api.Event as
// JSON per "data:" line, each flushed, until the client goes (its
// context ends, which ends the backend's stream) or the backend closes
// the channel.
func (s *Server) events(w http.ResponseWriter, r *http.Request, c api.Caller) {
	rc := http.NewResponseController(w)
	ch, err := s.cfg.Backend.Events(r.Context(), c)
	if err != nil {
		s.fail(w, r, c, "", err)
		return
	}
	_ = rc.SetWriteDeadline(time.Time{}) // a stream has no end to wait for
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-ch:
			if !ok || writeEvent(w, rc, ev) != nil {
				return
			}
		}
	}
}

// writeEvent writes one event block and flushes it.
func writeEvent(w http.ResponseWriter, rc *http.ResponseController, ev api.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if _, err := w.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
		return err
	}
	return rc.Flush()
}
