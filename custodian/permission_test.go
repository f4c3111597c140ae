package custodian

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/audit"
)

// TestPermissionPolicies: each policy picks the option of its kind (or
// cancels when none fits), and every answer is in the audit log with the
// tool call id's digest, never its title.
func TestPermissionPolicies(t *testing.T) {
	all := []acp.PermissionOption{{OptionId: "a1", Kind: acp.PermissionOptionKindAllowOnce, Name: "once"},
		{OptionId: "a2", Kind: acp.PermissionOptionKindAllowAlways, Name: "always"},
		{OptionId: "r1", Kind: acp.PermissionOptionKindRejectOnce, Name: "no"}}
	rejectOnly := []acp.PermissionOption{{OptionId: "r1", Kind: acp.PermissionOptionKindRejectOnce, Name: "no"}}
	alwaysOnly := []acp.PermissionOption{{OptionId: "a2", Kind: acp.PermissionOptionKindAllowAlways, Name: "always"}}
	cases := []struct {
		policy  string
		options []acp.PermissionOption
		want    string
	}{
		{"", all, "reject_once"}, {PermissionReject, all, "reject_once"}, {PermissionAllowOnce, all, "allow_once"},
		{PermissionAllowAlways, all, "allow_always"}, {PermissionAllowOnce, rejectOnly, PermissionOutcomeCancelled},
		{PermissionAllowOnce, alwaysOnly, PermissionOutcomeCancelled}, {PermissionReject, alwaysOnly, PermissionOutcomeCancelled},
	}
	for _, c := range cases {
		h := newHarness(t)
		if c.policy != "" {
			h.conn.opts.Permission = PermissionPolicy(c.policy)
		}
		h.bind()
		title := "Bash: rm -rf secret-dir"
		req := acp.RequestPermissionRequest{SessionId: sid(h), Options: c.options,
			ToolCall: acp.ToolCallUpdate{ToolCallId: "tc-1", Title: &title}}
		resp, err := h.agent.conn.RequestPermission(context.Background(), req)
		must(t, err)
		if got := PermissionAnswer(req, resp); got != c.want {
			t.Fatalf("policy %q over %v: answered %s, want %s", c.policy, c.options, got, c.want)
		}
		if Granted(c.want) != strings.HasPrefix(c.want, "allow") {
			t.Fatalf("Granted(%s) = %v", c.want, Granted(c.want))
		}
		log := auditRecords(t, h)
		if strings.Contains(log, "secret-dir") {
			t.Fatal("the tool call's title reached the audit log")
		}
		found := false
		for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
			var r audit.Record
			must(t, json.Unmarshal([]byte(line), &r))
			if r.Kind == audit.KindPermission {
				found = r.Outcome == c.want && r.Digests["tool_call_id"] == sha256Hex([]byte("tc-1")) && r.TupleSHA256 == h.tuple.SHA256()
			}
		}
		if !found {
			t.Fatalf("policy %q: no permission record with outcome %s in\n%s", c.policy, c.want, log)
		}
	}
}
