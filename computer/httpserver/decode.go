package httpserver

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"regexp"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/computer/api"
)

// Bounds of the wire, the same as the OpenAPI document's (a test compares
// them). The service may hold tighter ones of its own.
const (
	MaxBodyBytes           = 64 << 10
	MaxLeaseTTLSeconds     = 7 * 24 * 3600
	MaxIdleTimeoutSeconds  = 24 * 3600
	MaxQueueTimeoutSeconds = 3600
	MaxMemoryBytes         = 64 << 30
	MaxPids                = 65536
	MaxDiskBytes           = 1 << 40
	MaxLabels              = 32
	MaxLabelValue          = 256
)

// bodyReadTimeout bounds the read of one request body.
const bodyReadTimeout = 30 * time.Second

var (
	idPattern       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	labelKeyPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]{0,62}$`)
)

// readBody decodes r's JSON body strictly into v: a JSON content type,
// at most max bytes, one object, exact field names, no duplicate keys, no
// trailing data. The refusal is too_large or bad_request.
func readBody(w http.ResponseWriter, r *http.Request, max int, v any) *api.Error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return api.Errorf(api.CodeBadRequest, "content type %q, want application/json", r.Header.Get("Content-Type"))
	}
	if r.ContentLength > int64(max) {
		return api.Errorf(api.CodeTooLarge, "body of %d bytes, at most %d", r.ContentLength, max)
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout)) // not every writer has one
	defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	return decodeBody(r.Body, max, v)
}

// decodeBody is readBody's decoding, apart so the fuzz test reaches it.
func decodeBody(body io.Reader, max int, v any) *api.Error {
	if err := strictjson.Read(body, max, v); err != nil {
		if errors.Is(err, strictjson.ErrTooLarge) {
			return api.Errorf(api.CodeTooLarge, "body over %d bytes", max)
		}
		return api.Errorf(api.CodeBadRequest, "body: %v", err)
	}
	return nil
}

// requireNoBody refuses a request that carries a body where the endpoint
// takes none.
func requireNoBody(r *http.Request) *api.Error {
	if r.ContentLength > 0 {
		return api.Errorf(api.CodeBadRequest, "this endpoint takes no body")
	}
	n, _ := io.ReadFull(r.Body, make([]byte, 1))
	if n > 0 {
		return api.Errorf(api.CodeBadRequest, "this endpoint takes no body")
	}
	return nil
}

// decodeCreate decodes and checks a create body.
func decodeCreate(body io.Reader, max int) (api.CreateRequest, *api.Error) {
	var req api.CreateRequest
	if e := decodeBody(body, max, &req); e != nil {
		return req, e
	}
	return req, checkCreate(req)
}

// decodeRenew decodes and checks a renew body.
func decodeRenew(body io.Reader, max int) (api.RenewRequest, *api.Error) {
	var req api.RenewRequest
	if e := decodeBody(body, max, &req); e != nil {
		return req, e
	}
	return req, checkRenew(req)
}

// checkCreate refuses a create body outside the wire's bounds.
func checkCreate(req api.CreateRequest) *api.Error {
	checks := []struct {
		name     string
		val, max int64
	}{
		{"limits.memory_bytes", req.Limits.MemoryBytes, MaxMemoryBytes},
		{"limits.pids", req.Limits.Pids, MaxPids},
		{"limits.disk_bytes", req.Limits.DiskBytes, MaxDiskBytes},
		{"lease_ttl_s", req.LeaseTTLSeconds, MaxLeaseTTLSeconds},
		{"idle_timeout_s", req.IdleTimeoutSeconds, MaxIdleTimeoutSeconds},
		{"queue_timeout_s", req.QueueTimeoutSeconds, MaxQueueTimeoutSeconds},
	}
	for _, c := range checks {
		if c.val < 0 || c.val > c.max {
			return api.Errorf(api.CodeBadRequest, "%s is %d, want 0 to %d", c.name, c.val, c.max)
		}
	}
	if e := checkLabels(req.Labels); e != nil {
		return e
	}
	return checkPolicy(req.Egress)
}

// checkLabels refuses too many labels, a malformed key or a long value.
func checkLabels(labels map[string]string) *api.Error {
	if len(labels) > MaxLabels {
		return api.Errorf(api.CodeBadRequest, "%d labels, at most %d", len(labels), MaxLabels)
	}
	for k, v := range labels {
		if !labelKeyPattern.MatchString(k) {
			return api.Errorf(api.CodeBadRequest, "label key %q does not match %s", k, labelKeyPattern)
		}
		if len(v) > MaxLabelValue {
			return api.Errorf(api.CodeBadRequest, "label %q: value of %d bytes, at most %d", k, len(v), MaxLabelValue)
		}
	}
	return nil
}

// checkRenew refuses a renew TTL outside 1 s to the wire's maximum.
func checkRenew(req api.RenewRequest) *api.Error {
	if req.LeaseTTLSeconds < 1 || req.LeaseTTLSeconds > MaxLeaseTTLSeconds {
		return api.Errorf(api.CodeBadRequest, "lease_ttl_s is %d, want 1 to %d", req.LeaseTTLSeconds, MaxLeaseTTLSeconds)
	}
	return nil
}

// checkID refuses a path id that no computer can have.
func checkID(id string) *api.Error {
	if !idPattern.MatchString(id) {
		return api.Errorf(api.CodeBadRequest, "computer id %q does not match %s", id, idPattern)
	}
	return nil
}

// ttl turns checked seconds into a duration.
func ttl(seconds int64) time.Duration { return time.Duration(seconds) * time.Second }
