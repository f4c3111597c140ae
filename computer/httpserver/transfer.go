package httpserver

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// Streams: an import's tar.zst body and a copy in's tar body are read as
// they come (not through the JSON decoder and its cap) up to
// Config.MaxStreamBytes; an export's and a copy out's body come from the
// backend whole, so their SHA-256 (api.HeaderSHA256) and length are
// headers.

// DefaultMaxStreamBytes caps an import or copy in body when
// Config.MaxStreamBytes is zero.
const DefaultMaxStreamBytes = 1 << 30

// maxPathBytes bounds the path query parameter of a copy.
const maxPathBytes = 4096

var digestPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// touch serves POST /v1/computers/{id}/touch.
func (s *Server) touch(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	if e := requireNoBody(r); e != nil {
		writeError(w, *e)
		return
	}
	comp, err := s.cfg.Backend.TouchAs(r.Context(), c, id)
	s.auditf(r, c, AuditCall, id, outcome(err))
	s.answer(w, r, c, id, comp, err)
}

// receipts serves GET /v1/computers/{id}/receipts.
func (s *Server) receipts(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	rs, err := s.cfg.Backend.Receipts(r.Context(), c, id)
	if err != nil {
		s.fail(w, r, c, id, err)
		return
	}
	if rs == nil {
		rs = []api.Receipt{}
	}
	writeJSON(w, http.StatusOK, api.ReceiptList{Receipts: rs})
}

// export serves GET /v1/computers/{id}/export: the tar.zst of a
// suspended computer's root.
func (s *Server) export(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	body, rec, err := s.cfg.Backend.Export(r.Context(), c, id)
	s.auditf(r, c, AuditCall, id, outcome(err))
	if err != nil {
		s.fail(w, r, c, id, err)
		return
	}
	defer body.Close()
	writeStream(w, "application/zstd", rec, body)
}

// copyOut serves GET /v1/computers/{id}/files?path=P: a tar of P.
func (s *Server) copyOut(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	p, e := pathParam(r.URL.Query())
	if e != nil {
		writeError(w, *e)
		return
	}
	body, rec, err := s.cfg.Backend.CopyOut(r.Context(), c, id, p)
	s.auditf(r, c, AuditCall, id, outcome(err))
	if err != nil {
		s.fail(w, r, c, id, err)
		return
	}
	defer body.Close()
	writeStream(w, "application/x-tar", rec, body)
}

// copyIn serves PUT /v1/computers/{id}/files?path=DIR: a tar extracted
// beneath DIR; 200 and the receipt.
func (s *Server) copyIn(w http.ResponseWriter, r *http.Request, c api.Caller, id string) {
	p, e := pathParam(r.URL.Query())
	if e == nil {
		e = checkStream(r, "application/x-tar", s.cfg.MaxStreamBytes)
	}
	if e != nil {
		writeError(w, *e)
		return
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxStreamBytes)
	rec, err := s.cfg.Backend.CopyIn(r.Context(), c, id, p, body)
	s.auditf(r, c, AuditCall, id, outcome(err))
	if err != nil {
		s.fail(w, r, c, id, overCap(err))
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

// importComputer serves POST /v1/computers/import?sha256=HEX: 201 and
// the new computer with the import's receipt.
func (s *Server) importComputer(w http.ResponseWriter, r *http.Request, c api.Caller) {
	req, want, e := importParams(r.URL.Query())
	if e == nil {
		e = checkStream(r, "application/zstd", s.cfg.MaxStreamBytes)
	}
	if e != nil {
		writeError(w, *e)
		return
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxStreamBytes)
	res, err := s.cfg.Backend.Import(r.Context(), c, req, body, want)
	s.auditf(r, c, AuditCall, res.Computer.ID, outcome(overCap(err)))
	if err != nil {
		s.fail(w, r, c, "", overCap(err))
		return
	}
	writeJSON(w, http.StatusCreated, res)
}

// writeStream answers 200 with body, rec.Bytes long, and its digest.
func writeStream(w http.ResponseWriter, ctype string, rec api.Receipt, body io.Reader) {
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Length", strconv.FormatInt(rec.Bytes, 10))
	h.Set(api.HeaderSHA256, rec.SHA256)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	w.WriteHeader(http.StatusOK)
	_, _ = io.CopyN(w, body, rec.Bytes)
}

// checkStream refuses a stream body of another content type, or one
// that says it is over max bytes.
func checkStream(r *http.Request, want string, max int64) *api.Error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != want {
		return api.Errorf(api.CodeBadRequest, "content type %q, want %s", r.Header.Get("Content-Type"), want)
	}
	if r.ContentLength > max {
		return api.Errorf(api.CodeTooLarge, "body of %d bytes, at most %d", r.ContentLength, max)
	}
	return nil
}

// overCap turns a body read past its cap into too_large.
func overCap(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return api.Errorf(api.CodeTooLarge, "body over %d bytes", mbe.Limit)
	}
	return err
}

// pathParam is the one path parameter of a copy: absolute, NUL-free,
// at most maxPathBytes (the backend checks it is beneath the root).
func pathParam(q url.Values) (string, *api.Error) {
	if e := onlyParams(q, "path"); e != nil {
		return "", e
	}
	p := q.Get("path")
	if !strings.HasPrefix(p, "/") || len(p) > maxPathBytes || strings.ContainsRune(p, 0) {
		return "", api.Errorf(api.CodeBadRequest, "path %q is not an absolute path of at most %d bytes", p, maxPathBytes)
	}
	return p, nil
}

// importKeys are the integer parameters an import takes beside sha256,
// each a field of the create it makes.
var importKeys = []string{"lease_ttl_s", "idle_timeout_s", "queue_timeout_s", "memory_bytes", "pids", "disk_bytes"}

// importParams reads an import's query: sha256 (required), the tier
// (a VM computer's export is its disk), and the create's integer
// fields, checked as a create body is.
func importParams(q url.Values) (api.CreateRequest, string, *api.Error) {
	var req api.CreateRequest
	if e := onlyParams(q, append([]string{"sha256", "tier"}, importKeys...)...); e != nil {
		return req, "", e
	}
	req.Tier = q.Get("tier") // the service refuses a tier it does not offer, or one it does not import into
	want := q.Get("sha256")
	if !digestPattern.MatchString(want) {
		return req, "", api.Errorf(api.CodeBadRequest, "sha256 %q is not 64 lowercase hex digits", want)
	}
	fields := []*int64{&req.LeaseTTLSeconds, &req.IdleTimeoutSeconds, &req.QueueTimeoutSeconds,
		&req.Limits.MemoryBytes, &req.Limits.Pids, &req.Limits.DiskBytes}
	for i, k := range importKeys {
		if !q.Has(k) {
			continue
		}
		n, err := strconv.ParseInt(q.Get(k), 10, 64)
		if err != nil {
			return req, "", api.Errorf(api.CodeBadRequest, "%s %q is not an integer", k, q.Get(k))
		}
		*fields[i] = n
	}
	return req, want, checkCreate(req)
}

// onlyParams refuses a query with a key not in keys, or a key twice.
func onlyParams(q url.Values, keys ...string) *api.Error {
	for k, vs := range q {
		if !contains(keys, k) {
			return api.Errorf(api.CodeBadRequest, "unknown query parameter %q", k)
		}
		if len(vs) != 1 {
			return api.Errorf(api.CodeBadRequest, "query parameter %q given %d times", k, len(vs))
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
