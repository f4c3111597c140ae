package vm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// BenchmarkVMSvcExec is the exec of /bin/true through the custodian's
// configuration (exec_start, exec_wait, exec_output on one open wire
// connection; the release is not timed) in a VM computer under TCG (192
// MiB, the guest image) against the same in a namespaced computer, both
// made by one service, interleaved in the same run. It reports each p50
// and their ratio, and the host memory the VM computer takes: its QEMU
// cgroup's memory.usage_in_bytes (QEMU's resident memory and the page
// cache charged to it) just after its first command, and that and the
// rss of memory.stat after vmIdle with nothing running (after the timed
// execs).
func BenchmarkVMSvcExec(b *testing.B) {
	testenv.Require(b, "root", "qemu", "guestimage", "cgroup-limits", "loop")
	h := newSvcHarness(b, svcGuestImage)
	ctx := context.Background()
	vmc := h.create(b, ctx, api.Limits{})
	ns, err := h.s.Create(ctx, h.caller, api.CreateRequest{Tier: api.TierNamespaced})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.s.Delete(context.Background(), h.caller, ns.ID) })
	vmExec, nsExec := newTimedExec(b, ctx, vmc.c), newTimedExec(b, ctx, ns)
	vmExec.run(b, ctx) // the first command of each is not timed
	nsExec.run(b, ctx)
	cg := vmc.m.cg.dir("memory")
	first := hostCgroupValue(b, cg, "memory.usage_in_bytes")
	var tv, tn []time.Duration
	b.ResetTimer()
	for range b.N {
		tv = append(tv, vmExec.run(b, ctx))
		tn = append(tn, nsExec.run(b, ctx))
	}
	b.StopTimer()
	time.Sleep(vmIdle) // the idle period is the measurement, not a wait for a condition
	idle, rss := hostCgroupValue(b, cg, "memory.usage_in_bytes"), benchMemoryStat(b, cg, "rss")
	pv, pn := p50(tv), p50(tn)
	b.ReportMetric(float64(pv.Microseconds())/1000, "vm-p50-ms")
	b.ReportMetric(float64(pn.Microseconds())/1000, "ns-p50-ms")
	b.ReportMetric(float64(pv)/float64(pn), "vm/ns-p50")
	b.ReportMetric(float64(first)/(1<<20), "first-cmd-MiB")
	b.ReportMetric(float64(idle)/(1<<20), "idle-MiB")
	b.ReportMetric(float64(rss)/(1<<20), "idle-rss-MiB")
}

// vmIdle is how long BenchmarkVMSvcExec leaves the VM computer idle
// before it reads its memory again.
const vmIdle = 5 * time.Second

// timedExec runs /bin/true in one computer over one wire connection,
// made from the custodian configuration the service handed out.
type timedExec struct {
	wc *wireclient.Client
	tu admission.Tuple
	n  int
}

func newTimedExec(b *testing.B, ctx context.Context, c api.Computer) *timedExec {
	b.Helper()
	cfg, err := custodian.LoadConfig(c.CustodianConfig)
	if err != nil {
		b.Fatal(err)
	}
	wc, err := provision.WireClient(ctx, custodianDialer{cfg})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { wc.Close() })
	return &timedExec{wc: wc, tu: *c.Tuple}
}

// run times one /bin/true; it fails b unless the command exits 0 with
// no output.
func (e *timedExec) run(b *testing.B, ctx context.Context) time.Duration {
	b.Helper()
	e.n++
	digest, dl := e.tu.SHA256(), time.Now().Add(time.Minute)
	key := fmt.Sprintf("bench-%d", e.n)
	call := func(op wire.Op, suffix string, args, res any) {
		if err := e.wc.Call(ctx, op, digest, key+suffix, dl, args, res); err != nil {
			b.Fatalf("%s: %v", op, err)
		}
	}
	start := time.Now()
	var st wire.ExecStartResult
	call(wire.OpExecStart, "", wire.ExecStartArgs{Argv: []string{"/bin/true"}, Env: map[string]string{"PATH": "/usr/bin:/bin"}}, &st)
	var w wire.ExecWaitResult
	call(wire.OpExecWait, "-wait", wire.TerminalArgs{TerminalID: st.TerminalID}, &w)
	var o wire.ExecOutputResult
	call(wire.OpExecOutput, "-output", wire.TerminalArgs{TerminalID: st.TerminalID}, &o)
	took := time.Since(start)
	var none wire.Empty
	call(wire.OpExecRelease, "-release", wire.TerminalArgs{TerminalID: st.TerminalID}, &none)
	if w.Exit.ExitCode == nil || *w.Exit.ExitCode != 0 || o.Output != "" {
		b.Fatalf("/bin/true: exit %+v, output %q", w.Exit, o.Output)
	}
	return took
}

// benchMemoryStat is one field of the cgroup's memory.stat.
func benchMemoryStat(b *testing.B, dir, field string) int64 {
	b.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field+" "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("memory.stat has no %s", field)
	return 0
}
