package opstore

import (
	"strings"
	"testing"
)

// TestExecRequestSmall: an exec request is kept in a receipt only while
// its worst-case encoding stays within MaxExecBytes, and a receipt with a
// kept one still fits its record bound; one past the bound is not Small.
func TestExecRequestSmall(t *testing.T) {
	small := &ExecRequest{Argv: []string{"/bin/sh", "-c", "make"}, Cwd: ".", Env: map[string]string{"A": "1"}}
	if !small.Small() {
		t.Fatal("a short exec request is not Small")
	}
	worst := strings.Repeat("\x01", MaxExecBytes/6-200) // each byte escapes to \u0001
	edge := &ExecRequest{Argv: []string{worst}, Cwd: "."}
	if !edge.Small() {
		t.Fatal("an exec request just under the bound is not Small")
	}
	r := &Receipt{OpKey: "k", Outcome: Pending, Exec: edge}
	data, err := r.Marshal()
	if err != nil || len(data) > MaxExecBytes+1024 {
		t.Fatalf("receipt with a Small exec encodes to %d bytes (err %v), bound %d", len(data), err, MaxExecBytes)
	}
	if !r.Fits() {
		t.Fatal("a receipt with a Small exec does not fit")
	}
	big := &ExecRequest{Argv: []string{"/bin/sh", "-c", strings.Repeat("x", MaxExecBytes)}, Cwd: "."}
	if big.Small() {
		t.Fatal("an exec request past the bound is Small")
	}
	env := &ExecRequest{Argv: []string{"x"}, Cwd: ".", Env: map[string]string{"BIG": strings.Repeat("y", MaxExecBytes/6)}}
	if env.Small() {
		t.Fatal("an exec request whose env passes the bound is Small")
	}
}
