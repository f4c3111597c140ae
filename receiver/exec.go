package receiver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/fsops"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireserver"
)

// execPlan is everything exec_start decided before anything starts.
type execPlan struct {
	path     string   // absolute, or a bare name spawn looks up in search
	search   []string // the absolute directories of the merged PATH
	pathVar  string   // the merged PATH, for the not_found message
	argv     []string
	env      []string
	limit    int64
	deadline time.Time
}

// planExec validates and resolves exec_start args against the grant and
// the receiver's limits. It has no side effects.
func (h *Handler) planExec(req *wire.Request, a *wire.ExecStartArgs, g admission.Grant, now time.Time) (execPlan, error) {
	if len(a.Argv) == 0 || a.Argv[0] == "" {
		return execPlan{}, errcode.Errorf(errcode.CodeInvalid, "argv is empty")
	}
	if a.OutputLimit != nil && *a.OutputLimit < 0 {
		return execPlan{}, errcode.Errorf(errcode.CodeInvalid, "output_limit is negative")
	}
	if len(a.HashAfterExit) > h.limits.MaxHashPaths {
		return execPlan{}, errcode.Errorf(errcode.CodeTooLarge, "hash_after_exit names %d paths, limit %d", len(a.HashAfterExit), h.limits.MaxHashPaths)
	}
	env, merged, err := childEnv(h.childEnv, g, a.Env)
	if err != nil {
		return execPlan{}, err
	}
	search, err := searchPath(a.Argv[0], merged["PATH"])
	if err != nil {
		return execPlan{}, err
	}
	p := execPlan{path: a.Argv[0], search: search, pathVar: merged["PATH"], argv: slices.Clone(a.Argv), env: env,
		limit: outputLimit(a.OutputLimit, g.Limits.MaxOutputBytes, h.limits.MaxOutputBytes)}
	p.deadline = earliest(req.Deadline, g.NotAfter,
		addSeconds(now, g.Limits.MaxRuntimeS), now.Add(h.limits.maxRuntime()))
	if !p.deadline.After(now) {
		return execPlan{}, errcode.Errorf(errcode.CodeTimeout, "command deadline %s has passed", p.deadline.UTC().Format(time.RFC3339Nano))
	}
	return p, nil
}

// outputLimit is the number of output bytes a command keeps: the
// request's outputByteLimit when set (0 keeps nothing, as ACP says),
// never more than the grant's and the receiver's bounds.
func outputLimit(requested *int64, grant, receiver int64) int64 {
	limit := min64(grant, receiver)
	if requested != nil && *requested < limit {
		limit = *requested
	}
	return limit
}

// searchPath checks argv[0] and returns where a bare name is looked up:
// the absolute directories of the merged PATH (nothing of the receiver's
// own environment). An absolute argv[0] needs no lookup; a relative path
// with a slash is refused. The lookup itself runs in spawn.Start with the
// grant's uid, gid and groups, inside the child's Landlock view
// (spawn.Spec.Search), never with the receiver's privileges.
func searchPath(name, pathVar string) ([]string, error) {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			return nil, errcode.Errorf(errcode.CodeInvalid, "argv[0] %q must be absolute or a bare name looked up in PATH", name)
		}
		return nil, nil
	}
	if name == "." || name == ".." {
		return nil, errcode.Errorf(errcode.CodeInvalid, "argv[0] %q is not a command name", name)
	}
	var dirs []string
	for _, dir := range filepath.SplitList(pathVar) {
		if filepath.IsAbs(dir) {
			dirs = append(dirs, dir)
		}
	}
	return dirs, nil
}

func addSeconds(t time.Time, s int64) time.Time {
	if s <= 0 {
		return time.Time{}
	}
	return t.Add(time.Duration(s) * time.Second)
}

// earliest returns the earliest non-zero time of ts.
func earliest(ts ...time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if !t.IsZero() && (m.IsZero() || t.Before(m)) {
			m = t
		}
	}
	return m
}

// execStart starts a command as the grant's user and returns its terminal.
// The child outlives this request; it ends on exit, kill, release, its
// deadline or the handler's Close. On a goroutine the wire server owns for
// this request, the child is forked from that goroutine's own thread (no
// hand-off to a spawning goroutine and back) and the answer carries the
// thread to the end of the child (startedResult).
func (h *Handler) execStart(ctx context.Context, req *wire.Request, a *wire.ExecStartArgs, g admission.Grant) (any, error) {
	now := h.now()
	plan, err := h.planExec(req, a, g, now)
	if err != nil {
		return nil, err
	}
	if err := h.enforced.check(g); err != nil {
		return nil, err
	}
	slot, err := h.terms.reserve(req.TupleSHA256, req.OpKey, g.Limits.MaxProcs, now)
	if err != nil {
		return nil, err
	}
	onThisThread := wireserver.OwnsGoroutine(ctx)
	t, err := h.startTerminal(slot.id, req, plan, a, g, now, onThisThread)
	if errors.Is(err, spawn.ErrNotFound) { // nothing ran: the op key may be used again
		slot.forget()
		return nil, errcode.Errorf(errcode.CodeNotFound, "argv[0] %q not found in PATH %q (the request's env merged over the defaults) as the grant's user sees it inside the root's view",
			a.Argv[0], plan.pathVar)
	}
	if err != nil {
		slot.cancel()
		return nil, err
	}
	if !slot.commit(t) {
		return nil, errcode.Errorf(errcode.CodeUnavailable, "receiver is shutting down")
	}
	if h.fences.current(req.TupleSHA256) > req.Fence { // raised while it started: killBelow may have missed it
		go t.kill() // not on this goroutine: its thread may be the restricted spawning thread
	}
	h.terms.claim(t, wireserver.ConnOf(ctx))
	res := wire.ExecStartResult{TerminalID: t.id, PID: t.child.PID()}
	if onThisThread {
		return &startedResult{ExecStartResult: res, child: t.child}, nil
	}
	return &res, nil
}

// startedResult is exec_start's answer when the child was forked from the
// request's own goroutine (spawn.Spec.OnCallingThread): it marshals as a
// wire.ExecStartResult, and once the answer is written it keeps that
// goroutine, locked to the spawning thread, until the child is reaped.
// Then the goroutine ends and the runtime destroys the thread, which is
// the child's parent-death thread until then.
type startedResult struct {
	wire.ExecStartResult
	child *spawn.Child
}

var _ wireserver.AfterWriter = (*startedResult)(nil)

// AfterWrite waits for the child to be reaped.
func (r *startedResult) AfterWrite() { <-r.child.Done() }

// startTerminal opens the root and the working directory, creates the
// command's cgroup (cgroup mode required), starts the child and the
// goroutines that watch it.
func (h *Handler) startTerminal(id string, req *wire.Request, plan execPlan, a *wire.ExecStartArgs, g admission.Grant,
	now time.Time, onThisThread bool) (*terminal, error) {
	root, err := h.openRoot(g)
	if err != nil {
		return nil, err
	}
	tc, err := h.newCgroup(id)
	if err != nil {
		root.Close()
		return nil, err
	}
	child, rd, err := h.spawnIn(root, plan, a.Cwd, g, tc, onThisThread)
	if err != nil {
		h.removeCgroup(tc)
		root.Close()
		return nil, err
	}
	t := &terminal{id: id, tuple: req.TupleSHA256, fence: req.Fence, child: child, out: newTailBuffer(int(plan.limit)), output: rd,
		done: make(chan struct{}), now: h.now, cgroup: tc, removeCgroup: h.removeCgroup}
	t.timer = time.AfterFunc(plan.deadline.Sub(now), t.kill)
	copied := make(chan struct{})
	go t.copyOutput(copied)
	go t.watch(root, slices.Clone(a.HashAfterExit), copied)
	return t, nil
}

// spawnIn starts the child in cwd beneath root, in the cgroup tc if not
// nil, and returns it with the read end of its output pipe.
//
// WARNING: with onThisThread the calling goroutine's thread is locked and,
// in thread and clone mode, restricted (Landlock included) from
// spawn.Start on: the code that runs after it on this goroutine (here, in
// execStart and in the wire server's answer) must not open files or need
// privileges. Tested as
// root by go test -race -run 'TestOnCallingThread|TestIntegrationDaemon' ./receiver/...
func (h *Handler) spawnIn(root *fsops.Root, plan execPlan, cwd string, g admission.Grant, tc *termCgroup,
	onThisThread bool) (*spawn.Child, *os.File, error) {
	dir, err := root.OpenDir(cwd)
	if err != nil {
		return nil, nil, fmt.Errorf("cwd: %w", err)
	}
	defer dir.Close()
	rs, err := h.landlock.rulesetFor(root)
	if err != nil {
		return nil, nil, err
	}
	defer rs.Close()
	v1, release, err := h.cgv1.acquire()
	if err != nil {
		return nil, nil, errcode.Errorf(errcode.CodeUnavailable, "receiver is shutting down")
	}
	defer release()
	rd, wr, err := outputPipe()
	if err != nil {
		return nil, nil, err
	}
	child, err := spawn.Start(spawn.Spec{Mode: h.mode, HelperPath: h.helper, Path: plan.path, Search: plan.search, Argv: plan.argv,
		Env: plan.env, Dir: dir, UID: g.UID, GID: g.GID, Groups: g.Groups, Output: wr, Landlock: rs, Seccomp: h.seccomp,
		Cgroup: tc.file(), CgroupsV1: v1, OnCallingThread: onThisThread})
	wr.Close()
	if err != nil {
		rd.Close()
		return nil, nil, err
	}
	return child, rd, nil
}

// terminalOp serves exec_output, exec_wait, exec_kill and exec_release on
// a terminal the same tuple started.
func (h *Handler) terminalOp(ctx context.Context, req *wire.Request, a *wire.TerminalArgs) (any, error) {
	t := h.terms.get(req.TupleSHA256, a.TerminalID)
	if t == nil {
		return nil, errcode.Errorf(errcode.CodeNotFound, "terminal %q does not exist for this tuple", a.TerminalID)
	}
	if a.Release && req.Op != wire.OpExecWait {
		return nil, errcode.Errorf(errcode.CodeInvalid, "release is an argument of exec_wait alone, not of %s", req.Op)
	}
	h.terms.claim(t, wireserver.ConnOf(ctx)) // a reattach, if it was orphaned
	switch req.Op {
	case wire.OpExecOutput:
		res := t.outputSoFar()
		if res.FileSHA256 != nil && h.fits(res, "") != nil { // exec_wait still gives them
			res.FileSHA256 = nil
		}
		return res, nil
	case wire.OpExecWait:
		return h.wait(ctx, t, a.Release)
	case wire.OpExecKill:
		t.kill()
		return &wire.Empty{}, nil
	case wire.OpExecRelease:
		return h.release(ctx, t)
	}
	return nil, errcode.Errorf(errcode.CodeInvalid, "op %s is not a terminal op", req.Op)
}

// release kills the group, forgets the terminal and waits until it is
// final (reaped, output drained, cgroup removed). Success means nothing
// the command started still runs; a request that ends first is answered
// timeout, though the command is killed and forgotten all the same.
func (h *Handler) release(ctx context.Context, t *terminal) (*wire.Empty, error) {
	t.kill()
	h.terms.remove(t.id)
	select {
	case <-t.done:
		return &wire.Empty{}, nil
	case <-ctx.Done():
		return nil, errcode.Errorf(errcode.CodeTimeout,
			"request ended before the released command was final; it is killed and forgotten, and may still be draining")
	}
}

// wait answers once the terminal is final: its exit, its after-exit
// digests and its final output, so the client needs no exec_output after
// the exit. With release, the terminal is forgotten in the same answer
// (it is final: nothing of it runs, and the answer holds all it kept);
// when the output does not fit beside the digests, it is left out and the
// terminal kept, for exec_output to give it.
func (h *Handler) wait(ctx context.Context, t *terminal, release bool) (*wire.ExecWaitResult, error) {
	select {
	case <-t.done:
	case <-ctx.Done():
		return nil, errcode.Errorf(errcode.CodeTimeout, "request ended before the command exited; it is still running")
	case <-h.closed:
		return nil, errcode.Errorf(errcode.CodeUnavailable, "receiver is shutting down")
	}
	out, trunc := t.out.Snapshot(true)
	res := &wire.ExecWaitResult{Exit: *t.status(), FileSHA256: t.hashes, Output: &out, Truncated: trunc}
	if h.fits(res, "") != nil {
		res.Output, res.Truncated = nil, false
		if err := h.fits(res, "hash_after_exit result"); err != nil {
			return nil, err
		}
		return res, nil
	}
	if release {
		h.terms.remove(t.id)
		res.Released = true
	}
	return res, nil
}

// outputPipe returns a child's output pipe: the read end in the runtime's
// poller (the receiver drains it), the write end a plain blocking
// descriptor for the child (it never enters the poller). Both are
// close-on-exec; Start hands the write end to the child.
func outputPipe() (rd, wr *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("output pipe: %w", err)
	}
	if err := unix.SetNonblock(p[0], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, fmt.Errorf("output pipe: %w", err)
	}
	return os.NewFile(uintptr(p[0]), "output"), os.NewFile(uintptr(p[1]), "output-w"), nil
}

// newCgroup creates the cgroup of terminal id, or returns nil when cgroup
// containment is off. A failure is the receiver's, so the peer sees
// internal and the log names the check.
func (h *Handler) newCgroup(id string) (*termCgroup, error) {
	if h.cgroups == nil {
		return nil, nil
	}
	tc, err := h.cgroups.create(id)
	if errors.Is(err, errCgroupsClosed) {
		return nil, errcode.Errorf(errcode.CodeUnavailable, "receiver is shutting down")
	}
	if err != nil { // never mapped by errno (a missing parent is no not_found of the peer's)
		return nil, h.logInternal(wire.OpExecStart, err)
	}
	return tc, nil
}

// removeCgroup kills and removes a command's cgroup (nil: nothing) and
// logs, naming it, a cgroup it could not remove.
func (h *Handler) removeCgroup(tc *termCgroup) {
	if tc == nil {
		return
	}
	if err := h.cgroups.remove(tc); err != nil {
		h.log.Error("receiver: command cgroup left behind", "cgroup", tc.path, "err", err)
	}
}
