package server

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

// clock is a settable time source.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func admit(lease time.Time) contract.Attacher {
	return func(context.Context, string, string) (json.RawMessage, error) {
		return json.Marshal(acpmeta.AttachResponse{LeaseNotAfter: lease, GrantGeneration: 1})
	}
}

// boundServer returns a server with session "s1" bound on a connection of
// alice's, and that connection's id.
func boundServer(t *testing.T) (*Server, *clock, string) {
	t.Helper()
	clk := &clock{now: time.Now()}
	s := New(clk.Now)
	ctx := context.Background()
	conn, err := s.Connect(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	lease := clk.now.Add(2 * time.Hour)
	tu := admission.Tuple{Owner: "alice", Allocation: "a", Session: "s", Workspace: "w", Sandbox: "x",
		Generation: 1, Executor: "e", Site: "t", Root: "/r"}
	if _, err := s.OpenSession(ctx, contract.OpenRequest{ConnID: conn, SessionID: "s1", Method: contract.MethodNew,
		Meta: acpmeta.Bind{Tuple: tu, LeaseNotAfter: lease}.Meta()}, admit(lease)); err != nil {
		t.Fatal(err)
	}
	return s, clk, conn
}

func wantCode(t *testing.T, err error, code errcode.Code) {
	t.Helper()
	if got, _ := acperr.CodeOf(err); got != code {
		t.Fatalf("error %v, want code %s", err, code)
	}
}

func state(t *testing.T, s *Server, conn string) contract.Status {
	t.Helper()
	st, err := s.Status(context.Background(), conn, "s1")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

var mismatch = contract.Failure{Request: "fs/read_text_file", Code: errcode.CodeTupleMismatch, Message: "digest is not the binding's"}

// TestReportNeedsTheCallsTicket attacks Report: a ticket another plugin
// minted, an altered ticket, or a genuine one presented on another
// connection is refused (invalid) and fences nothing; the genuine ticket
// on its own connection fences.
func TestReportNeedsTheCallsTicket(t *testing.T) {
	s, _, conn := boundServer(t)
	ctx := context.Background()
	plan, err := s.Authorize(ctx, contract.ToolCall{ConnID: conn, SessionID: "s1", Tool: contract.ReadTool{Path: "f"}})
	if err != nil {
		t.Fatal(err)
	}
	other := New(nil) // same fields, another key
	forged := other.tickets.mint(ticket{Conn: conn, Session: "s1", Epoch: 1, Expires: time.Now().Add(time.Hour).UnixMilli()})
	payload, sig, _ := strings.Cut(plan.Ticket, ".")
	altered := payload[:len(payload)-2] + "AA." + sig
	conn2, err := s.Connect(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]contract.Report{
		"forged":             {ConnID: conn, Ticket: forged, Failures: []contract.Failure{mismatch}},
		"altered":            {ConnID: conn, Ticket: altered, Failures: []contract.Failure{mismatch}},
		"another_connection": {ConnID: conn2, Ticket: plan.Ticket, Failures: []contract.Failure{mismatch}},
		"garbage":            {ConnID: conn, Ticket: "x", Failures: []contract.Failure{mismatch}},
	} {
		wantCode(t, s.Report(ctx, r), errcode.CodeInvalid)
		if st := state(t, s, conn); st.State != contract.Bound {
			t.Fatalf("%s: a refused report changed the binding to %v", name, st.State)
		}
	}
	// A failure without a fence code fences nothing.
	notFound := contract.Failure{Request: "fs/read_text_file", Code: errcode.CodeNotFound, Message: "no such file"}
	if err := s.Report(ctx, contract.Report{ConnID: conn, Ticket: plan.Ticket, Failures: []contract.Failure{notFound}}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, conn); st.State != contract.Bound {
		t.Fatalf("not_found fenced the binding: %v", st.State)
	}
	if err := s.Report(ctx, contract.Report{ConnID: conn, Ticket: plan.Ticket, Failures: []contract.Failure{mismatch}}); err != nil {
		t.Fatal(err)
	}
	st := state(t, s, conn)
	if st.State != contract.Fenced || st.Code != errcode.CodeTupleMismatch || !strings.Contains(st.Message, "is not the binding's") {
		t.Fatalf("after the genuine report: %+v", st)
	}
	_, err = s.Authorize(ctx, contract.ToolCall{ConnID: conn, SessionID: "s1", Tool: contract.ReadTool{Path: "f"}})
	wantCode(t, err, errcode.CodeFenced)
}

// TestReportCheckAndStaleTickets: Check holds while the binding the call
// was authorized under holds; a ticket from before a reattach can neither
// fence the new binding nor pass its check; a check after the call's time
// is refused.
func TestReportCheckAndStaleTickets(t *testing.T) {
	s, clk, conn := boundServer(t)
	ctx := context.Background()
	authorize := func() contract.Plan {
		p, err := s.Authorize(ctx, contract.ToolCall{ConnID: conn, SessionID: "s1", Timeout: time.Second,
			Tool: contract.GlobTool{Pattern: "*"}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := authorize()
	if err := s.Report(ctx, contract.Report{ConnID: conn, Ticket: old.Ticket, Check: true}); err != nil {
		t.Fatalf("check of a live binding: %v", err)
	}
	lost := contract.Failure{Request: "terminal/create", Transport: true, Message: "closed"}
	if err := s.Report(ctx, contract.Report{ConnID: conn, Ticket: old.Ticket, Failures: []contract.Failure{lost}}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, conn); st.State != contract.Fenced || st.Code != errcode.CodeFateUnknown {
		t.Fatalf("a lost connection did not fence: %+v", st)
	}
	lease := clk.Now().Add(2 * time.Hour)
	tu := admission.Tuple{Owner: "alice", Allocation: "a", Session: "s", Workspace: "w", Sandbox: "x",
		Generation: 1, Executor: "e", Site: "t", Root: "/r"}
	if _, err := s.OpenSession(ctx, contract.OpenRequest{ConnID: conn, SessionID: "s1", Method: contract.MethodLoad,
		Meta: acpmeta.Bind{Tuple: tu, LeaseNotAfter: lease}.Meta()}, admit(lease)); err != nil {
		t.Fatal(err)
	}
	if err := s.Report(ctx, contract.Report{ConnID: conn, Ticket: old.Ticket, Failures: []contract.Failure{mismatch}}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, conn); st.State != contract.Bound {
		t.Fatalf("a stale ticket fenced the reattached binding: %+v", st)
	}
	wantCode(t, s.Report(ctx, contract.Report{ConnID: conn, Ticket: old.Ticket, Check: true}), errcode.CodeFenced)
	fresh := authorize()
	clk.add(time.Minute) // past the call's deadline, clean-up and slack
	err := s.Report(ctx, contract.Report{ConnID: conn, Ticket: fresh.Ticket, Check: true})
	if wantCode(t, err, errcode.CodeTimeout); errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("untyped timeout")
	}
}

// FuzzTicketOpen: whatever a host presents, open never panics, and it
// accepts only a ticket this plugin minted for that connection, unchanged.
func FuzzTicketOpen(f *testing.F) {
	tk := newTicketer(time.Now)
	genuine := tk.mint(ticket{Conn: "conn-1", Session: "s1", Epoch: 3, Expires: 1e12})
	f.Add("conn-1", genuine)
	f.Add("conn-2", genuine)
	f.Add("conn-1", "eyJjIjoiY29ubi0xIn0.AAAA")
	f.Fuzz(func(t *testing.T, conn, s string) {
		got, err := tk.open(conn, s)
		if err != nil {
			if code, _ := acperr.CodeOf(err); code != errcode.CodeInvalid {
				t.Fatalf("refusal %v is not invalid", err)
			}
			return
		}
		if got.Conn != conn || tk.mint(got) != s {
			t.Fatalf("accepted %q on %q as %+v, which this plugin did not mint", s, conn, got)
		}
	})
}
