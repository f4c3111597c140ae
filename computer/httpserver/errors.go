package httpserver

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/tetherdev/tether/computer/api"
)

// statusOf maps every code of the closed set to its HTTP status. A code
// outside the set is not sent: errorBody turns it into internal.
var statusOf = map[string]int{
	api.CodeBadRequest:   http.StatusBadRequest,
	api.CodeTooLarge:     http.StatusRequestEntityTooLarge,
	api.CodeUnauthorized: http.StatusUnauthorized,
	api.CodeNotFound:     http.StatusNotFound,
	api.CodeConflict:     http.StatusConflict,
	api.CodeQueueTimeout: http.StatusServiceUnavailable,
	api.CodeOverQuota:    http.StatusTooManyRequests,
	api.CodeUnavailable:  http.StatusServiceUnavailable,
	api.CodeInternal:     http.StatusInternalServerError,
	// egress.go
	api.CodeUnknownPreset: http.StatusBadRequest,
	api.CodeNoEgress:      http.StatusConflict,
}

// StatusOf returns the HTTP status an error answer with code carries;
// a code outside the closed set is internal's.
func StatusOf(code string) int {
	if s, ok := statusOf[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// errorBody is the answer for err: its own code and message when it is
// an *api.Error with a code of the closed set, otherwise internal with a
// generic message (the detail goes to the log, never to the peer).
func errorBody(err error) (api.Error, bool) {
	var e *api.Error
	if errors.As(err, &e) {
		if _, ok := statusOf[e.Code]; ok && e.Code != api.CodeInternal {
			return api.Error{Code: e.Code, Message: e.Message}, true
		}
	}
	return api.Error{Code: api.CodeInternal, Message: "internal error"}, false
}

// writeJSON answers status with v encoded as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"code":"internal","message":"internal error"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeError answers e with the status of its code.
func writeError(w http.ResponseWriter, e api.Error) {
	if e.Code == api.CodeUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tether-computer"`)
	}
	writeJSON(w, StatusOf(e.Code), e)
}
