package vmsuite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherdev/tether/ci/guestrun"
	"github.com/tetherdev/tether/fixtures/guest"
)

// BootSpec is one suite boot.
type BootSpec struct {
	Kernel     guest.Kernel
	Initramfs  string
	QEMU       string
	Accel      string
	MemoryMiB  int
	CPUs       int
	Report     string        // host file that receives the report port
	Timeout    time.Duration // the whole boot, from start to power-off
	ConsoleLog io.Writer     // optional: every console line
	Args       []string      // extra QEMU arguments (shares, networking)
	Append     []string      // extra kernel command-line words
}

// ReportArgs returns the QEMU arguments of the report port: a
// virtio-serial port named Port whose output goes to the file path.
func ReportArgs(path string) []string {
	return []string{
		"-device", "virtio-serial-pci,id=tether-vs",
		"-chardev", "file,id=tether-report,path=" + path,
		"-device", "virtserialport,bus=tether-vs.0,chardev=tether-report,name=" + Port,
	}
}

// Boot is what a suite boot produced. Problems lists every way it fell
// short of a complete report (no boot, timeout, a malformed or cut-off
// report); the transcript holds whatever arrived.
type Boot struct {
	Transcript *guestrun.Transcript
	Problems   []string
	Elapsed    time.Duration
}

// consoleTail bounds the console lines quoted in a problem.
const consoleTail = 30

// BootAndCollect boots the image, waits for the guest to power off (or
// kills it at the timeout) and decodes its report of steps steps. It
// always returns a Boot; a guest that never boots yields a problem.
func BootAndCollect(ctx context.Context, spec BootSpec, steps int) *Boot {
	b := &Boot{Transcript: &guestrun.Transcript{Steps: make([]guestrun.StepResult, steps)}}
	start := time.Now()
	defer func() { b.Elapsed = time.Since(start) }()
	if err := os.WriteFile(spec.Report, nil, 0o600); err != nil {
		b.problem("report file: %v", err)
		return b
	}
	bctx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	vm, err := guest.Start(bctx, guest.Config{Kernel: spec.Kernel, Initramfs: spec.Initramfs, QEMU: spec.QEMU,
		Accel: spec.Accel, MemoryMiB: spec.MemoryMiB, CPUs: spec.CPUs, Append: spec.Append,
		Args: append(ReportArgs(spec.Report), spec.Args...), ConsoleLog: spec.ConsoleLog})
	if err != nil {
		b.problem("qemu did not start: %v", err)
		return b
	}
	_, werr := vm.Wait(bctx)
	vm.Close()
	console := vm.Lines()
	if errors.Is(werr, context.DeadlineExceeded) {
		b.problem("the guest did not power off within %s and was killed%s", spec.Timeout, tail(console))
	}
	var ce *guest.ConsoleError
	if errors.As(werr, &ce) && strings.TrimSpace(ce.Stderr) != "" {
		console = append(console, "--- qemu stderr ---", strings.TrimSpace(ce.Stderr))
	}
	b.collect(spec.Report, steps, console)
	return b
}

// collect decodes the report and names what is missing from it.
func (b *Boot) collect(report string, steps int, console []string) {
	f, err := os.Open(report)
	if err != nil {
		b.problem("report: %v", err)
		return
	}
	defer f.Close()
	t, err := guestrun.Decode(f, steps)
	b.Transcript = t
	if err != nil {
		b.problem("%v", err)
	}
	switch {
	case !t.Hello:
		b.problem("guest did not boot: its init never reported%s%s", initFailure(console), tail(console))
	case !t.Done:
		b.problem("the guest stopped before reporting every step%s%s", initFailure(console), tail(console))
	}
}

func (b *Boot) problem(format string, args ...any) {
	b.Problems = append(b.Problems, fmt.Sprintf(format, args...))
}

// initFailure quotes the init's own failure line, if it printed one.
func initFailure(console []string) string {
	for _, l := range console {
		if i := strings.Index(l, guestrun.ConsoleFailed); i >= 0 {
			return " (" + strings.TrimSpace(l[i:]) + ")"
		}
	}
	return ""
}

func tail(console []string) string {
	if len(console) == 0 {
		return "; the console printed nothing"
	}
	if len(console) > consoleTail {
		console = console[len(console)-consoleTail:]
	}
	return "\n--- console tail ---\n" + strings.Join(console, "\n")
}

// KeepConsole copies the guest console log src into the receipts
// directory out as <suite>.console.log when keep is set (the boot fell
// short, and the quoted tail may miss what went wrong first, such as the
// head of a kernel oops), and returns that file's name. Without keep it
// removes a console an earlier run left there, so a kept console always
// belongs to the receipt beside it.
func KeepConsole(src, out, suite string, keep bool) (string, error) {
	name := suite + ".console.log"
	dst := filepath.Join(out, name)
	if !keep {
		if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("remove the stale console: %w", err)
		}
		return "", nil
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("keep the console: %w", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", fmt.Errorf("keep the console: %w", err)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		return "", fmt.Errorf("keep the console: %w", err)
	}
	return name, nil
}

// progress copies every console line to all and the init's progress lines
// (guestrun.ConsolePrefix) to person as well.
type progress struct {
	all    io.Writer
	person io.Writer
}

func (p progress) Write(b []byte) (int, error) {
	if i := strings.Index(string(b), guestrun.ConsolePrefix); i >= 0 {
		fmt.Fprintf(p.person, "  guest: %s", b[i+len(guestrun.ConsolePrefix):])
	}
	return p.all.Write(b)
}
