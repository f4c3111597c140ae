package provision

// A namespaced computer's side of egress: the listener in its network
// namespace where the host's egress proxy answers (api.Networked), the
// proxy settings of its grant's environment (api.ProxyUser), and the file
// in the computer where the proxy's refusals show (api.RefusalRecorder,
// refusals.go).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/nsthread"
)

// ErrNoNetns is returned by EgressListener for a computer without a
// network namespace of its own (IsolationOff) or whose receiver is gone.
var ErrNoNetns = errors.New("computer: no network namespace of its own")

var (
	_ api.Networked       = (*Machine)(nil)
	_ api.ProxyUser       = (*Machine)(nil)
	_ api.RefusalRecorder = (*Machine)(nil)
)

// EgressListener implements api.Networked (Local.EgressListener).
func (m *Machine) EgressListener(ctx context.Context, port int) (net.Listener, error) {
	return m.l.EgressListener(ctx, port)
}

// UseEgressProxy implements api.ProxyUser: the next Grant's environment
// points at the proxy on the computer's loopback (on), or not (off).
func (m *Machine) UseEgressProxy(on bool) {
	m.l.mu.Lock()
	defer m.l.mu.Unlock()
	m.l.egressProxy = on
}

// EgressListener opens a TCP listener on 127.0.0.1:port inside the
// computer's own network namespace, the one its receiver (the init of
// that namespace) lives in; the caller closes it. The receiver is pinned
// by a pidfd that is checked to be the recorded receiver (pid and start
// time) before the namespace is entered, so a recycled pid cannot hand
// out another namespace. The socket is made on a thread locked to that
// namespace, which is never unlocked and so ends with its goroutine.
func (c *Local) EgressListener(ctx context.Context, port int) (net.Listener, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("%w: egress port %d", ErrOptions, port)
	}
	if !c.State().namespaced() {
		return nil, fmt.Errorf("egress listener: %w (isolation %q)", ErrNoNetns, c.State().Isolation)
	}
	c.mu.Lock()
	r := c.recv
	c.mu.Unlock()
	if r == nil {
		return nil, fmt.Errorf("egress listener: %w: the receiver is stopped", ErrNoNetns)
	}
	pidfd, err := pinProcess(r.pid, r.ticks)
	if err != nil {
		return nil, fmt.Errorf("egress listener: %w", err)
	}
	return listenInNetns(ctx, pidfd, port)
}

// pinProcess opens a pidfd of pid and checks that pid is still the
// process that started at ticks; the caller closes the pidfd.
func pinProcess(pid int, ticks uint64) (int, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("%w: pidfd of the receiver %d: %w", ErrNoNetns, pid, err)
	}
	if !Alive(pid, ticks) {
		unix.Close(fd)
		return -1, fmt.Errorf("%w: the receiver %d is not the process that started at tick %d", ErrNoNetns, pid, ticks)
	}
	return fd, nil
}

// listenInNetns makes the listener on a thread that joins pidfd's
// network namespace for the call and leaves it again (egress/nsthread);
// it takes pidfd and closes it. A cancelled ctx returns at once; a
// listener made after that is closed.
func listenInNetns(ctx context.Context, pidfd, port int) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		var ln net.Listener
		err := nsthread.In(pidfd, func() (err error) {
			ln, err = listenOnThread(port)
			return err
		})
		unix.Close(pidfd)
		if err != nil && ln != nil {
			ln.Close()
			ln = nil
		}
		if err != nil && !errors.Is(err, errListen) {
			err = fmt.Errorf("egress listener: %w: %w", ErrNoNetns, err)
		}
		done <- result{ln, err}
	}()
	select {
	case r := <-done:
		return r.ln, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.ln != nil {
				r.ln.Close()
			}
		}()
		return nil, fmt.Errorf("egress listener: %w", context.Cause(ctx))
	}
}

// errListen marks a failure inside the computer's namespace (lo, the
// listen), as against failing to enter it.
var errListen = errors.New("egress listener")

// listenOnThread runs in the computer's network namespace: lo up, listen.
func listenOnThread(port int) (net.Listener, error) {
	if err := stageLoopback(stageSpec{}); err != nil {
		return nil, fmt.Errorf("%w: bring lo up: %w", errListen, err)
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errListen, err)
	}
	return ln, nil
}

// What the grant's environment names: the proxy on the computer's own
// loopback (api.EgressPort, checked by TestProxyURLsNameEgressPort).
// socks5h makes the client hand names to the proxy, which resolves them
// itself.
const (
	ProxyURL = "http://127.0.0.1:3128"
	SocksURL = "socks5h://127.0.0.1:3128"
	NoProxy  = "localhost,127.0.0.1,::1"
)

// ProxyEnv is the grant environment of a computer that uses the egress
// proxy: both spellings of each variable, since curl reads only the
// lower-case http_proxy and other tools only the upper-case forms. The
// VM tier's guest listens on the same address.
func ProxyEnv() []admission.EnvVar {
	var env []admission.EnvVar
	for _, kv := range [][2]string{{"HTTP_PROXY", ProxyURL}, {"HTTPS_PROXY", ProxyURL}, {"ALL_PROXY", SocksURL},
		{"NO_PROXY", NoProxy}} {
		env = append(env, admission.EnvVar{Name: kv[0], Value: kv[1]})
		env = append(env, admission.EnvVar{Name: strings.ToLower(kv[0]), Value: kv[1]})
	}
	return env
}

// withProxyEnv adds the proxy environment to g when the computer uses
// the egress proxy.
func (c *Local) withProxyEnv(g admission.Grant) admission.Grant {
	c.mu.Lock()
	on := c.egressProxy
	c.mu.Unlock()
	if on {
		g.Env = append(g.Env, ProxyEnv()...)
	}
	return g
}
