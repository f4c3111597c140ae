package vm

// A VM computer's side of egress. The guest has no network device; its
// only way out is the host's egress proxy, reached over the wire link:
// the guest's agent listens on 127.0.0.1:api.EgressPort in the guest
// (ctl egress) and dials one muxlink stream to the host for each
// connection there; EgressListener is the host's net.Listener of those
// streams, which the service hands to the proxy. The link belongs to
// this computer's QEMU alone, so the listener that accepted a stream
// names the computer, as a namespaced computer's listener in its own
// network namespace does. Refusals go to ctl.RefusalLog in the guest
// over the control port.

import (
	"context"
	"fmt"
	"net"
	"slices"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/vm/ctl"
	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/receiver"
)

var (
	_ api.Networked       = (*Machine)(nil)
	_ api.ProxyUser       = (*Machine)(nil)
	_ api.RefusalRecorder = (*Machine)(nil)
)

// EgressListener implements api.Networked: the guest's agent starts
// listening on 127.0.0.1:port in the guest, and the returned listener
// accepts the streams it dials for each connection there. The caller
// closes the listener (or hands it to Egress.Attach); closing it makes
// the host refuse the guest's dials again. One at a time.
func (m *Machine) EgressListener(ctx context.Context, port int) (net.Listener, error) {
	if m.link == nil {
		return nil, fmt.Errorf("egress listener: %w: no wire link", ErrGuest)
	}
	ln, err := m.link.Listen()
	if err != nil {
		return nil, fmt.Errorf("egress listener: %w", err)
	}
	if _, err := m.ctlCall(ctx, ctl.Request{Op: ctl.OpEgress, Port: port}); err != nil {
		ln.Close()
		return nil, fmt.Errorf("egress listener: %w", err)
	}
	return ln, nil
}

// UseEgressProxy implements api.ProxyUser: the next Grant's environment
// points at the proxy on the guest's loopback (on), or not (off).
func (m *Machine) UseEgressProxy(on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.egressProxy = on
}

// withProxyEnv adds the proxy environment to g when the computer uses
// the egress proxy.
func (m *Machine) withProxyEnv(g admission.Grant) admission.Grant {
	m.mu.Lock()
	on := m.egressProxy
	m.mu.Unlock()
	if on {
		g.Env = append(g.Env, provision.ProxyEnv()...)
	}
	return g
}

// RefusalLog implements api.RefusalRecorder: ctl.RefusalLog, in the
// guest.
func (m *Machine) RefusalLog() string { return ctl.RefusalLog }

// RecordRefusal implements api.RefusalRecorder: the line goes to the
// guest over the control port. While the guest is stopped it fails (the
// service logs it); the proxy still refuses.
func (m *Machine) RecordRefusal(r policy.Refusal) error {
	line := provision.RefusalLine(r)
	if len(line) > ctl.MaxRefusalLine {
		line = line[:ctl.MaxRefusalLine-1] + "\n"
	}
	if _, err := m.ctlCall(context.Background(), ctl.Request{Op: ctl.OpRefusal, Data: []byte(line)}); err != nil {
		return fmt.Errorf("record refusal: %w", err)
	}
	return nil
}

// guestLandlock is the Landlock configuration of the guest's receiver
// (when the guest's kernel has Landlock): the default read paths and
// the refusal log's directory; of TCP, connects to api.EgressPort only
// (the guest has no interface but its loopback, where the egress
// listener answers on that port), and no bind.
func guestLandlock(mode string) receiver.LandlockConfig {
	return receiver.LandlockConfig{Mode: mode,
		ReadExec:   append(slices.Clone(receiver.DefaultLandlockReadExec), ctl.RefusalDir),
		TCPConnect: []uint16{api.EgressPort}}
}
