package receiver

import (
	"bytes"
	"os"
	"testing"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
)

// BenchmarkHandlerExec is exec_start + exec_wait of /bin/true through the
// Handler alone (no wire, no socket): the cost the daemon adds to a spawn.
func BenchmarkHandlerExec(b *testing.B) {
	testenv.Require(b, "root")
	f := newFixture(b, Options{})
	for b.Loop() {
		res, err := f.call(f.grant, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}})
		if err != nil {
			b.Fatal(err)
		}
		id := res.(*wire.ExecStartResult).TerminalID
		if _, err := f.call(f.grant, wire.OpExecWait, wire.TerminalArgs{TerminalID: id}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		f.call(f.grant, wire.OpExecRelease, wire.TerminalArgs{TerminalID: id})
		b.StartTimer()
	}
}

// BenchmarkRead4KiB is a 4 KiB read through a wire server and client on a
// socketpair (no TLS): the receiver's read path, from frame to frame. Run
// with -cpuprofile to see where a read's time goes (docs/performance.md).
func BenchmarkRead4KiB(b *testing.B) {
	testenv.Require(b, "root")
	f := newFixture(b, Options{})
	c := newConns(f)
	cl := c.open()
	writeFileB(b, f.grant.Tuple.Root+"/4k.txt", 4096)
	var res wire.ReadResult
	for b.Loop() {
		if err := c.call(cl, wire.OpRead, wire.ReadArgs{Path: "4k.txt"}, &res); err != nil {
			b.Fatal(err)
		}
	}
}

func writeFileB(b *testing.B, path string, n int) {
	b.Helper()
	if err := os.WriteFile(path, bytes.Repeat([]byte("x"), n), 0o644); err != nil {
		b.Fatal(err)
	}
}
