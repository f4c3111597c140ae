package api

import (
	"context"
	"net"

	"github.com/tetherdev/tether/egress/policy"
)

// Egress is the host's one egress proxy as the service sees it (package
// egress implements it; tether-computer serve hands it to the service).
// Every computer reaches it only through a listener that lives in the
// computer's own network namespace, so the listener that accepted a
// connection names the computer: nothing the computer says is trusted.
type Egress interface {
	// Attach starts serving computer id on ln under pol. Attach owns ln
	// from then on and closes it on Detach. refused, if not nil, is
	// called (never concurrently for one computer) for every connection
	// the proxy refuses. Attaching an id twice fails.
	Attach(ctx context.Context, id string, pol policy.Policy, ln net.Listener, refused func(policy.Refusal)) error
	// SetPolicy replaces id's policy. New connections see it at once;
	// open tunnels it no longer allows are closed within one second.
	// It fails for an unknown id, or a policy naming an unknown preset.
	SetPolicy(ctx context.Context, id string, pol policy.Policy) error
	// Detach stops serving id: its listener and every open connection
	// are closed before it returns. Detaching an unknown id succeeds.
	Detach(ctx context.Context, id string) error
}

// Networked is implemented by machines whose network namespace the
// service can reach: EgressListener opens a TCP listener on
// 127.0.0.1:port inside the machine's own network namespace (the caller
// closes it, or hands it to Egress.Attach). The namespaced provisioner's
// machines are Networked; so are VM machines, whose guest listens on
// 127.0.0.1:port and whose listener yields the streams the guest dials
// over the computer's own wire link.
type Networked interface {
	EgressListener(ctx context.Context, port int) (net.Listener, error)
}

// EgressPort is the port on the computer's own loopback where the egress
// proxy answers (HTTP forward, CONNECT and SOCKS5 on one port); the
// grant's default environment points HTTP_PROXY, HTTPS_PROXY and
// ALL_PROXY at it.
const EgressPort = 3128

// ProxyUser is implemented by machines whose grant's default environment
// can point at the egress proxy. The service calls UseEgressProxy(true)
// before the Grant of a computer it gives egress (and again after it
// adopts one); every later Grant then sets HTTP_PROXY, HTTPS_PROXY,
// ALL_PROXY and NO_PROXY (and their lower-case forms) for the grant's
// commands. Without it the environment is unchanged.
type ProxyUser interface {
	UseEgressProxy(on bool)
}

// RefusalRecorder is implemented by machines that show the egress
// proxy's refusals to the commands inside the computer (the namespaced
// provisioner appends them to a bounded file there). The service calls
// RecordRefusal from the refused callback it hands Egress.Attach, never
// concurrently for one machine.
type RefusalRecorder interface {
	RecordRefusal(r policy.Refusal) error
	// RefusalLog is the path, inside the computer, of the file.
	RefusalLog() string
}
