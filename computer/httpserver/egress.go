package httpserver

import (
	"net/http"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

// getEgress serves GET /v1/computers/{id}/egress.
func (s *Server) getEgress(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	info, err := s.cfg.Backend.Egress(r.Context(), c, id)
	if err != nil {
		s.fail(w, r, c, id, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// putEgress serves PUT /v1/computers/{id}/egress: the body is the new
// policy, the answer what is stored. The change is audited.
func (s *Server) putEgress(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	var pol policy.Policy
	e := readBody(w, r, s.cfg.MaxBodyBytes, &pol)
	if e == nil {
		e = checkPolicy(pol)
	}
	if e != nil {
		writeError(w, *e)
		return
	}
	info, err := s.cfg.Backend.SetEgress(r.Context(), c, id, pol)
	s.auditf(r, c, AuditCall, id, outcome(err))
	if err != nil {
		s.fail(w, r, c, id, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// checkPolicy refuses a policy whose form is wrong (policy.Validate);
// which presets exist only the service knows.
func checkPolicy(pol policy.Policy) *api.Error {
	if err := pol.Validate(); err != nil {
		return api.Errorf(api.CodeBadRequest, "egress: %v", err)
	}
	return nil
}
