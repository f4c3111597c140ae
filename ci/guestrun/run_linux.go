package guestrun

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/computer/vm/pid1"
)

// drainWait bounds reading a step's output after it exited: a descendant
// in another process group may still hold the pipe open.
const drainWait = 5 * time.Second

// runPlan runs every step, reporting each, then reports done.
func runPlan(plan Plan, w *Writer, console io.Writer) error {
	if err := w.Write(Frame{Kind: KindHello, Release: uname(), Steps: len(plan.Steps)}); err != nil {
		return fmt.Errorf("report hello: %w", err)
	}
	r := pid1.NewReaper()
	for i, s := range plan.Steps {
		fmt.Fprintf(console, "%s[%d/%d] %s: running\n", ConsolePrefix, i+1, len(plan.Steps), s.Name)
		exit, err := runStep(w, r, i, s, plan.Env)
		if err != nil {
			return fmt.Errorf("report step %s: %w", s.Name, err)
		}
		fmt.Fprintf(console, "%s[%d/%d] %s: %s\n", ConsolePrefix, i+1, len(plan.Steps), s.Name, exit)
	}
	if err := w.Write(Frame{Kind: KindDone}); err != nil {
		return fmt.Errorf("report done: %w", err)
	}
	fmt.Fprintln(console, ConsoleDone)
	return nil
}

// runStep runs one step in its own process group with stdout and stderr
// on one pipe whose contents become output frames. At its timeout the
// whole group is killed; after it exits, so is whatever is left of it.
func runStep(w *Writer, r *pid1.Reaper, i int, s Step, env []string) (*Exit, error) {
	if err := w.Write(Frame{Kind: KindStart, Step: i}); err != nil {
		return nil, err
	}
	exit := execStep(w, r, i, s, env)
	return exit, w.Write(Frame{Kind: KindExit, Step: i, Exit: exit})
}

func execStep(w *Writer, r *pid1.Reaper, i int, s Step, env []string) *Exit {
	began := time.Now()
	fail := func(err error) *Exit {
		return &Exit{Code: -1, Error: err.Error(), ElapsedS: time.Since(began).Seconds()}
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return fail(err)
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return fail(err)
	}
	defer devNull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	defer pr.Close()
	attr := &os.ProcAttr{Dir: s.Dir, Env: env, Files: []*os.File{devNull, pw, pw},
		Sys: &syscall.SysProcAttr{Setpgid: true}}
	pid, status, err := r.Start(s.Argv[0], s.Argv, attr)
	pw.Close()
	if err != nil {
		return fail(err)
	}
	copied := make(chan error, 1)
	go func() { copied <- copyOutput(w, i, pr) }()
	exit := &Exit{}
	select {
	case ws := <-status:
		exit.Code, exit.Signal = ws.ExitStatus(), signalName(ws)
	case <-time.After(s.Timeout()):
		_ = unix.Kill(-pid, unix.SIGKILL)
		ws := <-status
		exit.Code, exit.Signal, exit.TimedOut = ws.ExitStatus(), signalName(ws), true
	}
	exit.ElapsedS = time.Since(began).Seconds()
	_ = unix.Kill(-pid, unix.SIGKILL) // what is left of the step's group
	_ = pr.SetReadDeadline(time.Now().Add(drainWait))
	if err := <-copied; err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		exit.Error = "reading output: " + err.Error()
	}
	return exit
}

// copyOutput turns everything read from r into output frames of step i.
func copyOutput(w *Writer, i int, r io.Reader) error {
	buf := make([]byte, MaxChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := w.Output(i, buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
