package jail

import (
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// BenchmarkIntegrationJailStartNode measures the jail's start-up cost:
// `node -e ”` started and waited for in a jail, against the same node
// started directly, interleaved call by call in the same run so load hits
// both alike. Reported: jailed and direct ms/op and their ratio.
func BenchmarkIntegrationJailStartNode(b *testing.B) {
	testenv.Require(b, "root", "bwrap", "node")
	s := newScene(b)
	spec, err := Build(Options{Argv: []string{"node", "-e", ""}, Root: s.root, Env: os.Environ(), Helper: s.exe})
	if err != nil {
		b.Fatal(err)
	}
	var jailed, direct time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		runJailed(b, spec)
		t1 := time.Now()
		if err := exec.Command(spec.Path, spec.Argv[1:]...).Run(); err != nil {
			b.Fatal(err)
		}
		jailed += t1.Sub(t0)
		direct += time.Since(t1)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(jailed.Microseconds())/1000/n, "jailed-ms/op")
	b.ReportMetric(float64(direct.Microseconds())/1000/n, "direct-ms/op")
	b.ReportMetric(float64(jailed)/float64(direct), "jailed/direct")
}

func runJailed(b *testing.B, spec *Spec) {
	p, err := Start(spec, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	p.Stdin.Close()
	io.Copy(io.Discard, p.Stdout)
	p.Stdout.Close()
	if err := p.Wait(); err != nil {
		b.Fatal(err)
	}
}
