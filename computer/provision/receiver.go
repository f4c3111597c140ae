package provision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wire"
)

// Timeouts of the receiver's life cycle.
const (
	// ReadyTimeout bounds the wait for a started receiver to answer.
	ReadyTimeout = 60 * time.Second
	// StopGrace is how long a receiver gets to shut down after SIGTERM
	// before it is killed; it is above the receiver's own shutdown grace.
	StopGrace = 15 * time.Second
)

// receiverProc is one running tether-receiver.
type receiverProc struct {
	pid   int
	ticks uint64
	cmd   *exec.Cmd     // nil when found through the state file
	done  chan struct{} // closed when cmd has been waited for
	err   error         // cmd.Wait's result, after done
}

// writeReceiverConfig writes receiver/receiver.json (docs/protocol.md,
// "Config"): one listener, the admission file and its pinned signer owned
// by root, the Landlock configuration, the cgroup containment, seccomp,
// the fence state and, on a namespaced computer, the work directories and
// environment (workplace.go).
func (c *Local) writeReceiverConfig(context.Context) error {
	data, err := ReceiverConfig(c.receiverSettings())
	if err != nil {
		return err
	}
	return writeFile(c.paths.receiverConfig, data, 0o600, 0, 0)
}

// receiverSettings are this computer's receiver settings: seccomp is
// required unless a test turned it off (Options.seccompOff).
func (c *Local) receiverSettings() ReceiverSettings {
	p, s := c.paths, c.state
	seccomp := receiver.SeccompRequired
	if c.opts.seccompOff {
		seccomp = receiver.SeccompOff
	}
	return ReceiverSettings{Listen: c.listenConfig(), AdmissionFile: p.admission + "/" + admission.FileName,
		PublicKey: p.admissionPub, Landlock: s.receiverLandlock(c.landlock),
		Cgroup:  receiver.CgroupConfig{Mode: s.Cgroup, Parent: s.CgroupParent, V1: s.cgroupV1Config()},
		Seccomp: seccomp, ChildEnv: s.childEnv(), FenceState: fenceStatePath(p)}
}

// fenceStatePath is the receiver's fence state file: in run/, the one
// directory of the computer that is root's, writable by nobody else, and
// writable by the receiver inside its namespaces (the stage binds it so).
// It lives as long as the computer, across receiver restarts; the
// custodian's group may list run/ but not read the 0600 file.
func fenceStatePath(p paths) string { return filepath.Join(p.run, "fence.json") }

func (c *Local) listenConfig() transport.Config {
	p, s := c.paths, c.state
	switch {
	case s.Transport == TransportUnix:
		return transport.Config{Kind: transport.KindUnix, Path: p.socket, HostOnly: true, SocketMode: 0o666,
			PeerUIDs: []uint32{0, s.CustodianUID}}
	case s.Socket != "":
		return c.creds.ListenTLSUnix(p.socket, p.recv, 0, s.CustodianUID)
	}
	return c.creds.ListenTLS(s.Address, p.recv)
}

// startReceiver starts tether-receiver --config as root, in its own
// session, with the bounding set reduced by Options.DropCaps, and waits
// until it answers an attach for the tuple.
func (c *Local) startReceiver(ctx context.Context) error {
	if c.state.Address == "" && c.state.Socket == "" {
		return errors.New("no address or socket reserved")
	}
	log, err := os.OpenFile(c.paths.receiverLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd, spec, err := c.receiverCommand()
	if err != nil {
		return err
	}
	cmd.Env = []string{} // nothing from the caller's environment
	cmd.Dir = "/"
	cmd.Stderr = log
	if c.opts.Log != nil && !c.opts.Detach {
		cmd.Stderr = io.MultiWriter(log, c.opts.Log)
	}
	err = startReduced(cmd, c.drop)
	if spec != nil {
		spec.Close()
	}
	if err != nil {
		return err
	}
	r := &receiverProc{pid: cmd.Process.Pid, cmd: cmd, done: make(chan struct{})}
	r.ticks, _ = StartTicks(r.pid)
	go func() { r.err = cmd.Wait(); close(r.done) }()
	c.mu.Lock()
	c.recv = r
	c.state.ReceiverPID, c.state.ReceiverStart = r.pid, r.ticks
	c.mu.Unlock()
	if err := c.saveState(ctx); err != nil {
		return err
	}
	err = c.waitReady(ctx, r)
	if errors.Is(err, ErrReceiverExited) {
		c.mu.Lock()
		c.recv = nil
		c.mu.Unlock()
	}
	return err
}

// receiverCommand is tether-receiver --config, as root in its own
// session; on a namespaced computer it is the stage that becomes the
// receiver, with its spec's pipe (closed by the caller after Start).
func (c *Local) receiverCommand() (*exec.Cmd, *os.File, error) {
	if c.state.namespaced() {
		return c.stageCommand()
	}
	cmd := exec.Command(c.opts.Bins.Path("tether-receiver"), "--config", c.paths.receiverConfig)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd, nil, nil
}

// waitReady waits until the receiver answers attach for the tuple over
// its real listener (or refuses it as fenced: a fleet custodian's token
// owns the tuple; or, on a computer made with Options.NoGrant, as
// not_admitted), or exits (an *ExitError with its log).
func (c *Local) waitReady(ctx context.Context, r *receiverProc) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	var last error
	for {
		select {
		case <-r.done:
			return &ExitError{Status: exitStatus(r.err), Log: tail(c.paths.receiverLog, 4096)}
		default:
		}
		if _, last = c.Attach(ctx); last == nil || errors.Is(last, &errcode.Error{Code: errcode.CodeFenced}) {
			return nil // fenced: it answered, and a fleet custodian owns the tuple
		}
		if c.opts.NoGrant && errors.Is(last, &errcode.Error{Code: errcode.CodeNotAdmitted}) {
			return nil // it answered, and admits nothing yet
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("receiver did not answer within %s: %w (last: %v)", ReadyTimeout, ctx.Err(), last)
		case <-r.done:
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// Attach asks the receiver, over a fresh connection on its real listener
// with the custodian's credentials, whether a current grant covers the
// tuple: what the custodian does for `_tether/attach`.
func (c *Local) Attach(ctx context.Context) (wire.AttachResult, error) {
	return AttachVia(ctx, c, c.state.Tuple)
}

// Dial connects to the receiver's listener as the custodian would, with
// the client certificate held in memory (the files may belong to another
// uid). The caller owns the stream and closes it.
func (c *Local) Dial(ctx context.Context) (io.ReadWriteCloser, error) {
	switch {
	case c.state.Transport == TransportUnix:
		return transport.Unix{Path: c.paths.socket, HostOnly: true, PeerUIDs: []uint32{0}}.Dial(ctx)
	case c.state.Socket != "":
		return c.creds.DialTLSUnix(ctx, c.state.Socket, 5*time.Second)
	}
	return c.creds.DialTLS(ctx, c.state.Address, 5*time.Second)
}

// StopReceiver stops the receiver: SIGTERM, then SIGKILL after StopGrace.
// It returns once the process is gone. Stopping a stopped receiver does
// nothing.
func (c *Local) StopReceiver(ctx context.Context) error {
	_, err := c.stopReceiver(ctx)
	return err
}

// stopReceiver is StopReceiver, and also reports whether the receiver
// did not shut down cleanly itself: it was already gone, or (when it is
// this process's child) it ended otherwise than with exit status 0. Such
// a receiver could not remove its command cgroups.
func (c *Local) stopReceiver(ctx context.Context) (unclean bool, err error) {
	c.mu.Lock()
	r := c.recv
	c.recv = nil
	c.mu.Unlock()
	if r == nil {
		return true, nil
	}
	gone := !Alive(r.pid, r.ticks)
	err = r.stop(ctx)
	if r.cmd != nil {
		select {
		case <-r.done:
			return r.err != nil, err
		default:
		}
	}
	return gone, err
}

func (r *receiverProc) stop(ctx context.Context) error {
	if err := signal(r.pid, r.ticks, syscall.SIGTERM); err != nil {
		return err
	}
	gctx, cancel := context.WithTimeout(ctx, StopGrace)
	defer cancel()
	if r.wait(gctx) == nil {
		return nil
	}
	if err := signal(r.pid, r.ticks, syscall.SIGKILL); err != nil {
		return err
	}
	kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer kcancel()
	return errors.Join(fmt.Errorf("receiver %d ignored SIGTERM for %s; killed", r.pid, StopGrace), r.wait(kctx))
}

// wait returns when the receiver is gone (reaped, when it is our child).
func (r *receiverProc) wait(ctx context.Context) error {
	if r.cmd == nil {
		return waitGone(ctx, r.pid, r.ticks)
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("receiver %d still running: %w", r.pid, ctx.Err())
	}
}

// KillReceiver kills the receiver at once with SIGKILL, as a crash or
// the loss of its machine would: it answers nothing more, so every call
// in flight loses its answer, and its children die by their parent-death
// signal, not by its shutdown. It returns once the process is gone.
// Killing a stopped receiver does nothing; StartReceiver starts it again.
func (c *Local) KillReceiver(ctx context.Context) error {
	c.mu.Lock()
	r := c.recv
	c.recv = nil
	c.mu.Unlock()
	if r == nil {
		return nil
	}
	if err := signal(r.pid, r.ticks, syscall.SIGKILL); err != nil {
		return err
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return r.wait(kctx)
}

// StartReceiver starts the receiver again (after StopReceiver), with
// drop removed from its bounding set; it waits until the receiver
// answers, or returns the *ExitError of one that refused to start.
func (c *Local) StartReceiver(ctx context.Context, drop ...string) error {
	c.mu.Lock()
	running := c.recv != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("%w: the receiver is running; stop it first", ErrOptions)
	}
	c.drop = c.drop[:0]
	for _, n := range drop {
		cp, err := capByName(n)
		if err != nil {
			return err
		}
		c.drop = append(c.drop, cp)
	}
	return c.startReceiver(ctx)
}

// ReceiverRunning reports whether the receiver process is alive.
func (c *Local) ReceiverRunning() bool {
	c.mu.Lock()
	r := c.recv
	c.mu.Unlock()
	return r != nil && Alive(r.pid, r.ticks)
}
