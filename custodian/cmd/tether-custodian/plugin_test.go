package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/custodian/opstore"
)

// TestIntegrationRunWithPlugin runs `tether-custodian run` with the
// reference host agent (fixtures/cmd/tether-hostagent) loading the real
// tether-plugin, against a real receiver: the ACP contract between plugin
// and custodian (bind, attach during session/new, op tags, the expect
// precondition of edit_text_file) holds end to end.
func TestIntegrationRunWithPlugin(t *testing.T) {
	rr := realrecv.Start(t)
	plugin := realrecv.BuildBinary(t, "github.com/tetherdev/tether/plugin/cmd/tether-plugin", "tether-plugin")
	agent := realrecv.BuildBinary(t, "github.com/tetherdev/tether/fixtures/cmd/tether-hostagent", "tether-hostagent")
	dir := t.TempDir()
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	realrecv.Must(t, err)
	realrecv.Must(t, os.WriteFile(filepath.Join(dir, "audit.key"), []byte(skey), 0o600))
	cfg := map[string]any{"tuple": rr.Tuple, "lease_not_after": time.Now().Add(time.Hour).UTC(), "principal": rr.Tuple.Owner,
		"receiver": map[string]any{"kind": "unix", "path": rr.Sock, "host_only": true}, "state_dir": "state", "audit_key_file": "audit.key"}
	data, _ := json.Marshal(cfg)
	realrecv.Must(t, os.WriteFile(filepath.Join(dir, "c.json"), data, 0o600))
	file := rr.Tuple.Root + "/plugin.txt"
	prompts := []string{
		fmt.Sprintf(`write_text_file {"path":%q,"content":"hello\n"}`, file),
		fmt.Sprintf(`read_text_file {"path":%q}`, file),
		`run_command {"command":"id","args":["-u"]}`,
		fmt.Sprintf(`edit_text_file {"path":%q,"old_text":"hello","new_text":"bye"}`, file),
	}
	args := []string{"run", "--no-jail", "--config", filepath.Join(dir, "c.json")}
	for _, p := range prompts {
		args = append(args, "--prompt", p)
	}
	args = append(args, "--", agent, "--plugin", plugin, "--principal", rr.Tuple.Owner)
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), args, nil, &stdout, &stderr); code != exitOK {
		t.Fatalf("run exit %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	if n := strings.Count(stdout.String(), `"status":"completed"`); n != len(prompts) {
		t.Fatalf("%d tool calls completed, want %d:\n%s", n, len(prompts), &stdout)
	}
	if uid, _ := realrecv.GrantIDs(); !strings.Contains(stdout.String(), fmt.Sprintf(`%d\\n`, uid)) {
		t.Fatalf("run_command did not run as the grant's uid:\n%s", &stdout)
	}
	if got, _ := os.ReadFile(rr.File("plugin.txt")); string(got) != "bye\n" {
		t.Fatalf("file = %q, want the edited content", got)
	}
	rs, err := opstore.ReadOnly(filepath.Join(dir, "state", custodian.OpKeysDir))
	realrecv.Must(t, err)
	outcomes := map[string]int{}
	for _, r := range rs {
		outcomes[r.Method+" "+string(r.Outcome)]++
	}
	if outcomes["fs/write_text_file verified"] != 2 || outcomes["terminal/create needs_review"] != 1 {
		t.Fatalf("receipts %v: want two verified writes (write, edit) and a needs_review exec", outcomes)
	}
}

// TestIntegrationRunWithPluginRetries is the black-box sequence
// through the shipped binaries (`tether-custodian run`, the reference
// host agent, the real tether-plugin, a real receiver): a write, a read,
// an edit and `run_command` of a command that appends a line and prints
// out-1, each with the caller's op_key, then the same four prompts again
// in the same session. Each retry's tool result equals the first's, byte
// for byte (the command's output from its receipt, its terminal
// released), the command ran once and the edit applied once.
func TestIntegrationRunWithPluginRetries(t *testing.T) {
	rr := realrecv.Start(t)
	plugin := realrecv.BuildBinary(t, "github.com/tetherdev/tether/plugin/cmd/tether-plugin", "tether-plugin")
	agent := realrecv.BuildBinary(t, "github.com/tetherdev/tether/fixtures/cmd/tether-hostagent", "tether-hostagent")
	dir := nodeRunDir(t, rr, "1m")
	notes := rr.Tuple.Root + "/notes.txt"
	once := []string{
		fmt.Sprintf(`write_text_file {"path":%q,"content":"alpha\nbeta\n","op_key":"w1"}`, notes),
		fmt.Sprintf(`read_text_file {"path":%q,"op_key":"r1"}`, notes),
		fmt.Sprintf(`edit_text_file {"path":%q,"old_text":"beta","new_text":"gamma","op_key":"e1"}`, notes),
		`run_command {"command":"/bin/sh","args":["-c","echo x >> side.txt; echo out-1"],"op_key":"k1"}`,
	}
	args := []string{"run", "--no-jail", "--config", filepath.Join(dir, "c.json")}
	for _, p := range append(slices.Clone(once), once...) {
		args = append(args, "--prompt", p)
	}
	args = append(args, "--", agent, "--plugin", plugin, "--principal", rr.Tuple.Owner)
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), args, nil, &stdout, &stderr); code != exitOK {
		t.Fatalf("run exit %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	results := completedToolOutputs(t, stdout.Bytes())
	if len(results) != 2*len(once) {
		t.Fatalf("%d tool calls completed, want %d:\n%s", len(results), 2*len(once), &stdout)
	}
	for i := range once {
		if results[i] != results[len(once)+i] {
			t.Fatalf("%s\nfirst answered  %s\nretry answered  %s", once[i], results[i], results[len(once)+i])
		}
	}
	if !strings.Contains(results[3], `"output":"out-1\n"`) {
		t.Fatalf("run_command answered %s", results[3])
	}
	for name, want := range map[string]string{"side.txt": "x\n", "notes.txt": "alpha\ngamma\n"} {
		if got, err := os.ReadFile(rr.File(name)); err != nil || string(got) != want {
			t.Fatalf("%s = %q (%v), want %q: a retry ran again", name, got, err, want)
		}
	}
}

// completedToolOutputs returns the rawOutput of every tool call update run
// printed with status completed, in order, as printed.
func completedToolOutputs(t *testing.T, stdout []byte) []string {
	t.Helper()
	var out []string
	for _, line := range bytes.Split(stdout, []byte("\n")) {
		var n struct {
			Update struct {
				SessionUpdate string          `json:"sessionUpdate"`
				Status        string          `json:"status"`
				RawOutput     json.RawMessage `json:"rawOutput"`
			} `json:"update"`
		}
		if json.Unmarshal(line, &n) != nil || n.Update.SessionUpdate != "tool_call_update" || n.Update.Status != "completed" {
			continue
		}
		out = append(out, string(n.Update.RawOutput))
	}
	return out
}
