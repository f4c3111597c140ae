package jail

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// buildFixture is a host layout for Build: an agent program (any regular
// executable file), a state directory with a key, a tuple root, a tools
// directory.
type buildFixture struct {
	dir, agent, state, key, root, tools string
}

func newBuildFixture(t *testing.T) *buildFixture {
	t.Helper()
	d := t.TempDir()
	// t.TempDir's directories are 0700: open them as an installation
	// directory would be, so only the cases that mean it are out of reach.
	mustDo(t, os.Chmod(filepath.Dir(d), 0o755))
	mustDo(t, os.Chmod(d, 0o755))
	f := &buildFixture{dir: d, agent: filepath.Join(d, "bin", "agent"), state: filepath.Join(d, "state"),
		root: filepath.Join(d, "computers", "w1"), tools: filepath.Join(d, "tools")}
	f.key = filepath.Join(f.state, "audit.key")
	for _, p := range []string{filepath.Dir(f.agent), f.state, f.root, f.tools} {
		mustDo(t, os.MkdirAll(p, 0o755))
	}
	mustDo(t, os.WriteFile(f.agent, []byte("not a program the kernel knows\n"), 0o755))
	mustDo(t, os.WriteFile(f.key, []byte("k"), 0o600))
	return f
}

func (f *buildFixture) options(cfg Config) Options {
	return Options{Config: cfg, Argv: []string{f.agent, "--acp"}, Root: f.root, Env: []string{"PATH=/usr/bin:/bin", "HOME=/root", "KEEP=1"},
		Hidden: []string{f.state, f.key}, Helper: f.agent}
}

func TestBuildRefuses(t *testing.T) {
	f := newBuildFixture(t)
	link := filepath.Join(f.dir, "link-to-state")
	mustDo(t, os.Symlink(f.state, link))
	uid0 := uint32(0)
	for _, c := range []struct {
		name string
		edit func(*Options)
		want error
	}{
		{"read the state dir", func(o *Options) { o.Config.Read = []string{f.state} }, ErrHidden},
		{"read a parent of the state dir", func(o *Options) { o.Config.Read = []string{f.dir} }, ErrHidden},
		{"read the key", func(o *Options) { o.Config.Read = []string{f.key} }, ErrHidden},
		{"read a symlink to the state dir", func(o *Options) { o.Config.Read = []string{link} }, ErrHidden},
		{"read the tuple root", func(o *Options) { o.Config.Read = []string{f.root} }, ErrHidden},
		{"read the computers' parent", func(o *Options) { o.Config.Read = []string{filepath.Dir(f.root)} }, ErrHidden},
		{"exec inside the tuple root", func(o *Options) {
			p := filepath.Join(f.root, "tool")
			mustDo(t, os.WriteFile(p, nil, 0o755))
			o.Config.Exec = []string{p}
		}, ErrHidden},
		{"exec a directory", func(o *Options) { o.Config.Exec = []string{f.tools} }, ErrConfig},
		{"read a missing path", func(o *Options) { o.Config.Read = []string{filepath.Join(f.dir, "missing")} }, ErrConfig},
		{"read a relative path", func(o *Options) { o.Config.Read = []string{"tools"} }, ErrConfig},
		{"read /proc", func(o *Options) { o.Config.Read = []string{"/proc/self"} }, ErrConfig},
		{"root is /", func(o *Options) { o.Root = "/" }, ErrConfig},
		{"root covers /tmp", func(o *Options) { o.Root = "/tmp" }, ErrConfig},
		{"root covers HOME", func(o *Options) { o.Root = "/home" }, ErrConfig},
		{"root inside /etc", func(o *Options) { o.Root = "/etc/w1" }, ErrConfig},
		{"root inside /usr/lib", func(o *Options) { o.Root = "/usr/lib/w1" }, ErrHidden},
		{"root not clean", func(o *Options) { o.Root = f.root + "/../w1" }, ErrConfig},
		{"relative agent", func(o *Options) { o.Argv = []string{"./agent"} }, ErrConfig},
		{"agent not in PATH", func(o *Options) { o.Argv = []string{"tether-no-such-agent"} }, ErrConfig},
		{"empty argv", func(o *Options) { o.Argv = nil }, ErrConfig},
		{"uid 0", func(o *Options) { o.Config.UID = &uid0 }, ErrConfig},
		{"gid without uid", func(o *Options) { g := uint32(5000); o.Config.GID = &g }, ErrConfig},
		{"uid range reversed", func(o *Options) { o.Config.UIDRange = &IDRange{First: 59999, Last: 59000} }, ErrConfig},
		{"uid range from 0", func(o *Options) { o.Config.UIDRange = &IDRange{First: 0, Last: 10} }, ErrConfig},
		{"memory below the minimum", func(o *Options) { m := int64(MinMemory - 1); o.Config.MaxMemoryBytes = &m }, ErrConfig},
		{"pids below the minimum", func(o *Options) { n := int64(MinPids - 1); o.Config.MaxPids = &n }, ErrConfig},
		{"unknown cgroup mode", func(o *Options) { o.Config.Cgroup = "auto" }, ErrConfig},
		{"relative lock directory", func(o *Options) { o.LockDir = "run/tether-jail" }, ErrConfig},
		{"unknown network", func(o *Options) { o.Config.Network = "bridge" }, ErrConfig},
		{"relative bwrap", func(o *Options) { o.Config.Bwrap = "bwrap" }, ErrConfig},
		{"private scratch directory", func(o *Options) {
			private := filepath.Join(f.dir, "private-tmp")
			mustDo(t, os.Mkdir(private, 0o700))
			o.ScratchParent = filepath.Join(private, "tmp")
			mustDo(t, os.Mkdir(o.ScratchParent, 0o777))
		}, ErrConfig},
		{"agent under a private directory", func(o *Options) {
			private := filepath.Join(f.dir, "private-home")
			mustDo(t, os.MkdirAll(filepath.Join(private, "bin"), 0o700))
			agent := filepath.Join(private, "bin", "agent")
			mustDo(t, os.WriteFile(agent, []byte("x"), 0o755))
			o.Argv = []string{agent}
		}, ErrConfig},
		{"init under a private directory", func(o *Options) {
			private := filepath.Join(f.dir, "private-init")
			mustDo(t, os.Mkdir(private, 0o700))
			o.Helper = filepath.Join(private, "tether-custodian")
			mustDo(t, os.WriteFile(o.Helper, []byte("x"), 0o755))
		}, ErrConfig},
		{"read under a private directory", func(o *Options) {
			private := filepath.Join(f.dir, "private-read")
			mustDo(t, os.MkdirAll(filepath.Join(private, "lib"), 0o750))
			mustDo(t, os.Chmod(private, 0o750))
			o.Config.Read = []string{filepath.Join(private, "lib")}
		}, ErrConfig},
		{"missing scratch directory", func(o *Options) { o.ScratchParent = filepath.Join(f.dir, "no-tmp") }, ErrConfig},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := f.options(Config{})
			c.edit(&o)
			_, err := Build(o)
			if !errors.Is(err, c.want) {
				t.Fatalf("Build: %v, want %v", err, c.want)
			}
		})
	}
}

func TestBuildSpec(t *testing.T) {
	f := newBuildFixture(t)
	script := filepath.Join(f.tools, "agent.js")
	mustDo(t, os.WriteFile(script, []byte("#!/usr/bin/env true\nconsole.log(1)\n"), 0o755))
	spec, err := Build(f.options(Config{Read: []string{f.tools}, Exec: []string{script}, Network: NetworkNone}))
	if err != nil {
		t.Fatal(err)
	}
	var exec []string
	for _, v := range spec.Exec {
		exec = append(exec, v.Dest)
	}
	truePath, err := lookPath("true", agentPath)
	mustDo(t, err)
	for _, want := range []string{f.agent, script, "/usr/bin/env", truePath} {
		if !slices.Contains(exec, want) {
			t.Errorf("exec allowlist %v lacks %s (the agent, the script, its #! interpreter and env's NAME)", exec, want)
		}
	}
	if slices.Contains(exec, f.tools) || len(exec) > 6 {
		t.Errorf("exec allowlist %v holds more than the programs and their loaders", exec)
	}
	if spec.Path != f.agent || !slices.Equal(spec.Argv, []string{f.agent, "--acp"}) {
		t.Errorf("path %s argv %v", spec.Path, spec.Argv)
	}
	for _, kv := range []string{"HOME=" + Home, "TMPDIR=" + Tmp, "PATH=" + agentPath, "KEEP=1", "PWD=" + f.root} {
		if !slices.Contains(spec.Env, kv) {
			t.Errorf("env %v lacks %s", spec.Env, kv)
		}
	}
	if slices.Contains(spec.Env, "HOME=/root") || slices.Contains(spec.Env, "PATH=/usr/bin:/bin") {
		t.Errorf("env %v keeps the host's HOME or PATH", spec.Env)
	}
	if spec.Pinned || spec.UID != 0 || spec.UIDs != (IDRange{DefaultUIDFirst, DefaultUIDLast}) || spec.Bwrap != DefaultBwrap ||
		spec.MaxMemory != DefaultMaxMemory || spec.MaxPids != DefaultMaxPids || spec.Cgroup != CgroupRequired || spec.LockDir != DefaultLockDir {
		t.Errorf("defaults: pinned %v uid %d range %v bwrap %s memory %d pids %d cgroup %q lock dir %s",
			spec.Pinned, spec.UID, spec.UIDs, spec.Bwrap, spec.MaxMemory, spec.MaxPids, spec.Cgroup, spec.LockDir)
	}
}

// TestBwrapArgsOrder checks what bwrap is told, in the order that makes
// it right: namespaces, writable directories before views, the
// placeholder after every view, the root read-only last, then the init.
func TestBwrapArgsOrder(t *testing.T) {
	f := newBuildFixture(t)
	for _, network := range []string{NetworkHost, NetworkNone} {
		spec, err := Build(f.options(Config{Read: []string{f.tools}, Network: network}))
		mustDo(t, err)
		spec.UID, spec.GID = 59999, 59999 // leased by Start
		a := bwrapArgs(spec, "/scratch/home", "/scratch/tmp")
		joined := strings.Join(a, " ")
		for _, want := range []string{"--unshare-user --uid 59999 --gid 59999 --disable-userns --unshare-pid --unshare-ipc --unshare-uts",
			"--die-with-parent --new-session", "--bind /scratch/home " + Home + " --bind /scratch/tmp " + Tmp,
			"--ro-bind " + f.tools + " " + f.tools,
			"--tmpfs " + f.root + " --remount-ro " + f.root + " --chdir " + f.root + " --remount-ro / " + InitPath + " " + InitArg} {
			if !strings.Contains(joined, want) {
				t.Errorf("network %s: bwrap args lack %q:\n%s", network, want, joined)
			}
		}
		if got := slices.Contains(a, "--unshare-net"); got != (network == NetworkNone) {
			t.Errorf("network %s: --unshare-net present %v", network, got)
		}
		if !strings.HasSuffix(joined, "--remount-ro / "+InitPath+" "+InitArg) {
			t.Errorf("the root is not made read-only last:\n%s", joined)
		}
		if strings.Index(joined, "--ro-bind "+f.tools) > strings.Index(joined, "--tmpfs "+f.root) {
			t.Errorf("a view comes after the placeholder:\n%s", joined)
		}
	}
}

func TestParseShebang(t *testing.T) {
	for _, c := range []struct {
		in, interp, arg string
		ok              bool
	}{
		{"#!/usr/bin/env node\n", "/usr/bin/env", "node", true},
		{"#! /bin/sh -e\nexit 0", "/bin/sh", "-e", true},
		{"#!/usr/bin/node\r\n", "/usr/bin/node", "", true},
		{"#!/usr/bin/env  node  --flag \n", "/usr/bin/env", "node  --flag", true},
		{"#!node\n", "", "", false},
		{"#!\n", "", "", false},
		{"echo hi\n", "", "", false},
		{"\x7fELF", "", "", false},
	} {
		interp, arg, ok := ParseShebang([]byte(c.in))
		if interp != c.interp || arg != c.arg || ok != c.ok {
			t.Errorf("ParseShebang(%q) = %q, %q, %v; want %q, %q, %v", c.in, interp, arg, ok, c.interp, c.arg, c.ok)
		}
	}
}

func FuzzParseShebang(f *testing.F) {
	for _, s := range []string{"#!/usr/bin/env node\n", "#! /bin/sh -e\n", "#!\t/x\ty\n", "#!", "#!/" + strings.Repeat("a", 300)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, head []byte) {
		interp, arg, ok := ParseShebang(head)
		if !ok {
			if interp != "" || arg != "" {
				t.Fatalf("not ok but %q %q", interp, arg)
			}
			return
		}
		if !filepath.IsAbs(interp) || filepath.Clean(interp) != interp || strings.ContainsAny(interp, " \t\n\x00") {
			t.Fatalf("interpreter %q is not an absolute clean path without blanks", interp)
		}
		if strings.ContainsRune(arg, '\n') {
			t.Fatalf("argument %q spans lines", arg)
		}
	})
}
