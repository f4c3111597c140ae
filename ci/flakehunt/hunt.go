package flakehunt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// ErrOptions is wrapped by every refused option.
var ErrOptions = errors.New("flakehunt: bad options")

// Options configure a hunt.
type Options struct {
	Dir      string        // module root: go test and ci/vm-receipts run here
	Out      string        // report, raw test2json and VM receipts go here
	Packages []string      // go test patterns; empty means ./...
	Count    int           // -count of each round (every test runs Count times per round)
	Rounds   int           // how many separate go test invocations (fresh processes); 0 runs only the VM suites
	Race     bool          // -race
	Run      string        // -run, if set
	Parallel int           // -p, if > 0
	Shuffle  string        // -shuffle, if set ("on" or a seed)
	Timeout  time.Duration // -timeout of each round; 0 means 30m per run of a test binary
	VMRuns   int           // runs of ci/vm-receipts after the rounds
	VMArgs   []string      // arguments for ci/vm-receipts (e.g. --suite native-client --accel tcg)
	Inputs   []string      // go test -json files of earlier runs (e.g. make test's .cache/test.json) to count too
	Hog      int           // busy loops run beside the go test rounds and VM runs (hog.go); 0 runs none
	Cgo      string        // CGO_ENABLED of the go test rounds, "0" or "1"; "" leaves the environment's
	Ledger   string        // if set, a directory inside Dir where the report is filed (ledger.go)
	Log      io.Writer     // progress; nil discards it
}

func (o *Options) check() error {
	switch {
	case o.Dir == "" || o.Out == "":
		return fmt.Errorf("%w: Dir and Out are required", ErrOptions)
	case o.Count < 1 || o.Rounds < 0 || o.VMRuns < 0 || o.Timeout < 0:
		return fmt.Errorf("%w: -count %d must be at least 1; -rounds %d, -vm %d and -timeout %s not negative",
			ErrOptions, o.Count, o.Rounds, o.VMRuns, o.Timeout)
	case o.Rounds == 0 && o.VMRuns == 0 && len(o.Inputs) == 0:
		return fmt.Errorf("%w: -rounds 0 and -vm 0: nothing to run", ErrOptions)
	case o.Hog < 0 || o.Hog > 0 && o.Rounds == 0 && o.VMRuns == 0:
		return fmt.Errorf("%w: -hog %d: busy loops need go test rounds or VM runs to run beside", ErrOptions, o.Hog)
	case o.Cgo != "" && o.Cgo != "0" && o.Cgo != "1":
		return fmt.Errorf("%w: -cgo %q: want 0 or 1", ErrOptions, o.Cgo)
	case o.Cgo != "" && o.Rounds == 0:
		return fmt.Errorf("%w: -cgo %s applies to go test rounds, and -rounds is 0", ErrOptions, o.Cgo)
	case o.Cgo == "0" && o.Race:
		return fmt.Errorf("%w: -race requires cgo: pass -race=false with -cgo=0", ErrOptions)
	}
	if len(o.Packages) == 0 {
		o.Packages = []string{"./..."}
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Minute * time.Duration(o.Count)
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return nil
}

// goTestArgs is the go test command line of one round.
func (o *Options) goTestArgs() []string {
	args := []string{"test", "-json", "-count=" + strconv.Itoa(o.Count), "-timeout=" + o.Timeout.String()}
	if o.Race {
		args = append(args, "-race")
	}
	if o.Run != "" {
		args = append(args, "-run="+o.Run)
	}
	if o.Parallel > 0 {
		args = append(args, "-p="+strconv.Itoa(o.Parallel))
	}
	if o.Shuffle != "" {
		args = append(args, "-shuffle="+o.Shuffle)
	}
	return append(args, o.Packages...)
}

// Run runs the hunt: Rounds invocations of go test, then VMRuns runs of
// ci/vm-receipts, and writes the report (also after a round that could
// not run at all, so the evidence so far is kept). With Ledger set, a
// hunt that ran whole (no error, not interrupted) is then filed in the
// ledger, failures or not. The returned error is about the hunt itself;
// failed tests are in the report (Clean).
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.Ledger != "" {
		if err := CheckFileable(ctx, o.Dir, o.Ledger); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	r := &Report{Started: time.Now().UTC(), Config: o.config(ctx)}
	ty := NewTally()
	var errs []error
	for _, in := range o.Inputs {
		errs = append(errs, readFile(in, ty))
	}
	if o.Hog > 0 {
		fmt.Fprintf(o.Log, "flakes: %d busy loops beside the hunt (-hog)\n", o.Hog)
	}
	stopHog := startHog(o.Hog)
	for i := 1; i <= o.Rounds && ctx.Err() == nil; i++ {
		fmt.Fprintf(o.Log, "flakes: round %d of %d: go %s\n", i, o.Rounds, strings.Join(o.goTestArgs(), " "))
		errs = append(errs, o.round(ctx, i, ty))
	}
	for i := 1; i <= o.VMRuns && ctx.Err() == nil; i++ {
		fmt.Fprintf(o.Log, "flakes: VM run %d of %d: ci/vm-receipts %s\n", i, o.VMRuns, strings.Join(o.VMArgs, " "))
		v, err := o.vmRun(ctx, i, ty)
		r.VM = append(r.VM, v)
		errs = append(errs, err)
	}
	stopHog()
	r.Ended = time.Now().UTC()
	r.build(ty)
	errs = append(errs, ctx.Err(), r.Write(o.Out))
	if err := errors.Join(errs...); err != nil || o.Ledger == "" {
		return r, err
	}
	path, err := File(ctx, o.Dir, o.Ledger, r)
	if err == nil {
		fmt.Fprintf(o.Log, "flakes: filed in the ledger as %s (commit it)\n", path)
	}
	return r, err
}

// round runs go test once, keeping its raw output in round-N.json. A
// non-zero exit is what failed tests cause, so it is not an error; a go
// command that could not start is.
func (o *Options) round(ctx context.Context, n int, ty *Tally) error {
	raw, err := os.Create(filepath.Join(o.Out, fmt.Sprintf("round-%d.json", n)))
	if err != nil {
		return err
	}
	defer raw.Close()
	cmd := exec.CommandContext(ctx, "go", o.goTestArgs()...)
	cmd.Dir, cmd.Stderr = o.Dir, raw
	if o.Cgo != "" {
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+o.Cgo)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("round %d: start go test: %w", n, err)
	}
	rerr := ty.Read(stdout, raw)
	err = cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) && ctx.Err() == nil {
		err = nil
	}
	return errors.Join(rerr, err)
}

// readFile counts the events of a go test -json file.
func readFile(path string, ty *Tally) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return ty.Read(f, nil)
}

// config records what the hunt runs and on which commit; a git that fails
// leaves GitHead empty, which -ledger then refuses.
func (o *Options) config(ctx context.Context) Config {
	c := Config{GoTest: append([]string{"go"}, o.goTestArgs()...), Count: o.Count, Rounds: o.Rounds, Race: o.Race,
		UID: os.Geteuid(), Require: os.Getenv("TETHER_TEST_REQUIRE"), VMRuns: o.VMRuns, VMArgs: o.VMArgs,
		NumCPU: runtime.NumCPU(), Packages: o.Packages, Inputs: o.Inputs, Hog: o.Hog, CgoEnabled: o.cgoEnabled(ctx)}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		c.LoadAvg = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	c.GitHead, _ = git(ctx, o.Dir, "rev-parse", "HEAD")
	status, _ := git(ctx, o.Dir, "status", "--porcelain", "--untracked-files=no")
	c.Dirty = status != ""
	return c
}

// cgoEnabled is the CGO_ENABLED the go test rounds build with: -cgo's,
// else the go command's own default in this environment; "" without
// rounds, or if go env fails.
func (o *Options) cgoEnabled(ctx context.Context) string {
	if o.Rounds == 0 || o.Cgo != "" {
		return o.Cgo
	}
	cmd := exec.CommandContext(ctx, "go", "env", "CGO_ENABLED")
	cmd.Dir = o.Dir
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
