package view

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// ErrListen: the listen address is refused (not loopback or a unix
// socket without TLS, or malformed).
var ErrListen = errors.New("view listen address refused")

// Listen opens the view's listener. addr is "unix:/abs/path" (mode 0600;
// a reverse proxy on the same host fronts it), a loopback host:port
// ("127.0.0.1:8443", "[::1]:0", "localhost:0"), or, only when tlsConf is
// set, any host:port. It returns the listener and, for TCP, the origin
// browsers will send (http:// or https:// with the bound port).
func Listen(addr string, tlsConf *tls.Config) (net.Listener, string, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		return listenUnix(p, tlsConf)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %q: %w", ErrListen, addr, err)
	}
	if tlsConf == nil && !loopback(host) {
		return nil, "", fmt.Errorf("%w: %q is not loopback: give --tls-cert and --tls-key to listen on another address", ErrListen, addr)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, "", err
	}
	scheme := "http"
	if tlsConf != nil {
		scheme = "https"
		l = tls.NewListener(l, tlsConf)
	}
	bound := l.Addr().(*net.TCPAddr)
	return l, fmt.Sprintf("%s://%s", scheme, net.JoinHostPort(host, fmt.Sprint(bound.Port))), nil
}

// loopback accepts "localhost" and literal loopback addresses only: a
// name that could resolve elsewhere is not loopback.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func listenUnix(p string, tlsConf *tls.Config) (net.Listener, string, error) {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return nil, "", fmt.Errorf("%w: unix:%q is not an absolute clean path", ErrListen, p)
	}
	l, err := net.Listen("unix", p)
	if err != nil {
		return nil, "", err
	}
	if err := os.Chmod(p, 0o600); err != nil {
		l.Close()
		return nil, "", err
	}
	if tlsConf != nil {
		l = tls.NewListener(l, tlsConf)
	}
	return l, "", nil
}

// ParseOrigin checks an origin ("https://view.example:8443") and returns
// it normalised: scheme http or https, a host, no path, query, fragment
// or user info.
func ParseOrigin(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", fmt.Errorf("%w: origin %q: want scheme://host[:port]", ErrListen, s)
	}
	return u.Scheme + "://" + strings.ToLower(u.Host), nil
}
