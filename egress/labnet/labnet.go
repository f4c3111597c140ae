// Package labnet is a small internet in a network namespace, for the
// demo and for tests: what `tether-computer demo` starts to show a
// computer's egress, and what the egress tests' fake internet
// (fixtures/fakenet) builds on.
//
// # What a Net is
//
// New makes, as root:
//
//   - a network namespace of its own, joined to the host's namespace by a
//     veth pair on a /29 drawn at random from 10.128.0.0/9 (the host end
//     is .1, the servers .2). A range is claimed with an abstract unix
//     socket named for it and must overlap no address or route of the
//     host, so Nets made at once in different processes never collide,
//     and a crashed process leaks nothing (the kernel frees the socket,
//     the namespace and the veth pair with the process). The host reaches
//     the range by the veth's connected route; the namespace has no
//     default route, so it reaches nothing else, and nothing but the
//     host's namespace reaches it. Prefix is the range: the egress
//     proxy refuses private addresses, so an operator preset lifts it
//     with AllowCIDRs.
//   - a DNS server (github.com/miekg/dns, UDP and TCP on DNSAddr) that
//     answers only the names set in Zone.
//   - a TCP listener on each of Options.Ports, on which ServeHTTP and
//     ServeHTTPS run web servers.
//
// # How the servers live in the namespace
//
// A goroutine locks its OS thread, unshares the thread's network
// namespace, opens the listeners there, and joins the host's namespace
// again before it unlocks (a thread that cannot get back stays locked,
// so the runtime ends it, and New fails); no thread of the process stays
// in the namespace. A socket keeps the namespace it was made in, so the
// servers run on ordinary goroutines of the host's namespace.
//
// # Who closes what
//
// New's caller calls Close once. Close stops the servers and waits for
// their goroutines, deletes the veth pair, drops the last reference to
// the namespace and releases the range. It is safe to call twice.
package labnet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// Options say what a Net listens on besides DNS.
type Options struct {
	// Ports are the TCP ports to listen on, inside the namespace on its
	// wildcard address (80 and 443 for a web server). 53 is DNS's.
	Ports []int
}

// Net is one running lab network. Its fields are read-only.
type Net struct {
	// Prefix is the /29 of the veth pair (lift it with AllowCIDRs).
	Prefix netip.Prefix
	// HostAddr is the host end of the veth pair.
	HostAddr netip.Addr
	// Addr is where every server listens.
	Addr netip.Addr
	// DNSAddr is the DNS server (UDP and TCP).
	DNSAddr netip.AddrPort
	// Zone is what the DNS server answers; it may be changed at any time.
	Zone *Zone
	// Namespace is the inode of the namespace (as in /proc/PID/ns/net).
	Namespace uint64

	ns      *os.File
	link    *link
	lns     listeners
	mu      sync.Mutex
	servers []func() error
	wg      sync.WaitGroup
	once    sync.Once
	errc    chan error
}

// New builds a lab network and starts its DNS server (see the package
// comment). The caller must call Close. It needs root (CAP_NET_ADMIN and
// CAP_SYS_ADMIN).
func New(ctx context.Context, opts Options) (n *Net, err error) {
	for _, p := range opts.Ports {
		if p < 1 || p > 65535 || p == 53 {
			return nil, fmt.Errorf("labnet: port %d: want 1-65535, not 53 (DNS)", p)
		}
	}
	n = &Net{Zone: newZone(), errc: make(chan error, 4)}
	defer func() {
		if err != nil {
			n.Close()
			n = nil
		}
	}()
	if err := n.startNetwork(ctx, opts.Ports); err != nil {
		return n, err
	}
	udp := &dns.Server{PacketConn: n.lns.dnsUDP, Handler: n.Zone}
	tcp := &dns.Server{Listener: n.lns.dnsTCP, Handler: n.Zone}
	n.serve(udp.Shutdown, udp.ActivateAndServe)
	n.serve(tcp.Shutdown, tcp.ActivateAndServe)
	return n, nil
}

func (n *Net) startNetwork(ctx context.Context, ports []int) error {
	ns, lns, err := newNamespace(ports)
	if err != nil {
		return err
	}
	n.ns, n.lns = ns, lns
	var st unix.Stat_t
	if err := unix.Fstat(int(ns.Fd()), &st); err != nil {
		return fmt.Errorf("labnet: stat the namespace: %w", err)
	}
	n.Namespace = st.Ino
	if n.link, err = newLink(ctx, ns); err != nil {
		return err
	}
	n.Prefix, n.HostAddr, n.Addr = n.link.prefix, n.link.HostAddr(), n.link.ServerAddr()
	n.DNSAddr = netip.AddrPortFrom(n.Addr, 53)
	return nil
}

// ErrNoPort is returned for a port not in Options.Ports.
var ErrNoPort = errors.New("labnet: no listener on that port (Options.Ports)")

// Listener returns the listener on port (nil for a port not in
// Options.Ports). The Net owns it and closes it on Close; a caller that
// serves on it itself stops serving by then.
func (n *Net) Listener(port int) net.Listener { return n.lns.tcp[port] }

// ServeHTTP serves h over plain HTTP on port until Close.
func (n *Net) ServeHTTP(port int, h http.Handler) error {
	ln := n.Listener(port)
	if ln == nil {
		return fmt.Errorf("%w: %d", ErrNoPort, port)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	n.serve(srv.Close, func() error { return srv.Serve(ln) })
	return nil
}

// ServeHTTPS serves h over HTTPS with cert on port until Close.
func (n *Net) ServeHTTPS(port int, h http.Handler, cert tls.Certificate) error {
	ln := n.Listener(port)
	if ln == nil {
		return fmt.Errorf("%w: %d", ErrNoPort, port)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	n.serve(srv.Close, func() error { return srv.ServeTLS(ln, "", "") })
	return nil
}

// serve runs one server on its own goroutine; stop ends it on Close.
func (n *Net) serve(stop func() error, run func() error) {
	n.mu.Lock()
	n.servers = append(n.servers, stop)
	n.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := run(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			select {
			case n.errc <- err:
			default:
			}
		}
	}()
}

// Close stops everything New started and removes what it made (see the
// package comment). The second call does nothing.
func (n *Net) Close() error {
	var errs []error
	n.once.Do(func() {
		n.mu.Lock()
		stops := n.servers
		n.mu.Unlock()
		for _, stop := range stops {
			stop()
		}
		n.lns.close()
		n.wg.Wait()
		if n.link != nil {
			errs = append(errs, n.link.close())
		}
		if n.ns != nil {
			errs = append(errs, n.ns.Close())
		}
	})
	return errors.Join(errs...)
}

// Err reports the first error a server's goroutine ended with, if any.
func (n *Net) Err() error {
	select {
	case err := <-n.errc:
		return err
	default:
		return nil
	}
}
