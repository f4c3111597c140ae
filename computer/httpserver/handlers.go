package httpserver

import (
	"context"
	"net/http"

	"github.com/tetherdev/tether/computer/api"
)

func serveHealthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte("ok\n"))
}

func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(api.OpenAPI)
}

// create serves POST /v1/computers: 201 and the running computer.
func (s *Server) create(w http.ResponseWriter, r *http.Request, c api.Caller) {
	var req api.CreateRequest
	e := readBody(w, r, s.cfg.MaxBodyBytes, &req)
	if e == nil {
		e = checkCreate(req)
	}
	if e != nil {
		writeError(w, *e)
		return
	}
	comp, err := s.cfg.Backend.Create(r.Context(), c, req)
	s.auditf(r, c, AuditCall, comp.ID, outcome(err))
	if err != nil {
		s.fail(w, r, c, "", err)
		return
	}
	if r.Context().Err() != nil {
		s.deleteOrphan(r, c, comp.ID)
		return
	}
	writeJSON(w, http.StatusCreated, comp)
}

// deleteOrphan deletes a computer made for a client that went away while
// it was being made: no one would learn its id, and it would hold its
// capacity until its lease ended. The delete is audited.
func (s *Server) deleteOrphan(r *http.Request, c api.Caller, id string) {
	err := s.cfg.Backend.Delete(context.WithoutCancel(r.Context()), c, id)
	result := "client gone; deleted"
	if err != nil {
		result = "client gone; delete: " + api.CodeOf(err)
		s.cfg.Logger.Error("delete a computer whose client went away", "id", id, "err", err)
	}
	s.auditf(r, c, AuditCall, id, result)
}

// list serves GET /v1/computers.
func (s *Server) list(w http.ResponseWriter, r *http.Request, c api.Caller) {
	cs, err := s.cfg.Backend.List(r.Context(), c)
	if err != nil {
		s.fail(w, r, c, "", err)
		return
	}
	if cs == nil {
		cs = []api.Computer{}
	}
	writeJSON(w, http.StatusOK, api.ComputerList{Computers: cs})
}

// get serves GET /v1/computers/{id}.
func (s *Server) get(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	comp, err := s.cfg.Backend.Get(r.Context(), c, id)
	s.answer(w, r, c, id, comp, err)
}

// delete serves DELETE /v1/computers/{id}: 204.
func (s *Server) delete(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	err := s.cfg.Backend.Delete(r.Context(), c, id)
	s.auditf(r, c, AuditCall, id, outcome(err))
	if err != nil {
		s.fail(w, r, c, id, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// renew serves POST /v1/computers/{id}/renew.
func (s *Server) renew(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	var req api.RenewRequest
	e := readBody(w, r, s.cfg.MaxBodyBytes, &req)
	if e == nil {
		e = checkRenew(req)
	}
	if e != nil {
		writeError(w, *e)
		return
	}
	comp, err := s.cfg.Backend.Renew(r.Context(), c, id, ttl(req.LeaseTTLSeconds))
	s.auditf(r, c, AuditCall, id, outcome(err))
	s.answer(w, r, c, id, comp, err)
}

// suspend serves POST /v1/computers/{id}/suspend.
func (s *Server) suspend(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	if e := requireNoBody(r); e != nil {
		writeError(w, *e)
		return
	}
	comp, err := s.cfg.Backend.Suspend(r.Context(), c, id)
	s.auditf(r, c, AuditCall, id, outcome(err))
	s.answer(w, r, c, id, comp, err)
}

// resume serves POST /v1/computers/{id}/resume.
func (s *Server) resume(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	if e := requireNoBody(r); e != nil {
		writeError(w, *e)
		return
	}
	comp, err := s.cfg.Backend.Resume(r.Context(), c, id)
	s.auditf(r, c, AuditCall, id, outcome(err))
	s.answer(w, r, c, id, comp, err)
}

// answer writes comp with 200, or the error.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, c api.Caller, id string, comp api.Computer, err error) {
	if err != nil {
		s.fail(w, r, c, id, err)
		return
	}
	writeJSON(w, http.StatusOK, comp)
}

// outcome is "ok" or err's code, for the audit record.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	return api.CodeOf(err)
}
