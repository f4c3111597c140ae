package httpserver

import (
	"log/slog"
	"time"
)

// Audit actions.
const (
	AuditPeerRefused  = "peer_refused" // a unix-socket peer neither root nor in the group
	AuditUnauthorized = "unauthorized" // no or unknown bearer token
	AuditNotFound     = "not_found"    // a request for a computer the caller may not see (another owner's, or none)
	AuditCall         = "call"         // a request that changes a computer, with its outcome
)

// AuditRecord is one audited event: when, who (the owner, or the peer's
// uid and pid when it was refused before it had one), what, on which
// computer, and the outcome (an error code, or "ok").
type AuditRecord struct {
	Time    time.Time
	Who     string
	Action  string
	Method  string
	Path    string
	ID      string
	Outcome string
}

// SlogAudit returns an audit hook that writes each record as one log
// line ("audit") to l.
func SlogAudit(l *slog.Logger) func(AuditRecord) {
	return func(r AuditRecord) {
		l.Info("audit", "time", r.Time.UTC().Format(time.RFC3339Nano), "who", r.Who, "action", r.Action,
			"method", r.Method, "path", r.Path, "id", r.ID, "outcome", r.Outcome)
	}
}
