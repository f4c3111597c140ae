package httpserver

import (
	"errors"
	"net/http"

	"github.com/tetherdev/tether/computer/api"
)

// link serves POST /v1/computers/{id}/links: 201 and a one-time link to
// the computer's live view. The mint is audited; the link (a secret)
// is not.
func (s *Server) link(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	var req api.LinkRequest
	e := readBody(w, r, s.cfg.MaxBodyBytes, &req)
	if e == nil {
		var refused *api.Error
		if _, err := api.CheckLink(req); errors.As(err, &refused) {
			e = refused
		}
	}
	if e != nil {
		writeError(w, *e)
		return
	}
	l, err := s.cfg.Backend.Link(r.Context(), c, id, req)
	s.auditf(r, c, AuditCall, id, outcome(err))
	if err != nil {
		s.fail(w, r, c, id, err)
		return
	}
	writeJSON(w, http.StatusCreated, l)
}
