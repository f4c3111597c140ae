package guestrun

import (
	"errors"
	"strings"
	"testing"
)

const goodPlan = `{"suite":"s","port":"tether.report","env":["A=1"],
 "steps":[{"name":"receiver/spawn","argv":["/suite/bin/x.test","-test.v=test2json"],"dir":"/suite/src/receiver/spawn","timeout_s":60}]}`

func TestDecodePlan(t *testing.T) {
	p, err := DecodePlan([]byte(goodPlan))
	if err != nil {
		t.Fatal(err)
	}
	if p.Steps[0].Timeout().Seconds() != 60 || p.Env[0] != "A=1" {
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
		"stubs (removed)": {`"suite":"s"`, `"suite":"s","stubs":[]`},
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
