package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/coordinator/baotest"
	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/fixtures/testenv"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"tether-admission": func() {
			os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
		},
	})
}

// TestScripts runs testdata/script/*.txtar. Scripts are named
// category-first (admission_inspect_symlink.txtar).
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup: func(env *testscript.Env) error {
			testenv.ScriptSetup(env)
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"require":      testenv.ScriptRequire,
			"sign-payload": cmdSignPayload,
			"tamper":       cmdTamper,
			"pad":          cmdPad,
			"openbao-fake": cmdOpenBaoFake,
		},
	})
}

// sign-payload KEY PAYLOAD OUT signs an arbitrary payload as an admission
// envelope, bypassing the publisher's validation (as a buggy writer or a
// stolen key would), and writes OUT with mode 0644.
func cmdSignPayload(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: sign-payload KEY PAYLOAD OUT")
	}
	k, err := signing.LoadPrivateKey(ts.MkAbs(args[0]))
	ts.Check(err)
	env, err := signing.Sign(context.Background(), admission.PayloadType, []byte(ts.ReadFile(args[1])), k)
	ts.Check(err)
	ts.Check(os.WriteFile(ts.MkAbs(args[2]), env, 0o644))
	ts.Check(os.Chmod(ts.MkAbs(args[2]), 0o644))
}

// tamper FILE OLD NEW replaces OLD with NEW inside the signed payload of
// FILE, keeping the signature: the envelope stays well-formed, only the
// signature no longer matches.
func cmdTamper(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: tamper FILE OLD NEW")
	}
	var env map[string]any
	ts.Check(json.Unmarshal([]byte(ts.ReadFile(args[0])), &env))
	p, ok := env["payload"].(string)
	if !ok {
		ts.Fatalf("tamper: %s has no payload", args[0])
	}
	payload, err := base64.StdEncoding.DecodeString(p)
	ts.Check(err)
	if !bytes.Contains(payload, []byte(args[1])) {
		ts.Fatalf("tamper: %q not in the payload", args[1])
	}
	payload = bytes.Replace(payload, []byte(args[1]), []byte(args[2]), 1)
	env["payload"] = base64.StdEncoding.EncodeToString(payload)
	out, err := json.Marshal(env)
	ts.Check(err)
	ts.Check(os.WriteFile(ts.MkAbs(args[0]), out, 0o644))
}

// pad FILE N appends N bytes of trailing whitespace: the envelope stays
// valid JSON with a valid signature, only its size changes.
func cmdPad(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: pad FILE N")
	}
	n, err := strconv.Atoi(args[1])
	ts.Check(err)
	f, err := os.OpenFile(ts.MkAbs(args[0]), os.O_WRONLY|os.O_APPEND, 0)
	ts.Check(err)
	_, err = f.Write(bytes.Repeat([]byte(" "), n))
	ts.Check(err)
	ts.Check(f.Close())
}

// scriptReporter collects unexpected requests seen by the fake OpenBao;
// "openbao-fake verify" fails the script if there were any.
type scriptReporter struct {
	mu   sync.Mutex
	errs []string
}

func (r *scriptReporter) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

type fakeState struct {
	srv *baotest.Server
	rep *scriptReporter
}

var fakes sync.Map // *testscript.TestScript -> *fakeState

// openbao-fake start MODE TOKEN TTL TEMPLATE OUT: start a TLS stand-in for
// OpenBao that accepts only the MODE renewal ("token" or "lease", lease
// id "tether/lease/1") with TOKEN and increment 3600, granting TTL seconds;
// write its CA to openbao-ca.pem and TEMPLATE to OUT with @BAO_URL@
// replaced by its address.
// openbao-fake fail STATUS: answer every renewal with STATUS from now on.
// openbao-fake verify N: exactly N requests, none unexpected.
func cmdOpenBaoFake(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) == 0 {
		ts.Fatalf("usage: openbao-fake start|fail|verify ...")
	}
	if args[0] == "start" {
		startFake(ts, args[1:])
		return
	}
	v, ok := fakes.Load(ts)
	if !ok {
		ts.Fatalf("openbao-fake: not started")
	}
	st := v.(*fakeState)
	switch {
	case args[0] == "fail" && len(args) == 2:
		code, err := strconv.Atoi(args[1])
		ts.Check(err)
		st.srv.Fail(code, "permission denied")
	case args[0] == "verify" && len(args) == 2:
		want, err := strconv.Atoi(args[1])
		ts.Check(err)
		st.rep.mu.Lock()
		errs := st.rep.errs
		st.rep.mu.Unlock()
		if len(errs) != 0 {
			ts.Fatalf("openbao-fake: unexpected requests: %s", strings.Join(errs, "; "))
		}
		if got := st.srv.Calls(); got != want {
			ts.Fatalf("openbao-fake: %d requests, want %d", got, want)
		}
	default:
		ts.Fatalf("usage: openbao-fake start|fail|verify ...")
	}
}

func startFake(ts *testscript.TestScript, args []string) {
	if len(args) != 5 {
		ts.Fatalf("usage: openbao-fake start MODE TOKEN TTL TEMPLATE OUT")
	}
	ttl, err := strconv.Atoi(args[2])
	ts.Check(err)
	e := baotest.Expect{Mode: args[0], Token: args[1], Increment: 3600}
	if e.Mode == "lease" {
		e.LeaseID = "tether/lease/1"
	}
	rep := &scriptReporter{}
	srv, err := baotest.NewServer(rep, e, ttl)
	ts.Check(err)
	ts.Defer(func() { srv.Close(); fakes.Delete(ts) })
	fakes.Store(ts, &fakeState{srv: srv, rep: rep})
	_, err = srv.WriteCACert(ts.MkAbs("."))
	ts.Check(err)
	cfg := strings.ReplaceAll(ts.ReadFile(args[3]), "@BAO_URL@", srv.URL)
	ts.Check(os.WriteFile(ts.MkAbs(args[4]), []byte(cfg), 0o644))
}
