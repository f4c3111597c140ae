package guestrun

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// drainWait bounds reading a step's output after it exited: a descendant
// in another process group may still hold the pipe open.
const drainWait = 5 * time.Second

// runPlan runs every step, reporting each, then reports done.
func runPlan(plan Plan, w *Writer, console io.Writer) error {
	if err := w.Write(Frame{Kind: KindHello, Release: uname(), Steps: len(plan.Steps)}); err != nil {
		return fmt.Errorf("report hello: %w", err)
	}
	r := newReaper()
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
func runStep(w *Writer, r *reaper, i int, s Step, env []string) (*Exit, error) {
	if err := w.Write(Frame{Kind: KindStart, Step: i}); err != nil {
		return nil, err
	}
	exit := execStep(w, r, i, s, env)
	return exit, w.Write(Frame{Kind: KindExit, Step: i, Exit: exit})
}

func execStep(w *Writer, r *reaper, i int, s Step, env []string) *Exit {
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
	pid, status, err := r.start(s.Argv[0], s.Argv, attr)
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

// reaper is PID 1's only wait4 caller: it reaps every process that ends
// (orphans are re-parented to PID 1) and hands the status of a process it
// started to whoever waits for it.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan syscall.WaitStatus
	wake    chan struct{}
}

func newReaper() *reaper {
	r := &reaper{waiting: map[int]chan syscall.WaitStatus{}, wake: make(chan struct{}, 1)}
	go r.loop()
	return r
}

// start starts a process and returns its pid and a channel that receives
// its wait status once. The lock covers start and registration, so the
// loop cannot reap the process before it is registered.
func (r *reaper) start(path string, argv []string, attr *os.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	p, err := os.StartProcess(path, argv, attr)
	if err != nil {
		r.mu.Unlock()
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiting[p.Pid] = ch
	r.mu.Unlock()
	_ = p.Release()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return p.Pid, ch, nil
}

func (r *reaper) loop() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.ECHILD) {
			select { // nothing to reap until something starts
			case <-r.wake:
			case <-time.After(time.Second):
			}
			continue
		}
		if err != nil {
			continue
		}
		r.mu.Lock()
		if ch, ok := r.waiting[pid]; ok {
			delete(r.waiting, pid)
			ch <- ws
		}
		r.mu.Unlock()
	}
}
