package provision

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherdev/tether/admission"
)

// FuzzDecodeState: the state file decoder never panics, and whatever it
// accepts describes a computer in the directory asked about.
func FuzzDecodeState(f *testing.F) {
	dir := "/srv/c"
	good, _ := json.Marshal(State{Version: stateVersion, Dir: dir, UID: 61000, GID: 61000, Transport: TransportTLS,
		Landlock: LandlockRequired, ReceiverPID: 4242, ReceiverStart: 99,
		Tuple: admission.Tuple{Owner: "alice", Allocation: "a", Session: "s", Workspace: "w", Sandbox: "b",
			Generation: 1, Executor: "e", Site: "local", Root: dir + "/root"}})
	f.Add(good)
	f.Add([]byte(`{"version":1}`))
	f.Add(append(good, []byte(" {}")...))
	f.Add([]byte(strings.Replace(string(good), `"uid":61000`, `"uid":0`, 1)))
	f.Add([]byte(strings.Replace(string(good), `"landlock"`, `"cgroup":"required","cgroup_parent":"/sys/fs/cgroup/tether-b","landlock"`, 1)))
	f.Add([]byte(strings.Replace(string(good), `"landlock"`, `"cgroup":"required","cgroup_parent":"/sys/fs/cgroup","landlock"`, 1)))
	ns := strings.Replace(string(good), `"landlock"`, `"isolation":"namespaces","socket":"/srv/c/run/receiver.sock",`+
		`"disk":{"kind":"ext4","image":"/srv/c/disk.img","loop":"/dev/loop3"},"limit_cgroups":["/sys/fs/cgroup/pids/tether-b"],"landlock"`, 1)
	f.Add([]byte(ns))
	f.Add([]byte(strings.Replace(ns, `/srv/c/disk.img`, `/etc/shadow`, 1)))
	f.Add([]byte(strings.Replace(ns, `/dev/loop3`, `/dev/sda`, 1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := decodeState(data, dir)
		if err != nil {
			return
		}
		if s.Dir != dir || s.Tuple.Root != dir+"/root" || s.UID < MinID || s.Tuple.Validate() != nil {
			t.Fatalf("accepted a state for another computer: %+v", s)
		}
		if s.CgroupParent != "" && (s.Cgroup != CgroupRequired || filepath.Base(s.CgroupParent) != CgroupParentName(s.Tuple.Sandbox)) {
			t.Fatalf("accepted a parent cgroup not named for the computer: %+v", s)
		}
		checkStateIsolation(t, s, dir)
	})
}

// checkStateIsolation fails unless every path of s's isolation fields is
// the computer's own.
func checkStateIsolation(t *testing.T, s State, dir string) {
	t.Helper()
	if s.Socket != "" && s.Socket != dir+"/run/receiver.sock" {
		t.Fatalf("accepted socket %q", s.Socket)
	}
	if d := s.Disk; d != nil && (d.Image != "" && d.Image != dir+"/disk.img" || d.Loop != "" && !loopName.MatchString(d.Loop)) {
		t.Fatalf("accepted disk %+v", d)
	}
	for _, c := range s.LimitCgroups {
		if filepath.Base(c) != CgroupParentName(s.Tuple.Sandbox) {
			t.Fatalf("accepted limit cgroup %q", c)
		}
	}
}

// TestDecodeStateRefusesForeignIsolation: a state whose isolation fields
// name anything but this computer's own socket, disk and cgroups is not
// a computer's (Down must never unmount, detach or kill anything else).
func TestDecodeStateRefusesForeignIsolation(t *testing.T) {
	dir := "/srv/c"
	good := State{Version: stateVersion, Dir: dir, UID: 61000, GID: 61000, Transport: TransportTLS, Landlock: LandlockRequired,
		Isolation: IsolationNamespaces, Socket: dir + "/run/receiver.sock", Disk: &Disk{Kind: DiskExt4, Image: dir + "/disk.img", Loop: "/dev/loop7"},
		LimitCgroups: []string{"/sys/fs/cgroup/pids/tether-b"},
		Tuple: admission.Tuple{Owner: "alice", Allocation: "a", Session: "s", Workspace: "w", Sandbox: "b",
			Generation: 1, Executor: "e", Site: "local", Root: dir + "/root"}}
	if data, _ := json.Marshal(good); !decodes(data, dir) {
		t.Fatal("the good state was refused")
	}
	for name, mutate := range map[string]func(*State){
		"isolation":      func(s *State) { s.Isolation = "chroot" },
		"socket":         func(s *State) { s.Socket = "/run/docker.sock" },
		"disk kind":      func(s *State) { s.Disk.Kind = "btrfs" },
		"disk image":     func(s *State) { s.Disk.Image = "/var/lib/important.img" },
		"loop device":    func(s *State) { s.Disk.Loop = "/dev/sda" },
		"tmpfs image":    func(s *State) { s.Disk.Kind = DiskTmpfs },
		"limit cgroup":   func(s *State) { s.LimitCgroups = []string{"/sys/fs/cgroup/pids/system.slice"} },
		"unclean cgroup": func(s *State) { s.LimitCgroups = []string{"/sys/fs/cgroup/pids/../tether-b"} },
	} {
		s := good
		d := *good.Disk
		s.Disk = &d
		mutate(&s)
		if data, _ := json.Marshal(s); decodes(data, dir) {
			t.Errorf("%s: a state naming what is not the computer's was accepted", name)
		}
	}
}

func decodes(data []byte, dir string) bool {
	_, err := decodeState(data, dir)
	return err == nil
}

// FuzzParseSysvipc: any /proc/sysvipc text gives objects or an error,
// never a panic.
func FuzzParseSysvipc(f *testing.F) {
	f.Add([]byte("       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid\n"+
		"         0          3   600               4096   100   100      0 60001 60001 60001 60001\n"), "shm")
	f.Add([]byte("key msqid perms uid\n1 2 3\n"), "msg")
	f.Add([]byte("key semid perms nsems uid gid cuid cgid\nx y z\n"), "sem")
	f.Fuzz(func(t *testing.T, data []byte, kind string) {
		objs, err := parseSysvipc(strings.NewReader(string(data)), kind)
		if err == nil {
			for _, o := range objs {
				if o.Kind != kind {
					t.Fatalf("object %+v of kind %q", o, kind)
				}
			}
		}
	})
}

func TestParseSysvipc(t *testing.T) {
	shm := "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n" +
		"         0          3   600               4096   100   100      0 60001 60001 60002 60001          0          0 1700000000                  4096                     0\n"
	objs, err := parseSysvipc(strings.NewReader(shm), "shm")
	if err != nil || len(objs) != 1 || objs[0] != (IPCObject{Kind: "shm", ID: 3, UID: 60001, CUID: 60002}) {
		t.Fatalf("%+v %v", objs, err)
	}
	for _, bad := range []string{"key perms uid cuid\n1 2 3 4\n", shm + "1 2\n", shm + "0 x 600 1 1 1 0 1 1 1 1 0 0 0 0 0\n"} {
		if _, err := parseSysvipc(strings.NewReader(bad), "shm"); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

// FuzzParseStartTicks: a /proc/PID/stat line never panics the parser.
func FuzzParseStartTicks(f *testing.F) {
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("1 (a) b) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 0 0"))
	f.Add([]byte("12 (no close"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseStartTicks(b)
	})
}

func TestParseStartTicks(t *testing.T) {
	got, err := parseStartTicks([]byte("7 (we ird) name) S 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 987654 1 2"))
	if err != nil || got != 987654 {
		t.Fatalf("got %d, %v; want 987654 counted after the last parenthesis", got, err)
	}
	if _, err := parseStartTicks([]byte("7 (x) S 1")); err == nil {
		t.Fatal("a short line was accepted")
	}
}
