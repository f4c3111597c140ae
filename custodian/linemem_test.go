package custodian

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
)

// The memory of long agent lines is measured in a custodian process (the
// test binary re-run as memHelper): its peak resident set (VmHWM in
// /proc/<pid>/status) once it answered a probe, against its VmHWM at its
// end, which it writes to a file before it exits. The difference is what
// the long lines cost, garbage the collector had not returned included.
// Under the race detector, whose shadow memory triples what any byte
// costs, the helper is this package's test binary built without it.

// memHelperBinary returns the binary to run as memHelper.
func memHelperBinary(t *testing.T) string {
	t.Helper()
	if !raceEnabled {
		return os.Args[0]
	}
	memHelperOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tether-memhelper-")
		if err != nil {
			memHelperErr = err
			return
		}
		memHelperDir = dir
		out, err := exec.Command("go", "test", "-c", "-o", filepath.Join(dir, "custodian.test"), ".").CombinedOutput()
		if err != nil {
			memHelperErr = fmt.Errorf("go test -c without -race: %w: %s", err, out)
		}
	})
	if memHelperErr != nil {
		t.Fatal(memHelperErr)
	}
	return filepath.Join(memHelperDir, "custodian.test")
}

var (
	memHelperOnce sync.Once
	memHelperDir  string // removed by TestMain
	memHelperErr  error
)

const memHelperEnv = "TETHER_CUSTODIAN_MEM_HELPER"

// memConfig is what a memory test hands the custodian process.
type memConfig struct {
	State     string `json:"state"`
	Key       string `json:"key"`
	LongLines int    `json:"long_lines"`
	HWMFile   string `json:"hwm_file"`
	// Hold keeps every long request that got through the caps, decoded,
	// until the agent's output ends (a receiver slower than the agent).
	Hold bool `json:"hold"`
}

// eofReader closes ended when r reports its end.
type eofReader struct {
	r     io.Reader
	ended chan struct{}
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		select {
		case <-e.ended:
		default:
			close(e.ended)
		}
	}
	return n, err
}

// memHelper is a custodian serving ACP on stdin/stdout with no session
// bound; at the end it writes its VmHWM to the configured file.
func memHelper() int {
	var mc memConfig
	if err := json.Unmarshal([]byte(os.Getenv(memHelperEnv+"_CONFIG")), &mc); err != nil {
		return 2
	}
	c, err := New(Options{StateDir: mc.State, AuditKey: []byte(mc.Key), LongLines: mc.LongLines})
	if err != nil {
		os.Stderr.WriteString("mem helper: " + err.Error() + "\n")
		return 3
	}
	in := &eofReader{r: os.Stdin, ended: make(chan struct{})}
	if mc.Hold {
		c.hook = func(_ context.Context, _, step string) {
			if step == "long-line-decoded" {
				<-in.ended
			}
		}
	}
	conn := c.Serve(os.Stdout, in, ConnOptions{})
	<-conn.Done()
	conn.Close()
	hwm, err := vmHWM(os.Getpid())
	if err == nil {
		err = os.WriteFile(mc.HWMFile, []byte(strconv.FormatInt(hwm, 10)), 0o600)
	}
	if cerr := c.Close(); err != nil || cerr != nil {
		return 4
	}
	return 0
}

// vmHWM returns the peak resident set of process pid, in bytes.
func vmHWM(pid int) (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmHWM", pid)
}

// memAnswer is one answer of the custodian process: id and tether code.
type memAnswer struct {
	id   int
	code errcode.Code
}

// memRun runs a custodian process under mc, writes send to it (after a
// probe it answers), and returns its answers to the requests of send and
// its VmHWM growth. Writes that fail (the custodian ended the connection)
// are not errors.
func memRun(t *testing.T, mc memConfig, send func(w io.Writer)) ([]memAnswer, int64) {
	t.Helper()
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	dir := t.TempDir()
	mc.State, mc.Key, mc.HWMFile = filepath.Join(dir, "state"), skey, filepath.Join(dir, "hwm")
	cfg, _ := json.Marshal(mc)
	cmd := exec.Command(memHelperBinary(t), "-test.run=^$")
	cmd.Env = append(os.Environ(), memHelperEnv+"=1", memHelperEnv+"_CONFIG="+string(cfg))
	cmd.Stderr = os.Stderr
	toC, err := cmd.StdinPipe()
	must(t, err)
	fromC, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	answers := make(chan memAnswer, 64)
	go readAnswers(fromC, answers)
	_, err = io.WriteString(toC, `{"jsonrpc":"2.0","id":0,"method":"x/probe"}`+"\n")
	must(t, err)
	select {
	case a := <-answers:
		if a.id != 0 {
			t.Fatalf("probe answered as %d", a.id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the custodian process never answered the probe")
	}
	base, err := vmHWM(cmd.Process.Pid)
	must(t, err)
	send(toC)
	toC.Close()
	var got []memAnswer
	for a := range answers {
		got = append(got, a)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("custodian process: %v", err)
	}
	data, err := os.ReadFile(mc.HWMFile)
	must(t, err)
	end, err := strconv.ParseInt(string(data), 10, 64)
	must(t, err)
	return got, end - base
}

// readAnswers sends each answer on stdout to answers, then closes it.
func readAnswers(r io.Reader, answers chan<- memAnswer) {
	defer close(answers)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var resp struct {
			ID    int             `json:"id"`
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(sc.Bytes(), &resp) != nil {
			continue
		}
		a := memAnswer{id: resp.ID}
		var re acp.RequestError
		if len(resp.Error) > 0 && json.Unmarshal(resp.Error, &re) == nil {
			a.code, _ = acperr.CodeOf(&re)
		}
		answers <- a
	}
}

// longWrite writes one fs/write_text_file request of size bytes of
// content, its id after the content, without holding it.
func longWrite(w io.Writer, id, size int) {
	_, _ = io.Copy(w, longMessage("fs/write_text_file", id, size))
}

// TestAttackLongLine420MiBCostsUnder64MiB: one 420 MiB line costs the
// custodian process less than 64 MiB of resident memory to refuse, and it
// is refused too_large. Positive control: with the caps off the same line
// costs more than 64 MiB (it is held while read, then ends the
// connection).
func TestAttackLongLine420MiBCostsUnder64MiB(t *testing.T) {
	const bound = 64 << 20
	send := func(w io.Writer) { longWrite(w, 7, 420<<20) }
	got, growth := memRun(t, memConfig{}, send)
	t.Logf("caps on: VmHWM grew %d MiB", growth>>20)
	if len(got) != 1 || got[0] != (memAnswer{7, errcode.CodeTooLarge}) {
		t.Fatalf("answers %v, want id 7 too_large", got)
	}
	if growth >= bound {
		t.Fatalf("VmHWM grew %d MiB refusing a 420 MiB line, want under 64", growth>>20)
	}
	_, growth = memRun(t, memConfig{LongLines: -1}, send)
	t.Logf("caps off: VmHWM grew %d MiB", growth>>20)
	if growth < bound {
		t.Fatalf("positive control: caps off, VmHWM grew only %d MiB", growth>>20)
	}
}

// TestAttackConcurrentLongWritesAreBounded: n 60 MiB writes the custodian
// cannot finish quickly (each held once decoded until the agent's output
// ends) cost the process less than LongLineBytes and 64 MiB more, the
// writes past the caps answered busy and the others served (not_admitted:
// no session is bound). Positive control: with the caps off every write is
// held and the growth passes that bound. n is 24 with TETHER_BENCH_FULL=1,
// else 6.
func TestAttackConcurrentLongWritesAreBounded(t *testing.T) {
	n := 6
	if os.Getenv("TETHER_BENCH_FULL") == "1" {
		n = 24
	}
	bound := int64(DefaultLongLineBytes + 64<<20)
	send := func(w io.Writer) {
		for i := range n {
			longWrite(w, i+1, 60<<20)
		}
	}
	got, growth := memRun(t, memConfig{Hold: true}, send)
	t.Logf("caps on, %d writes of 60 MiB: VmHWM grew %d MiB", n, growth>>20)
	codes := map[errcode.Code]int{}
	for _, a := range got {
		codes[a.code]++
	}
	if len(got) != n || codes[errcode.CodeBusy] == 0 || codes[errcode.CodeNotAdmitted] == 0 || codes[errcode.CodeBusy]+codes[errcode.CodeNotAdmitted] != n {
		t.Fatalf("answers by code %v, want %d busy or not_admitted, both", codes, n)
	}
	if growth >= bound {
		t.Fatalf("VmHWM grew %d MiB, want under %d", growth>>20, bound>>20)
	}
	got, growth = memRun(t, memConfig{Hold: true, LongLines: -1}, send)
	t.Logf("caps off, %d writes of 60 MiB: VmHWM grew %d MiB", n, growth>>20)
	if len(got) != n || growth < bound {
		t.Fatalf("positive control: caps off, %d answers, VmHWM grew only %d MiB", len(got), growth>>20)
	}
}
