package jail

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/egress/nsthread"
	"github.com/tetherdev/tether/egress/policy"
)

// Under NetworkProxy the agent's network is a namespace of its own with
// only loopback, made by the jail's own OS thread (run, which is locked
// and never unlocked):
//
//  1. the thread unshares its network namespace (CLONE_NEWNET), so the
//     thread, and only it, is in a fresh namespace that has nothing but a
//     loopback interface, which it brings up;
//  2. on that thread it opens the proxy's listener on
//     127.0.0.1:EgressPort: a socket belongs to the namespace of the
//     thread that made it, for good;
//  3. it hands the listener to the egress proxy (Attach), whose
//     goroutines run on the process's other threads, in the host's
//     namespace, so the proxy dials out from the host while it accepts
//     only from the jail;
//  4. it forks bwrap, which inherits the thread's namespaces, without
//     --unshare-net: the agent runs in that namespace. The namespace
//     belongs to the host's initial user namespace, where the agent has
//     no capability, so it cannot add an interface, an address or a
//     route: it has no route out, and the only thing listening in it is
//     the proxy.
//
// When the goroutine returns, the runtime ends the thread (it is still
// locked), so no thread of the custodian stays in the namespace; it
// lives on only as long as the listener and the jail's processes, and
// Detach closes the listener when the agent has ended.

// egressTimeout bounds Attach and Detach.
const egressTimeout = 10 * time.Second

// enterNetwork is a prepareThread step: it moves the calling (locked)
// thread into a new network namespace, brings up its loopback and
// listens on 127.0.0.1:EgressPort there.
func (p *Process) enterNetwork() error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare the network namespace: %w", err)
	}
	if err := nsthread.LoopbackUp(); err != nil {
		return fmt.Errorf("bring up the jail's loopback: %w", err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(p.spec.EgressPort))
	if err != nil {
		return fmt.Errorf("listen for the egress proxy on the jail's loopback: %w", err)
	}
	p.egressLn = ln
	return nil
}

// egressID names the jail at the proxy: unique among live jails, since
// the uid is held while the jail runs.
func (p *Process) egressID() string { return fmt.Sprintf("agent-jail-%d", p.spec.UID) }

// attachEgress hands the listener to the proxy under the agent's policy;
// every refusal becomes a line on the jail's stderr, so the agent's
// operator sees what was refused and why.
func (p *Process) attachEgress() error {
	ctx, cancel := context.WithTimeout(context.Background(), egressTimeout)
	defer cancel()
	ln := p.egressLn
	p.egressLn = nil // Attach owns it now, even when it fails
	if err := p.spec.egress.Attach(ctx, p.egressID(), p.spec.EgressPolicy, ln, p.refused); err != nil {
		ln.Close()
		return fmt.Errorf("%w: attach the jail to the egress proxy: %w", ErrStart, err)
	}
	p.attached = true
	return nil
}

// refused reports one refusal on the jail's stderr.
func (p *Process) refused(r policy.Refusal) {
	fmt.Fprintf(p.stderr, "tether jail: egress refused %s: %s (%s)\n",
		net.JoinHostPort(r.Host, strconv.Itoa(int(r.Port))), oneLine(r.Reason), r.Check)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// detachEgress stops the proxy serving the jail (closing its listener
// and open connections), or closes a listener never attached.
func (p *Process) detachEgress() error {
	if p.egressLn != nil {
		p.egressLn.Close()
		p.egressLn = nil
	}
	if !p.attached {
		return nil
	}
	p.attached = false
	ctx, cancel := context.WithTimeout(context.Background(), egressTimeout)
	defer cancel()
	if err := p.spec.egress.Detach(ctx, p.egressID()); err != nil {
		return fmt.Errorf("%w: detach the jail from the egress proxy: %w", ErrCleanup, err)
	}
	return nil
}

// networkLine is the banner's line about the network.
func (s *Spec) networkLine() string {
	switch s.Network {
	case NetworkProxy:
		return fmt.Sprintf("network proxy: own network namespace with only loopback and no route out; the egress proxy at 127.0.0.1:%d "+
			"(HTTP_PROXY, HTTPS_PROXY, ALL_PROXY) lets the agent reach %s; refusals are printed here", s.EgressPort, describePolicy(s.EgressPolicy))
	case NetworkNone:
		return "network none: own network namespace with only loopback: the agent reaches nothing outside the jail"
	}
	return `network host (jail.network "host"): the agent shares the host's network and reaches every service on the host, ` +
		"its loopback included; the egress proxy does not see it"
}

// describePolicy names what a policy allows, briefly.
func describePolicy(pol policy.Policy) string {
	var parts []string
	for _, r := range pol.Allow {
		dest := r.Host
		if dest == "" {
			dest = r.CIDR
		}
		ports := r.Ports
		if len(ports) == 0 {
			ports = policy.DefaultPorts
		}
		var ps []string
		for _, port := range ports {
			ps = append(ps, strconv.Itoa(int(port)))
		}
		parts = append(parts, dest+":"+strings.Join(ps, ","))
	}
	if len(pol.Presets) > 0 {
		parts = append(parts, "presets "+strings.Join(pol.Presets, ","))
	}
	if len(parts) == 0 {
		return "nothing (jail.egress allows nothing)"
	}
	out := strings.Join(parts, " ")
	if pol.AllowNoSNI {
		out += " (tunnels without TLS allowed)"
	}
	if len(pol.Deny) > 0 {
		out += fmt.Sprintf(" (less %d deny rules)", len(pol.Deny))
	}
	return out
}

// lockedWriter serializes writes: the jail's stderr receives the
// agent's own stderr (copied by os/exec) and the proxy's refusals.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
