package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
