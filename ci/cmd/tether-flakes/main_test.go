package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestFlags: the defaults are the hunt's (-count 20, -race, ./...), and
// bad values are refused with the usage exit code.
func TestFlags(t *testing.T) {
	var stderr bytes.Buffer
	o, _, _, err := parse(nil, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.Count != 20 || o.Rounds != 1 || !o.Race || o.Out != ".cache/flakes" || len(o.Packages) != 0 || o.VMRuns != 0 {
		t.Fatalf("defaults %+v", o)
	}
	o, _, _, err = parse([]string{"-count", "3", "-race=false", "-vm", "2", "-vm-args", "--suite native-client --accel tcg", "./receiver/..."}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.Count != 3 || o.Race || o.VMRuns != 2 || strings.Join(o.VMArgs, " ") != "--suite native-client --accel tcg" ||
		strings.Join(o.Packages, " ") != "./receiver/..." {
		t.Fatalf("parsed %+v", o)
	}
	o, _, _, err = parse([]string{"-hog", "2", "-cgo=0", "-race=false", "./custodian/jail"}, &stderr)
	if err != nil || o.Hog != 2 || o.Cgo != "0" || o.Race {
		t.Fatalf("-hog 2 -cgo=0 -race=false: %+v %v", o, err)
	}
	for _, bad := range [][]string{{"-cgo=0"}, {"-hog", "-1"}, {"-cgo", "yes", "-race=false"}, {"-count", "0"}, {"-rounds", "-1"}, {"-vm", "-2"}, {"-rounds", "0"}, {"-nosuch"}, {"-timeout", "-1s"}, {"-sum", "x", "-goal", "0"}} {
		var out bytes.Buffer
		if code := run(context.Background(), bad, &out, &out); code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s", bad, code, exitUsage, out.String())
		}
	}
}
