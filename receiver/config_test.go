package receiver

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherdev/tether/receiver/spawn"
)

const goodConfig = `{
  "listen": [{"kind": "unix", "path": "/run/tether/receiver.sock", "host_only": true, "peer_uids": [0]}],
  "admission": {"file": "/var/lib/tether/admission/admission.dsse.json", "public_key": "/etc/tether/admission.pub", "owner_uid": 0},
  "landlock": {"mode": "required"},
  "spawn": "thread",
  "limits": {"max_output_bytes": 65536, "max_runtime_s": 600}
}`

func TestDecodeConfig(t *testing.T) {
	c, err := DecodeConfig([]byte(goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	if *c.Admission.OwnerUID != 0 || c.Listen[0].Path != "/run/tether/receiver.sock" || c.Landlock.Mode != LandlockRequired {
		t.Fatalf("decoded %+v", c)
	}
	if m, _ := c.spawnMode(); m != spawn.ModeThread {
		t.Fatalf("spawn mode %v", m)
	}
	c, err = DecodeConfig([]byte(strings.Replace(goodConfig, `"spawn": "thread"`,
		`"spawn": "thread", "child_env": {"PATH": "/usr/bin:/bin", "HOME": "/home/w"}`, 1)))
	if err != nil || c.ChildEnv["PATH"] != "/usr/bin:/bin" || c.ChildEnv["HOME"] != "/home/w" {
		t.Fatalf("child_env: %+v, %v", c.ChildEnv, err)
	}
}

func TestDecodeConfigRefuses(t *testing.T) {
	cases := map[string][2]string{
		"unknown field":               {`"spawn": "thread"`, `"spawn": "thread", "extra": 1`},
		"no owner uid":                {`, "owner_uid": 0}`, `}`},
		"relative file":               {`"file": "/var/lib/tether/admission/admission.dsse.json"`, `"file": "admission.json"`},
		"unclean key":                 {`"public_key": "/etc/tether/admission.pub"`, `"public_key": "/etc/tether/../admission.pub"`},
		"not host-only":               {`"host_only": true`, `"host_only": false`},
		"no listener":                 {`[{"kind": "unix", "path": "/run/tether/receiver.sock", "host_only": true, "peer_uids": [0]}]`, `[]`},
		"empty listener":              {`{"kind": "unix", "path": "/run/tether/receiver.sock", "host_only": true, "peer_uids": [0]}`, `{}`},
		"stray field":                 {`"peer_uids": [0]}`, `"peer_uids": [0], "port": 5}`},
		"unknown kind":                {`"kind": "unix"`, `"kind": "udp"`},
		"landlock downgrade":          {`"mode": "required"`, `"mode": "best_effort"`},
		"landlock unset":              {`"landlock": {"mode": "required"}`, `"landlock": {}`},
		"spawn unknown":               {`"spawn": "thread"`, `"spawn": "fork"`},
		"output above hard":           {`"max_output_bytes": 65536`, `"max_output_bytes": 1048576`},
		"trailing data":               {`"max_runtime_s": 600}` + "\n}", `"max_runtime_s": 600}` + "\n} {}"},
		"case-folded field":           {`"spawn"`, `"Spawn"`},
		"duplicate key":               {`"mode": "required"`, `"mode": "required", "mode": "off"`},
		"negative max_frame":          {`"spawn": "thread"`, `"spawn": "thread", "max_frame": -1}`},
		"max_frame above 1Mi":         {`"spawn": "thread"`, `"spawn": "thread", "max_frame": 2097152`},
		"child_env loader":            {`"spawn": "thread"`, `"spawn": "thread", "child_env": {"LD_PRELOAD": "/x.so"}`},
		"child_env bad name":          {`"spawn": "thread"`, `"spawn": "thread", "child_env": {"A=B": "x"}`},
		"child_env not a map":         {`"spawn": "thread"`, `"spawn": "thread", "child_env": ["PATH=/bin"]`},
		"landlock writable relative":  {`"mode": "required"`, `"mode": "required", "writable": ["tmp"]`},
		"landlock writable root":      {`"mode": "required"`, `"mode": "required", "writable": ["/"]`},
		"landlock tcp unknown":        {`"mode": "required"`, `"mode": "required", "tcp": "some"`},
		"landlock any tcp with ports": {`"mode": "required"`, `"mode": "required", "tcp": "any", "tcp_bind": [8080]}`},
		"relative fence":              {`"spawn": "thread"`, `"spawn": "thread", "fence_state": "fence.json"`},
		"unclean fence":               {`"spawn": "thread"`, `"spawn": "thread", "fence_state": "/var/lib/tether/../fence.json"`},
	}
	for name, c := range cases {
		in := strings.Replace(goodConfig, c[0], c[1], 1)
		if in == goodConfig {
			t.Fatalf("%s: replacement did not apply", name)
		}
		if _, err := DecodeConfig([]byte(in)); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", name, err)
		}
	}
}

func FuzzDecodeConfig(f *testing.F) {
	f.Add([]byte(goodConfig))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeConfig(data)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v does not wrap ErrConfig", err)
			}
			return
		}
		if c.Admission.OwnerUID == nil || len(c.Listen) == 0 || (c.Listen[0].Kind != "tls" && !c.Listen[0].HostOnly) {
			t.Fatalf("accepted an incomplete config: %+v", c)
		}
		if c.Landlock.Mode != LandlockOff && c.Landlock.Mode != LandlockRequired {
			t.Fatalf("accepted landlock mode %q", c.Landlock.Mode)
		}
		for _, w := range c.Landlock.Writable {
			if !absClean(w) || w == "/" {
				t.Fatalf("accepted landlock writable %q", w)
			}
		}
		if l := c.Landlock; (l.TCP != "" && l.TCP != TCPPorts && l.TCP != TCPAny) || (l.TCP == TCPAny && len(l.TCPBind)+len(l.TCPConnect) > 0) {
			t.Fatalf("accepted landlock tcp %q with ports %v %v", l.TCP, l.TCPBind, l.TCPConnect)
		}
		if c.Cgroup.Mode != "" && c.Cgroup.Mode != CgroupOff && c.Cgroup.Mode != CgroupRequired {
			t.Fatalf("accepted cgroup mode %q", c.Cgroup.Mode)
		}
		if c.Cgroup.Mode == CgroupRequired && (!filepath.IsAbs(c.Cgroup.Parent) || filepath.Clean(c.Cgroup.Parent) != c.Cgroup.Parent) {
			t.Fatalf("accepted cgroup parent %q", c.Cgroup.Parent)
		}
		if c.FenceState != "" && !absClean(c.FenceState) {
			t.Fatalf("accepted fence_state %q", c.FenceState)
		}
		for _, v := range c.Cgroup.V1 {
			if !absClean(v.Commands) || !absClean(v.Receiver) || v.Commands == v.Receiver {
				t.Fatalf("accepted cgroup v1 %+v", v)
			}
		}
	})
}
