package receiver

import (
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
