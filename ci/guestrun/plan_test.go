package guestrun

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const goodPlan = `{"suite":"s","port":"tether.report","env":["A=1"],
 "steps":[{"name":"receiver/spawn","argv":["/suite/bin/x.test","-test.v=test2json"],"dir":"/suite/src/receiver/spawn","timeout_s":60}],
 "stubs":[{"dir":"/suite/src/receiver/cmd/tether-receiver","binary":"/suite/bin/tether-receiver"}]}`

func TestDecodePlan(t *testing.T) {
	p, err := DecodePlan([]byte(goodPlan))
	if err != nil {
		t.Fatal(err)
	}
	if p.Steps[0].Timeout().Seconds() != 60 || p.Stubs[0].Binary != "/suite/bin/tether-receiver" {
		t.Fatalf("plan %+v", p)
	}
}

func TestDecodePlanRefuses(t *testing.T) {
	for name, edit := range map[string][2]string{
		"relative argv":   {`"/suite/bin/x.test"`, `"x.test"`},
		"unclean dir":     {`"/suite/src/receiver/spawn"`, `"/suite/src/../spawn"`},
		"no timeout":      {`"timeout_s":60`, `"timeout_s":0`},
		"port with slash": {`"tether.report"`, `"../tty"`},
		"no suite":        {`"suite":"s"`, `"suite":""`},
		"no steps":        {`"steps":[{"name":"receiver/spawn","argv":["/suite/bin/x.test","-test.v=test2json"],"dir":"/suite/src/receiver/spawn","timeout_s":60}]`, `"steps":[]`},
		"unknown field":   {`"suite":"s"`, `"suite":"s","shell":"sh"`},
		"relative stub":   {`"binary":"/suite/bin/tether-receiver"`, `"binary":"tether-receiver"`},
	} {
		data := strings.Replace(goodPlan, edit[0], edit[1], 1)
		if data == goodPlan {
			t.Fatalf("%s: edit did not apply", name)
		}
		if _, err := DecodePlan([]byte(data)); !errors.Is(err, ErrPlan) {
			t.Errorf("%s: DecodePlan = %v, want ErrPlan", name, err)
		}
	}
}

func TestGoStub(t *testing.T) {
	dir := t.TempDir()
	prebuilt := filepath.Join(dir, "prebuilt")
	if err := os.WriteFile(prebuilt, []byte("\x7fELF prebuilt"), 0o755); err != nil {
		t.Fatal(err)
	}
	plan := Plan{Stubs: []Stub{{Dir: "/src/cmd/x", Binary: prebuilt}}}
	out := filepath.Join(dir, "out")
	t.Setenv("CGO_ENABLED", "0")
	if err := GoStub([]string{"build", "-trimpath", "-o", out, "."}, plan, "/src/cmd/x"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "\x7fELF prebuilt" {
		t.Fatalf("copied %q, %v", b, err)
	}
	for name, args := range map[string][]string{
		"test":         {"test", "./..."},
		"no trimpath":  {"build", "-o", out, "."},
		"other pkg":    {"build", "-trimpath", "-o", out, "./other"},
		"extra flag":   {"build", "-trimpath", "-race", "-o", out, "."},
		"empty output": {"build", "-trimpath", "-o", "", "."},
	} {
		if err := GoStub(args, plan, "/src/cmd/x"); !errors.Is(err, ErrNoToolchain) {
			t.Errorf("%s: GoStub = %v, want ErrNoToolchain", name, err)
		}
	}
	if err := GoStub([]string{"build", "-trimpath", "-o", out, "."}, plan, "/src/cmd/y"); !errors.Is(err, ErrNoToolchain) {
		t.Errorf("unknown directory: %v, want ErrNoToolchain", err)
	}
	t.Setenv("CGO_ENABLED", "1")
	if err := GoStub([]string{"build", "-trimpath", "-o", out, "."}, plan, "/src/cmd/x"); !errors.Is(err, ErrNoToolchain) {
		t.Errorf("CGO_ENABLED=1: %v, want ErrNoToolchain", err)
	}
}
