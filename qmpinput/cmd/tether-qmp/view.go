package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/auditlog"
	"github.com/tetherdev/tether/qmpinput/statedir"
	"github.com/tetherdev/tether/qmpinput/token"
	"github.com/tetherdev/tether/qmpinput/view"
)

// viewFile records the running view's origin in the state directory, so
// token mint can print a link without being told where the view is.
const viewFile = "view.json"

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func cmdView(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("view", "view --socket QMP.sock --vnc VNC.sock --state DIR [--listen ADDR] [flags]\n\n"+
		"Serves the live view: the VM's screen (QEMU's VNC on a pinned unix socket) in a browser,\n"+
		"with take over, hand back, pause and resume. Mint links with 'tether-qmp token mint'.\n"+
		"Listens on loopback or a unix socket; another address needs --tls-cert and --tls-key.\n"+
		"Prints one JSON line with the origin, then serves until interrupted.")
	var af adapterFlags
	af.register(fs)
	vnc := fs.String("vnc", "", "absolute path of QEMU's VNC unix socket (-vnc unix:PATH,share=force-shared; required)")
	state := fs.String("state", "", "state directory for tokens and the audit log (created 0700; required)")
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on: loopback host:port, unix:/path, or any host:port with TLS")
	cert := fs.String("tls-cert", "", "TLS certificate (PEM); required for a non-loopback --listen")
	key := fs.String("tls-key", "", "TLS private key (PEM)")
	maxHold := fs.Duration("max-hold", view.DefaultMaxHold, "longest take over (at most 1h); a hold never outlives its token")
	agent := fs.String("agent", "", "unix socket (created 0600) where the agent runs scripts with 'tether-qmp run --via'; the view holds the only QMP connection, so the agent must come through it to be fenced")
	var origins listFlag
	fs.Var(&origins, "origin", "origin browsers use (scheme://host:port), repeatable; required for unix:/path or behind a proxy")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if *vnc == "" || *state == "" {
		fmt.Fprintln(stderr, "view: --vnc and --state are required (and --socket)")
		return exitUsage
	}
	return serveView(ctx, viewOpts{af: &af, vnc: *vnc, state: *state, listen: *listen, cert: *cert, key: *key,
		maxHold: *maxHold, origins: origins, agent: *agent}, stdout, stderr)
}

type viewOpts struct {
	af                                   *adapterFlags
	vnc, state, listen, cert, key, agent string
	maxHold                              time.Duration
	origins                              []string
}

func serveView(ctx context.Context, o viewOpts, stdout, stderr io.Writer) int {
	dir, err := statedir.Open(o.state)
	if err != nil {
		return fail(stdout, exitFailed, err)
	}
	defer dir.Close()
	tlsConf, err := loadTLS(o.cert, o.key)
	if err != nil {
		return fail(stdout, exitFailed, err)
	}
	l, origin, err := view.Listen(o.listen, tlsConf)
	if err != nil {
		return fail(stdout, exitFailed, err)
	}
	defer l.Close()
	if origin != "" {
		o.origins = append([]string{origin}, o.origins...)
	}
	if len(o.origins) == 0 {
		return fail(stdout, exitFailed, fmt.Errorf("%w: --origin is required with %s", view.ErrListen, o.listen))
	}
	aud := view.NewAuditor(auditlog.New(dir, nil))
	a, err := openWithAudit(ctx, o.af, aud.Record)
	if err != nil {
		return fail(stdout, exitFailed, err)
	}
	defer a.Close()
	if paused, err := view.RestorePause(dir, a); err != nil {
		return fail(stdout, exitFailed, err)
	} else if paused {
		fmt.Fprintln(stderr, "view: the audit log says the VM was left paused; agent input stays fenced until Resume")
	}
	srv, err := view.New(view.Config{Adapter: a, VNC: o.vnc, VNCOwner: ownerOf(o.af), Tokens: token.Open(dir, nil),
		Auditor: aud, Origins: o.origins, MaxHold: o.maxHold,
		Logf: func(f string, args ...any) { fmt.Fprintf(stderr, "view: "+f+"\n", args...) }})
	if err != nil {
		return fail(stdout, exitFailed, err)
	}
	if err := writeViewFile(dir, o.origins[0]); err != nil {
		return fail(stdout, exitFailed, err)
	}
	stopAgent, err := startAgent(ctx, o, a)
	if err != nil {
		srv.Close()
		return fail(stdout, exitFailed, err)
	}
	defer stopAgent()
	if code := emit(stdout, stderr, map[string]any{"ok": true, "origin": o.origins[0], "listen": l.Addr().String(), "agent": o.agent}); code != exitOK {
		return code
	}
	if err := srv.Serve(ctx, l); err != nil {
		fmt.Fprintf(stderr, "view: %v\n", err)
		return exitFailed
	}
	return exitOK
}

// startAgent serves the agent socket, if asked, until the returned
// function is called.
func startAgent(ctx context.Context, o viewOpts, a *qmpinput.Adapter) (func(), error) {
	if o.agent == "" {
		return func() {}, nil
	}
	if !filepath.IsAbs(o.agent) {
		return nil, fmt.Errorf("%w: --agent %q is not an absolute path", qmpinput.ErrConfig, o.agent)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: o.agent, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(o.agent, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		view.ServeAgent(actx, l, a, uint32(os.Geteuid()), o.af.timeout)
	}()
	return func() { cancel(); <-done }, nil
}

func openWithAudit(ctx context.Context, af *adapterFlags, audit func(qmpinput.AuditEvent)) (*qmpinput.Adapter, error) {
	cfg, err := af.config()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", qmpinput.ErrConfig, err)
	}
	cfg.Audit = audit
	octx, cancel := context.WithTimeout(ctx, af.timeout)
	defer cancel()
	return qmpinput.Open(octx, cfg)
}

func ownerOf(af *adapterFlags) *uint32 {
	if af.owner < 0 {
		return nil
	}
	o := uint32(af.owner)
	return &o
}

func loadTLS(cert, key string) (*tls.Config, error) {
	if cert == "" && key == "" {
		return nil, nil
	}
	if cert == "" || key == "" {
		return nil, fmt.Errorf("%w: --tls-cert and --tls-key go together", view.ErrListen)
	}
	c, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", view.ErrListen, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS12}, nil
}

func writeViewFile(dir *statedir.Dir, origin string) error {
	b, _ := json.Marshal(map[string]string{"origin": origin})
	return dir.WriteAtomic(viewFile, append(b, '\n'))
}

// readViewOrigin returns the origin the running view recorded, if any.
func readViewOrigin(dir *statedir.Dir) string {
	b, err := dir.ReadFile(viewFile, 4096)
	if err != nil {
		return ""
	}
	var v struct {
		Origin string `json:"origin"`
	}
	if json.Unmarshal(b, &v) != nil {
		return ""
	}
	o, err := view.ParseOrigin(v.Origin)
	if err != nil {
		return ""
	}
	return o
}
