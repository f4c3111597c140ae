// Package ports picks TCP ports for code that must name a port before
// something else binds it (a receiver's loopback listener, a confined
// child, QEMU). Listening on port 0 and closing the listener gives a port
// of the kernel's ephemeral range, which the kernel may hand out again at
// once as the source port of any connection on the machine (another
// test's client, a package download): the later bind then fails with
// "address in use". A port below the ephemeral range is only ever taken
// by an explicit bind, so Pick picks one there.
package ports

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// rangeFile holds the kernel's ephemeral port range ("low high").
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// lowest is the first port Pick considers: below it lie well-known and
// registered ports that daemons bind.
const lowest = 10000

// Pick returns a TCP port below the kernel's ephemeral range that was
// free on every IPv4 address a moment ago. Nothing holds it: the caller
// binds it (or has a child bind it) next. It fails when the range file
// cannot be read or no port is free.
func Pick() (uint16, error) {
	low, err := ephemeralLow(rangeFile)
	if err != nil {
		return 0, fmt.Errorf("ports: %w", err)
	}
	p, err := pick(low, free)
	if err != nil {
		return 0, fmt.Errorf("ports: %w", err)
	}
	return p, nil
}

// ephemeralLow reads the first port of the ephemeral range.
func ephemeralLow(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read the ephemeral port range: %w", err)
	}
	return parseLow(b)
}

// parseLow parses the range file's "low high" and returns low.
func parseLow(b []byte) (int, error) {
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, fmt.Errorf("ephemeral port range %q: want two ports", b)
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low < 1 || low > 65535 {
		return 0, fmt.Errorf("ephemeral port range %q: bad first port", b)
	}
	return low, nil
}

// pick tries the ports in [lowest, low) from a random start (so tests
// running at once rarely try the same one first) and returns the first
// that isFree says is free.
func pick(low int, isFree func(uint16) (bool, error)) (uint16, error) {
	n := low - lowest
	if n < 1 {
		return 0, fmt.Errorf("the ephemeral range starts at %d: no port in [%d, %d)", low, lowest, low)
	}
	start := rand.IntN(n)
	for i := range n {
		p := uint16(lowest + (start+i)%n)
		ok, err := isFree(p)
		if err != nil {
			return 0, err
		}
		if ok {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free TCP port in [%d, %d)", lowest, low)
}

// free reports whether a listener on 0.0.0.0:p can be made (which also
// rules out one on 127.0.0.1:p).
func free(p uint16) (bool, error) {
	l, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", p))
	if errors.Is(err, syscall.EADDRINUSE) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("listen on port %d: %w", p, err)
	}
	return true, l.Close()
}
