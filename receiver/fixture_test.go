package receiver

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/admission/signedfile"
	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/fixtures/testids"
	"github.com/tetherdev/tether/receiver/caps"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/wire"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == spawn.HelperArg {
		spawn.HelperMain()
	}
	ids := testids.Must(3)
	gUID, gGID, gGroup = ids[0], ids[1], ids[2]
	os.Exit(m.Run())
}

// clock is a settable test clock shared by the loader and the handler.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// fixture is a handler over a real admission file: a Publisher writes
// signed snapshots, a Refresher reads them at request time.
type fixture struct {
	t     testing.TB
	h     *Handler
	pub   *signedfile.Publisher
	clk   *clock
	base  string
	seq   atomic.Int64
	grant admission.Grant // the main grant, published by newFixture
}

// The grant's ids are this test process's own (fixtures/testids), set by
// TestMain: tests count, wait for and kill every process of gUID, which
// another test binary running at the same time must never add to or lose.
var gUID, gGID, gGroup uint32

var allOps = []admission.Op{admission.OpRead, admission.OpWrite, admission.OpList, admission.OpExec, admission.OpKill}

func newFixture(t testing.TB, opts Options) *fixture {
	t.Helper()
	waitNoUID(t, gUID) // orphans of earlier tests are reaped asynchronously
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} { // t.TempDir makes both 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	adm := filepath.Join(base, "admission")
	if err := os.Mkdir(adm, 0o755); err != nil {
		t.Fatal(err)
	}
	key, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, base: base, clk: &clock{}}
	f.clk.ns.Store(time.Now().UnixNano())
	if f.pub, err = signedfile.NewPublisher(signedfile.PublisherConfig{Dir: adm, Key: key, Now: f.clk.Now}); err != nil {
		t.Fatal(err)
	}
	owner := uint32(os.Geteuid())
	l, err := signedfile.NewLoader(signedfile.LoaderConfig{Path: filepath.Join(adm, admission.FileName),
		PublicKey: key.Public(), OwnerUID: &owner, Now: f.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	r, err := signedfile.NewRefresher(context.Background(), l, signedfile.RefresherOptions{NoWatch: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	opts.Grants, opts.Now = r, f.clk.Now
	if f.h, err = NewHandler(opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.h.Close() })
	f.grant = f.newGrant("main", allOps...)
	f.publish(f.grant)
	return f
}

// newGrant makes a root directory owned by the grant uid and a grant for it.
func (f *fixture) newGrant(name string, ops ...admission.Op) admission.Grant {
	root := filepath.Join(f.base, "roots", name)
	if err := os.MkdirAll(root, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Chown(root, int(gUID), int(gGID)); err != nil {
		f.t.Fatal(err)
	}
	return admission.Grant{
		Tuple: admission.Tuple{Owner: "o", Allocation: "a-" + name, Session: "s", Workspace: "w",
			Sandbox: "sb", Generation: 1, Executor: "e", Site: "site", Root: root},
		UID: gUID, GID: gGID, Groups: []uint32{gGroup}, Ops: ops,
		Limits:   admission.Limits{MaxProcs: 8, MaxRuntimeS: 600, MaxOutputBytes: 32 << 10, MaxFileBytes: 1 << 20},
		NotAfter: f.clk.Now().Add(time.Hour),
	}
}

// publish replaces the snapshot with exactly these grants.
func (f *fixture) publish(gs ...admission.Grant) {
	f.t.Helper()
	na := f.clk.Now().Add(2 * time.Hour)
	if _, err := f.pub.Publish(context.Background(), admission.PublishInput{NotAfter: na, Grants: gs}); err != nil {
		f.t.Fatal(err)
	}
}

// call sends one request for grant g straight to the handler.
func (f *fixture) call(g admission.Grant, op wire.Op, args any) (any, error) {
	return f.callCtx(context.Background(), g.Tuple.SHA256(), op, args, f.clk.Now().Add(30*time.Second))
}

func (f *fixture) callCtx(ctx context.Context, digest string, op wire.Op, args any, deadline time.Time) (any, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		f.t.Fatal(err)
	}
	n := f.seq.Add(1) // one value for both: concurrent calls must never share an op key
	req := &wire.Request{ID: uint64(n), Op: op, TupleSHA256: digest,
		OpKey: "k-" + strconv.FormatInt(n, 10), Deadline: deadline, Args: raw}
	return f.h.Serve(ctx, req)
}

// code returns the wire code of err ("" for nil).
func code(err error) errcode.Code {
	if err == nil {
		return ""
	}
	if we, ok := err.(*errcode.Error); ok {
		return we.Code
	}
	return "not-a-wire-error: " + errcode.Code(fmt.Sprint(err))
}

// procsOfUID lists processes whose real uid is u.
func procsOfUID(t testing.TB, u uint32) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := caps.ReadStatus(fmt.Sprintf("/proc/%d/status", pid)); err == nil && st.UID[0] == u {
			out = append(out, pid)
		}
	}
	return out
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// waitNoUID waits until no process of uid u is left from earlier tests.
func waitNoUID(t testing.TB, u uint32) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for len(procsOfUID(t, u)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("processes %v of uid %d left by earlier tests", procsOfUID(t, u), u)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
