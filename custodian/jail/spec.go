package jail

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/tetherdev/tether/egress/policy"
)

// Options are what Build needs besides the Config.
type Options struct {
	// Config is the operator's jail config (allowlists, network, ids).
	Config Config
	// Argv is the agent's command line. Argv[0] is an absolute path or a
	// name looked up in Env's PATH; it is allowed to execute, with its
	// ELF interpreter or its script interpreter.
	Argv []string
	// Root is the tuple root: the agent's cwd, shown as an empty read-only
	// placeholder. The computer's files are never visible.
	Root string
	// Env is the agent's environment before the jail sets HOME, TMPDIR,
	// PATH, USER and PWD and drops variables that name host places
	// (XDG_*, SSH_AUTH_SOCK, DBUS_SESSION_BUS_ADDRESS).
	Env []string
	// Hidden lists host paths that must never become visible: the
	// custodian's state directory and key files. An allowlisted path that
	// is one of them, lies inside one or contains one is refused.
	Hidden []string
	// Helper is the host path of this binary (the init and the shell
	// stubs); "" means os.Executable().
	Helper string
	// Listen lets the agent listen(2) under NetworkHost: a tether agent's
	// plugin serves go-plugin's unix socket. Binding a TCP socket stays
	// refused (Landlock), but a TCP socket listened on without a bind
	// gets an ephemeral port on the host (SECURITY.md, "The agent
	// process"). Plain agents never get it.
	Listen bool
	// ScratchParent is the host directory in which a per-jail directory is
	// made for the private tmpfs (mounted only in the jail's mount
	// namespace); "" means os.TempDir().
	ScratchParent string
	// LockDir holds the per-uid lock files of live jails; "" means
	// DefaultLockDir.
	LockDir string
	// Egress is the proxy that serves the jail under NetworkProxy
	// (required there, unused otherwise). The caller owns it and keeps
	// it running while the jail runs; Start attaches the jail to it and
	// Wait detaches it.
	Egress Egress
}

// View is one host path shown in the jail.
type View struct {
	// Dest is the path inside the jail; Source the host path it shows (the
	// configured path with symlinks resolved).
	Dest, Source string
	// Link, when set, replicates a symlink (its text) instead of a bind:
	// used when the link's target is itself shown at its own path.
	Link string
}

// Spec is a jail ready to start: everything resolved and checked. Build
// makes it; Start runs it.
type Spec struct {
	// Path is the agent's program inside the jail (absolute); Argv its
	// command line, Argv[0] as given.
	Path string
	Argv []string
	// Env is the agent's whole environment.
	Env []string
	// Root is the placeholder and the agent's cwd.
	Root string
	// UID and GID run the agent when Pinned; otherwise Start draws a uid
	// (and the same gid) from UIDs for each jail, and they are 0 here.
	UID, GID uint32
	Pinned   bool
	UIDs     IDRange
	// MaxMemory and MaxPids are the jail's limits; Cgroup is
	// CgroupRequired or CgroupOff.
	MaxMemory, MaxPids int64
	Cgroup             string
	// Network is NetworkHost, NetworkNone or NetworkProxy.
	Network string
	// EgressPolicy and EgressPort are the agent's own egress policy and
	// the proxy's port on the jail's loopback (NetworkProxy).
	EgressPolicy policy.Policy
	EgressPort   int
	// egress serves the jail under NetworkProxy (Options.Egress).
	egress Egress
	// Listen allows listen(2) under NetworkHost (Options.Listen).
	Listen bool
	// Bwrap is bubblewrap's path.
	Bwrap string
	// Read is shown read-only; Exec is shown read-only and allowed to
	// execute (Dest paths).
	Read, Exec []View
	// Stubs are jail paths where the shell stub is placed.
	Stubs []string
	// Helper is the host path of the init and stub binary.
	Helper string
	// ScratchParent holds the per-jail directory of the private tmpfs.
	ScratchParent string
	// LockDir holds the per-uid lock files of live jails.
	LockDir string
	// TmpSize bounds HOME and /tmp together, in bytes.
	TmpSize int64

	bounds string // Start's line about the uid, cgroup and limits, for Banner
}

// Build resolves and checks everything a jail needs, touching nothing
// but reads of the named paths. Errors name the failed check and wrap
// ErrConfig or ErrHidden.
func Build(o Options) (*Spec, error) {
	s := &Spec{Argv: slices.Clone(o.Argv), Network: o.Config.Network, Listen: o.Listen, Bwrap: o.Config.Bwrap, egress: o.Egress,
		UIDs: IDRange{DefaultUIDFirst, DefaultUIDLast}, MaxMemory: DefaultMaxMemory, MaxPids: DefaultMaxPids,
		Cgroup: CgroupRequired, Helper: o.Helper, ScratchParent: o.ScratchParent, LockDir: o.LockDir, TmpSize: DefaultTmpSize}
	if err := s.fillDefaults(o.Config); err != nil {
		return nil, err
	}
	if err := checkRoot(o.Root); err != nil {
		return nil, err
	}
	s.Root = o.Root
	if len(o.Argv) == 0 || o.Argv[0] == "" {
		return nil, fmt.Errorf("%w: the agent's command is empty", ErrConfig)
	}
	b := &builder{spec: s, hidden: resolveAll(o.Hidden), root: o.Root}
	if err := b.build(o); err != nil {
		return nil, err
	}
	s.Env = agentEnv(o.Env, o.Root)
	if s.Network == NetworkProxy {
		s.Env = proxyEnv(s.Env, s.EgressPort)
	}
	return s, nil
}

// fillDefaults applies the config's scalar fields and their defaults.
func (s *Spec) fillDefaults(c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if err := s.fillNetwork(c); err != nil {
		return err
	}
	if err := s.fillIDs(c); err != nil {
		return err
	}
	if c.MaxMemoryBytes != nil {
		s.MaxMemory = *c.MaxMemoryBytes
	}
	if c.MaxPids != nil {
		s.MaxPids = *c.MaxPids
	}
	if c.Cgroup != "" {
		s.Cgroup = c.Cgroup
	}
	if s.LockDir == "" {
		s.LockDir = DefaultLockDir
	}
	if !filepath.IsAbs(s.LockDir) || filepath.Clean(s.LockDir) != s.LockDir {
		return fmt.Errorf("%w: lock directory %q is not an absolute clean path", ErrConfig, s.LockDir)
	}
	if s.Bwrap == "" {
		s.Bwrap = DefaultBwrap
	}
	if !filepath.IsAbs(s.Bwrap) {
		return fmt.Errorf("%w: bwrap %q is not an absolute path", ErrConfig, s.Bwrap)
	}
	if s.ScratchParent == "" {
		s.ScratchParent = os.TempDir()
	}
	return checkScratch(s.ScratchParent)
}

// fillNetwork applies jail.network (default NetworkHost) and, under
// NetworkProxy, the agent's egress policy and port; the proxy itself
// must be given (Options.Egress).
func (s *Spec) fillNetwork(c Config) error {
	if s.Network == "" {
		s.Network = NetworkHost
	}
	if s.Network != NetworkProxy {
		return nil
	}
	if s.egress == nil {
		return fmt.Errorf("%w: jail.network %q needs an egress proxy, and none was given", ErrConfig, NetworkProxy)
	}
	if c.Egress != nil {
		s.EgressPolicy = *c.Egress
	}
	s.EgressPort = DefaultEgressPort
	if c.EgressPort != 0 {
		s.EgressPort = c.EgressPort
	}
	return nil
}

// fillIDs pins the agent's ids (jail.uid, jail.gid, the gid defaulting
// to the uid) or keeps the range each jail draws its own from.
func (s *Spec) fillIDs(c Config) error {
	if c.UIDRange != nil {
		s.UIDs = *c.UIDRange
	}
	if c.UID == nil {
		return nil
	}
	s.Pinned, s.UID, s.GID = true, *c.UID, *c.UID
	if c.GID != nil {
		s.GID = *c.GID
	}
	if s.UID == 0 || s.GID == 0 {
		return fmt.Errorf("%w: uid %d, gid %d: the agent never runs as root or group 0", ErrConfig, s.UID, s.GID)
	}
	return nil
}

// checkScratch refuses a scratch parent the agent's uid could not reach:
// bubblewrap, running as that uid, binds HOME and /tmp from beneath it,
// and would fail with a bare "Permission denied". A private TMPDIR (a
// 0700 directory) is the usual cause.
func checkScratch(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%w: scratch directory %q (TMPDIR) is not absolute", ErrConfig, dir)
	}
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("%w: scratch directory %s (TMPDIR): %w", ErrConfig, dir, err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%w: scratch directory %s (TMPDIR) is out of the agent's reach: %s is mode %v, not traversable by others; "+
				"set TMPDIR to a directory every user can traverse, such as /tmp", ErrConfig, dir, d, fi.Mode().Perm())
		}
		if d == "/" {
			return nil
		}
	}
}

// fixedPaths are the jail's own mount points; the tuple root may be none
// of them, contain one, or lie beneath one that is read-only.
var fixedPaths = []string{"/proc", "/dev", "/.tether", "/etc", Home, Tmp}

// checkRoot refuses a tuple root the placeholder cannot take without
// hiding or replacing part of the jail.
func checkRoot(root string) error {
	if root == "" || !filepath.IsAbs(root) || filepath.Clean(root) != root {
		return fmt.Errorf("%w: tuple root %q is not an absolute clean path", ErrConfig, root)
	}
	if root == "/" {
		return fmt.Errorf("%w: tuple root is /: the placeholder would hide the whole jail", ErrConfig)
	}
	for _, p := range fixedPaths {
		if within(root, p) {
			return fmt.Errorf("%w: tuple root %s would cover the jail's %s", ErrConfig, root, p)
		}
	}
	for _, p := range []string{"/proc", "/dev", "/.tether", "/etc"} {
		if within(p, root) {
			return fmt.Errorf("%w: tuple root %s lies inside the jail's %s", ErrConfig, root, p)
		}
	}
	return nil
}

// builder collects the views of one Spec.
type builder struct {
	spec   *Spec
	hidden []string
	root   string
}

func (b *builder) build(o Options) error {
	if err := b.addAgent(o.Argv[0], envPath(o.Env)); err != nil {
		return err
	}
	for _, p := range o.Config.Exec {
		if err := b.addExec(p, "jail.exec"); err != nil {
			return err
		}
	}
	if err := b.addHelper(); err != nil {
		return err
	}
	for _, p := range DefaultRead {
		if err := b.addRead(p, true); err != nil {
			return err
		}
	}
	for _, p := range o.Config.Read {
		if err := b.addRead(p, false); err != nil {
			return err
		}
	}
	b.linkSymlinks()
	b.stubs()
	return nil
}

// addAgent resolves argv[0] and allows it, with its interpreter.
func (b *builder) addAgent(name, pathEnv string) error {
	path, err := lookPath(name, pathEnv)
	if err != nil {
		return err
	}
	b.spec.Path = path
	return b.addExec(path, "the agent's program")
}

// addExec allows one executable and its interpreters (ELF PT_INTERP, or a
// script's #! line, with `env NAME` resolved in the agent's PATH).
func (b *builder) addExec(p, what string) error {
	v, err := b.view(p, what, false)
	if err != nil || v == nil {
		return err
	}
	if st, err := os.Stat(v.Source); err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("%w: %s %s is not a regular file (name executables, not directories)", ErrConfig, what, p)
	}
	if slices.ContainsFunc(b.spec.Exec, func(e View) bool { return e.Dest == v.Dest }) {
		return nil
	}
	b.spec.Exec = append(b.spec.Exec, *v)
	interps, err := interpreters(v.Source)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrConfig, what, p, err)
	}
	for _, in := range interps {
		if err := b.addExec(in, "the interpreter of "+p); err != nil {
			return err
		}
	}
	return nil
}

// addHelper checks the init/stub binary (it is shown at InitPath and the
// stub paths, not at its host path) and allows its interpreter.
func (b *builder) addHelper() error {
	if b.spec.Helper == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("%w: find this binary for the jail's init: %w", ErrConfig, err)
		}
		b.spec.Helper = exe
	}
	src, err := filepath.EvalSymlinks(b.spec.Helper)
	if err != nil {
		return fmt.Errorf("%w: the jail's init %s: %w", ErrConfig, b.spec.Helper, err)
	}
	b.spec.Helper = src
	if err := b.reachable(src, "the jail's init (this binary)"); err != nil {
		return err
	}
	interps, err := interpreters(src)
	if err != nil {
		return fmt.Errorf("%w: the jail's init %s: %w", ErrConfig, src, err)
	}
	for _, in := range interps {
		if err := b.addExec(in, "the interpreter of the jail's init"); err != nil {
			return err
		}
	}
	return nil
}

// addRead shows one path read-only. A missing optional (default) path is
// skipped; a missing configured one is an error.
func (b *builder) addRead(p string, optional bool) error {
	v, err := b.view(p, "jail.read", optional)
	if err != nil || v == nil {
		return err
	}
	if slices.ContainsFunc(b.spec.Read, func(e View) bool { return e.Dest == v.Dest }) {
		return nil
	}
	b.spec.Read = append(b.spec.Read, *v)
	return nil
}

// view resolves p and checks it against what must stay hidden.
func (b *builder) view(p, what string, optional bool) (*View, error) {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return nil, fmt.Errorf("%w: %s %q is not an absolute clean path", ErrConfig, what, p)
	}
	src, err := filepath.EvalSymlinks(p)
	if errors.Is(err, fs.ErrNotExist) && optional {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: %w", ErrConfig, what, p, err)
	}
	for _, h := range b.hidden {
		if related(src, h) || related(p, h) {
			return nil, fmt.Errorf("%w: %s %s would show %s, which the agent must never see", ErrHidden, what, p, h)
		}
	}
	if related(src, b.root) || related(p, b.root) {
		return nil, fmt.Errorf("%w: %s %s would show the tuple root %s: the computer's files are never visible to the agent", ErrHidden, what, p, b.root)
	}
	for _, f := range []string{"/proc", "/dev", "/.tether"} {
		if within(f, p) || within(p, f) {
			return nil, fmt.Errorf("%w: %s %s collides with the jail's own %s", ErrConfig, what, p, f)
		}
	}
	if err := b.reachable(src, what+" "+p); err != nil {
		return nil, err
	}
	return &View{Dest: p, Source: src}, nil
}

// reachable refuses a source that bubblewrap, running as the agent's uid,
// could not reach: every directory above it must be searchable by that uid
// (as owner, group or other). Without this check bwrap fails with a bare
// "Permission denied" (an agent or a tether-custodian installed under a
// 0700 home is the usual cause).
func (b *builder) reachable(src, what string) error {
	for d := filepath.Dir(src); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrConfig, what, err)
		}
		if !searchable(fi, b.spec.UID, b.spec.GID, b.spec.Pinned) {
			return fmt.Errorf("%w: %s is out of the agent's reach: %s is mode %v, not searchable by the jail's uid (%s); "+
				"install it where every user can traverse", ErrConfig, what, d, fi.Mode().Perm(), b.spec.uidText())
		}
		if d == "/" {
			return nil
		}
	}
}

// searchable reports whether uid/gid may search directory fi; unpinned,
// the uid is not known yet and owns nothing, so only "other" counts.
func searchable(fi fs.FileInfo, uid, gid uint32, pinned bool) bool {
	perm := fi.Mode().Perm()
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !pinned:
		return perm&0o001 != 0
	case ok && st.Uid == uid:
		return perm&0o100 != 0
	case ok && st.Gid == gid:
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// linkSymlinks turns a read entry that is a symlink into a replicated
// symlink when its target is shown at its own path (/lib -> usr/lib), so
// the jail looks like the host instead of showing a second copy.
func (b *builder) linkSymlinks() {
	shown := func(src string) bool {
		return slices.ContainsFunc(b.spec.Read, func(e View) bool { return e.Dest == e.Source && within(e.Source, src) })
	}
	for i, v := range b.spec.Read {
		if v.Dest == v.Source || !shown(v.Source) {
			continue
		}
		if fi, err := os.Lstat(v.Dest); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			if text, err := os.Readlink(v.Dest); err == nil {
				b.spec.Read[i].Link = text
			}
		}
	}
}

// stubs places the shell stub where a shell would be, unless that path is
// allowed to execute or another view already shows it.
func (b *builder) stubs() {
	for _, p := range StubPaths {
		if b.visible(p) || b.visible(filepath.Dir(p)) {
			continue
		}
		if strings.HasPrefix(p, "/bin/") && b.binIsLink() {
			continue
		}
		b.spec.Stubs = append(b.spec.Stubs, p)
	}
}

// visible reports whether a view shows p itself.
func (b *builder) visible(p string) bool {
	for _, vs := range [][]View{b.spec.Read, b.spec.Exec} {
		if slices.ContainsFunc(vs, func(v View) bool { return v.Dest == p }) {
			return true
		}
	}
	return false
}

// binIsLink reports whether the jail's /bin will be a symlink (the host's
// /bin is one, as on merged-/usr systems); the jail then makes it one too.
func (b *builder) binIsLink() bool {
	fi, err := os.Lstat("/bin")
	return err == nil && fi.Mode()&fs.ModeSymlink != 0
}

// lookPath finds the agent's program: an absolute path as is, a bare name
// in pathEnv. A relative path with a slash is refused.
func lookPath(name, pathEnv string) (string, error) {
	if filepath.IsAbs(name) {
		return filepath.Clean(name), nil
	}
	if strings.Contains(name, "/") {
		return "", fmt.Errorf("%w: the agent's program %q is relative: give an absolute path or a name found in PATH", ErrConfig, name)
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: the agent's program %q is not found in PATH %q", ErrConfig, name, pathEnv)
}

// envPath returns PATH from env.
func envPath(env []string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			return v
		}
	}
	return ""
}

// dropped are variables that name places on the host the agent cannot
// see; they are removed rather than left dangling.
var dropped = []string{"HOME", "TMPDIR", "PATH", "PWD", "OLDPWD", "USER", "LOGNAME", "SHELL",
	"SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME",
	"XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_CONFIG_DIRS", "XDG_DATA_DIRS"}

// agentEnv is base without dropped variables, plus the jail's own.
func agentEnv(base []string, root string) []string {
	var env []string
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(dropped, name) {
			env = append(env, kv)
		}
	}
	return append(env, "HOME="+Home, "TMPDIR="+Tmp, "PATH="+agentPath, "USER=agent", "LOGNAME=agent", "PWD="+root)
}

// proxyNames are the variables that point clients at a proxy, in both
// cases (curl reads only the lower-case http_proxy).
var proxyNames = []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
	"http_proxy", "https_proxy", "all_proxy", "no_proxy"}

// proxyEnv replaces every proxy variable of env with the jail's proxy on
// 127.0.0.1:port: HTTP forward and CONNECT for HTTP_PROXY and
// HTTPS_PROXY, SOCKS5 with the name resolved by the proxy for ALL_PROXY.
// NO_PROXY is set empty: the jail's loopback holds nothing but the proxy,
// so every destination, the host's loopback included, goes through it
// (where the policy decides).
func proxyEnv(env []string, port int) []string {
	env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(proxyNames, name)
	})
	http := fmt.Sprintf("http://127.0.0.1:%d", port)
	socks := fmt.Sprintf("socks5h://127.0.0.1:%d", port)
	for _, kv := range [][2]string{{"HTTP_PROXY", http}, {"HTTPS_PROXY", http}, {"ALL_PROXY", socks}, {"NO_PROXY", ""}} {
		env = append(env, kv[0]+"="+kv[1], strings.ToLower(kv[0])+"="+kv[1])
	}
	return env
}

// resolveAll cleans each path and resolves its symlinks where it exists.
func resolveAll(ps []string) []string {
	var out []string
	for _, p := range ps {
		if p == "" {
			continue
		}
		out = append(out, filepath.Clean(p))
		if r, err := filepath.EvalSymlinks(p); err == nil && r != filepath.Clean(p) {
			out = append(out, r)
		}
	}
	return out
}

// egressForDigest is the egress policy under NetworkProxy, nil otherwise
// (so the digest of a jail without the proxy is what it always was).
func (s *Spec) egressForDigest() *policy.Policy {
	if s.Network != NetworkProxy {
		return nil
	}
	return &s.EgressPolicy
}

// within reports whether p is dir or lies beneath it.
func within(dir, p string) bool {
	if dir == "/" {
		return true
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// related reports whether a and b are the same path or one contains the
// other.
func related(a, b string) bool { return within(a, b) || within(b, a) }

// uidText names the agent's uid for messages: the pinned one, or the
// range it will be drawn from.
func (s *Spec) uidText() string {
	if s.Pinned {
		return fmt.Sprintf("%d", s.UID)
	}
	return fmt.Sprintf("one drawn from %d-%d", s.UIDs.First, s.UIDs.Last)
}

// Digest is the hex SHA-256 of what the jail shows and allows (program,
// argv, root, ids or their range, limits, network, bwrap, views, stubs,
// init), for the audit log. The environment is left out: it may hold the
// agent's credentials.
func (s *Spec) Digest() string {
	data, _ := json.Marshal(struct {
		Path, Root, Network, Bwrap, Helper, Cgroup string
		Argv, Stubs                                []string
		UID, GID                                   uint32
		Pinned                                     bool
		UIDs                                       IDRange
		Read, Exec                                 []View
		TmpSize, MaxMemory, MaxPids                int64
		Egress                                     *policy.Policy `json:",omitempty"`
		EgressPort                                 int            `json:",omitempty"`
	}{s.Path, s.Root, s.Network, s.Bwrap, s.Helper, s.Cgroup, s.Argv, s.Stubs, s.UID, s.GID, s.Pinned, s.UIDs,
		s.Read, s.Exec, s.TmpSize, s.MaxMemory, s.MaxPids, s.egressForDigest(), s.EgressPort})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
