package flakehunt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tetherdev/tether/ci/receipt"
)

// VMRun is one run of ci/vm-receipts: its exit status and what each
// receipt it wrote says. The receipts' tests are counted in the tally
// under the package "vm:SUITE/PACKAGE".
type VMRun struct {
	Run       int      `json:"run"`
	Dir       string   `json:"receipts_dir"`
	Exit      int      `json:"exit"`
	Passed    bool     `json:"passed"` // exit 0 and every receipt checked
	Summaries []string `json:"summaries"`
	Problems  []string `json:"problems,omitempty"`
}

// vmRun runs ci/vm-receipts once with its receipts in Out/vm/run-N and
// its output in Out/vm/run-N.log, then reads every receipt back.
func (o *Options) vmRun(ctx context.Context, n int, ty *Tally) (VMRun, error) {
	dir := filepath.Join(o.Out, "vm", fmt.Sprintf("run-%d", n))
	v := VMRun{Run: n, Dir: dir}
	if err := os.RemoveAll(dir); err != nil {
		return v, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return v, err
	}
	log, err := os.Create(dir + ".log")
	if err != nil {
		return v, err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(o.Dir, "ci", "vm-receipts"), append([]string{"--out", dir}, o.VMArgs...)...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = o.Dir, log, log
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		v.Exit = exit.ExitCode()
	case err != nil:
		return v, fmt.Errorf("VM run %d: %w", n, err)
	}
	return v, v.readReceipts(ty)
}

// readReceipts checks and counts every receipt in v.Dir. A run passes
// when ci/vm-receipts exited 0 and every receipt it left passes the
// checker; a run that left none fails.
func (v *VMRun) readReceipts(ty *Tally) error {
	files, err := filepath.Glob(filepath.Join(v.Dir, "*.json"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	v.Passed = v.Exit == 0 && len(files) > 0
	if len(files) == 0 {
		v.Problems = append(v.Problems, "no receipt was written (see "+v.Dir+".log)")
	}
	for _, f := range files {
		suite := strings.TrimSuffix(filepath.Base(f), ".json")
		r, err := receipt.Read(v.Dir, suite)
		if err != nil {
			v.Passed = false
			v.Problems = append(v.Problems, fmt.Sprintf("%s: %v", suite, err))
			continue
		}
		v.Summaries = append(v.Summaries, r.Summarize())
		if err := r.Check(suite); err != nil {
			v.Passed = false
			v.Problems = append(v.Problems, err.Error())
		}
		countReceipt(ty, r)
	}
	return nil
}

// countReceipt adds a receipt's tests to the tally.
func countReceipt(ty *Tally, r *receipt.Receipt) {
	for _, t := range r.Tests {
		ty.result("vm:"+r.Suite+"/"+t.Package, t.Name, string(t.Result), t.Output)
	}
}
