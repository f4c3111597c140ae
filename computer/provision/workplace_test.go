package provision

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver"
)

// TestReceiverConfigWorkplace: only a namespaced computer's receiver gets
// the work directories, TCP left to its network namespace, HOME and
// TMPDIR; with IsolationOff (the host's /tmp) it stays at the strict
// default, the mode alone and the receiver's default environment.
func TestReceiverConfigWorkplace(t *testing.T) {
	ns, off := State{Isolation: IsolationNamespaces}, State{Isolation: IsolationOff}
	l := ns.receiverLandlock(LandlockRequired)
	if !slices.Equal(l.Writable, []string{"/tmp", "/var/tmp", "/dev/shm", Home}) || l.TCP != receiver.TCPAny {
		t.Fatalf("namespaced landlock %+v", l)
	}
	if env := ns.childEnv(); env["HOME"] != Home || env["TMPDIR"] != "/tmp" || env["PATH"] != receiver.DefaultChildEnv["PATH"] {
		t.Fatalf("namespaced child_env %v", env)
	}
	if l := off.receiverLandlock(LandlockRequired); l.Writable != nil || l.TCP != "" || l.ReadWrite != nil {
		t.Fatalf("isolation off landlock %+v, want the mode alone", l)
	}
	if env := off.childEnv(); env != nil {
		t.Fatalf("isolation off child_env %v, want the receiver's default", env)
	}
}

// workScript is an agent's first minutes in a computer: mktemp in /tmp,
// /var/tmp and /dev/shm, a C program built with cc (whose temporary files
// go to TMPDIR) and run, a dotfile in HOME, and a server on a loopback
// port reached with curl. Each step prints its mark only if it worked.
const workScript = `set -u
echo "HOME=$HOME TMPDIR=$TMPDIR"
echo "CC $(readlink /usr/bin/cc)"
for d in /tmp /var/tmp /dev/shm; do f=$(mktemp -p "$d") && echo x > "$f" && rm "$f" && echo "MKTEMP $d"; done
w=$(mktemp -d) || exit 1
printf '#include <stdio.h>\nint main(void){puts("hello from cc");return 0;}\n' > "$w/a.c"
cc -o "$w/a" "$w/a.c" && "$w/a"
echo cached > "$HOME/.toolrc" && mkdir -p "$HOME/.cache/tool" && test "$(stat -c %u "$HOME")" = "$(id -u)" && echo "HOME WRITABLE"
echo served > "$w/index.html"
python3 -m http.server --bind 127.0.0.1 --directory "$w" 18080 >/dev/null 2>&1 &
for i in $(seq 100); do curl -sf http://127.0.0.1:18080/index.html && break; sleep 0.1; done
kill %1
for d in /tmp /var/tmp /dev/shm; do echo "SIZE $d $(df -B1 --output=size "$d" | tail -1 | tr -d ' ')"; done
exit 0`

// TestIntegrationWorkplace: in a namespaced computer (Landlock required
// and off), commands write the private /tmp, /var/tmp and /dev/shm,
// build and run a C program with cc, keep dotfiles in a private HOME
// outside the tuple root, and serve and fetch on a loopback port; each of
// the three tmp dirs is a tmpfs of a quarter of the memory limit; the
// project folder (the tuple root) stays empty.
func TestIntegrationWorkplace(t *testing.T) {
	for _, ll := range landlockModes {
		t.Run("landlock_"+ll, func(t *testing.T) {
			c := isolated(t, Options{Landlock: ll})
			r := runIn(t, c, workScript)
			quarter := strconv.FormatInt(c.State().Resources.MaxMemoryBytes/4, 10)
			for _, want := range []string{"SIZE /tmp " + quarter + "\n", "SIZE /var/tmp " + quarter + "\n",
				"SIZE /dev/shm " + quarter + "\n", "HOME=" + Home + " TMPDIR=/tmp\n", "MKTEMP /tmp\n", "MKTEMP /var/tmp\n",
				"MKTEMP /dev/shm\n", "CC /etc/alternatives/cc\n", "hello from cc\n", "HOME WRITABLE\n", "served\n"} {
				if !strings.Contains(r.out, want) {
					t.Fatalf("missing %q: %v", want, r)
				}
			}
			ents, err := os.ReadDir(c.paths.root)
			if err != nil || len(ents) != 0 {
				t.Fatalf("the tuple root holds %v (%v), want nothing", names(ents), err)
			}
		})
	}
}

// homeScript shows where HOME lives: its file system type and device
// beside the tuple root's (the working directory), then writes bytes
// MiB into it and fsyncs them. Each step prints its mark only if it
// worked.
const homeScript = `set -u
echo "HOME $(stat -f -c %%T "$HOME") $(stat -c %%d "$HOME") ROOT $(stat -f -c %%T .) $(stat -c %%d .)"
dd if=/dev/zero of="$HOME/.cache-blob" bs=1M count=%d conv=fsync 2>/dev/null && echo "WROTE HOME"
mkdir -p "$HOME/.npm" && echo x > "$HOME/.npm/pkg" && echo "NPM CACHE"
exit 0`

// TestIntegrationHomeOnDisk: a namespaced computer's HOME is a directory
// of its disk, not a tmpfs and not beneath the tuple root: inside, HOME
// and the tuple root are on the same file system (ext4, the same device;
// a tmpfs for a disk below tinyDisk); 40 MiB written to HOME on a
// computer with 64 MiB of memory (the tmp dirs get 16 MiB each) succeed
// and take 40 MiB from max_disk_bytes, as the host's statfs of the tuple
// root shows; a write past the disk fails with ENOSPC; and nothing of it
// appears in the project folder, which stays empty. The disk's top
// directory holds home, project and (ext4) mkfs's lost+found. Positive
// control: with IsolationOff, HOME is the grant root and a dotfile lands
// in the project folder.
func TestIntegrationHomeOnDisk(t *testing.T) {
	c := isolated(t, Options{Limits: admission.Limits{MaxMemoryBytes: 64 << 20, MaxDiskBytes: 256 << 20}})
	before := freeBytes(t, c.paths.root)
	r := runIn(t, c, fmt.Sprintf(homeScript, 40))
	dev := devOf(t, c.paths.root)
	for _, want := range []string{fmt.Sprintf("HOME ext2/ext3 %d ROOT ext2/ext3 %d\n", dev, dev), "WROTE HOME\n", "NPM CACHE\n"} {
		if !strings.Contains(r.out, want) {
			t.Fatalf("missing %q: %v", want, r)
		}
	}
	if used := before - freeBytes(t, c.paths.root); used < 40<<20 {
		t.Fatalf("40 MiB written to HOME took %d bytes of the disk, want at least 40 MiB", used)
	}
	if fi, err := os.Stat(filepath.Join(c.paths.diskHome, ".cache-blob")); err != nil || fi.Size() != 40<<20 {
		t.Fatalf("the disk's home holds %v (%v), want the 40 MiB blob", fi, err)
	}
	checkProjectEmpty(t, c)
	r = runIn(t, c, `dd if=/dev/zero of="$HOME/fill" bs=1M count=512 2>&1; exit 0`)
	if !strings.Contains(r.out, "No space left on device") {
		t.Fatalf("512 MiB written into HOME on a 256 MiB disk: %v", r)
	}
	checkProjectEmpty(t, c)

	tiny := isolated(t, Options{Limits: admission.Limits{MaxDiskBytes: 16 << 20}})
	r = runIn(t, tiny, fmt.Sprintf(homeScript, 4))
	dev = devOf(t, tiny.paths.root)
	for _, want := range []string{fmt.Sprintf("HOME tmpfs %d ROOT tmpfs %d\n", dev, dev), "WROTE HOME\n"} {
		if !strings.Contains(r.out, want) {
			t.Fatalf("tiny disk: missing %q: %v", want, r)
		}
	}
	checkProjectEmpty(t, tiny)
	for c, want := range map[*Local][]string{c: {"home", "lost+found", "project"}, tiny: {"home", "project"}} {
		if ents, err := os.ReadDir(c.paths.diskDir); err != nil || !slices.Equal(names(ents), want) {
			t.Fatalf("the disk's top directory holds %v (%v), want %v", names(ents), err, want)
		}
	}

	// Positive control: with IsolationOff HOME is the grant root, and a
	// dotfile written to it is in the project folder, as the check sees.
	testenv.Require(t, "root")
	off := newLocal(t, Options{Isolation: IsolationOff, Bins: receiverBins(t)})
	r = runIn(t, off, `echo cached > "$HOME/.toolrc" && echo "HOME $HOME"`)
	if _, err := os.Stat(filepath.Join(off.paths.root, ".toolrc")); err != nil || !strings.Contains(r.out, "HOME "+off.paths.root+"\n") {
		t.Fatalf("control: HOME's dotfile not in the project folder with isolation off (%v): %v", err, r)
	}
}

// checkProjectEmpty fails unless the tuple root, the project folder,
// holds nothing (as on a fresh computer: mkfs's lost+found is not there).
func checkProjectEmpty(t *testing.T, c *Local) {
	t.Helper()
	ents, err := os.ReadDir(c.paths.root)
	if err != nil || len(ents) != 0 {
		t.Fatalf("the tuple root holds %v (%v), want nothing", names(ents), err)
	}
	var st unix.Stat_t
	if err := unix.Stat(c.paths.root, &st); err != nil || st.Uid != c.State().UID || st.Mode&0o7777 != 0o700 {
		t.Fatalf("the tuple root is uid %d mode %o (%v), want the grant's uid %d and 0700", st.Uid, st.Mode&0o7777, err, c.State().UID)
	}
}

// freeBytes is the free space of the file system holding path.
func freeBytes(t *testing.T, path string) int64 {
	t.Helper()
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		t.Fatal(err)
	}
	return int64(fs.Bfree) * fs.Bsize
}

// devOf is the device number of path's file system, as stat -c %d
// prints it.
func devOf(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Dev
}

func names(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// hostEtcSecrets are host /etc entries a computer must not show: secrets
// and the host's identity and service configs.
var hostEtcSecrets = []string{"/etc/shadow", "/etc/gshadow", "/etc/machine-id", "/etc/sudoers", "/etc/ssh",
	"/etc/ssl/private", "/etc/passwd-", "/etc/subuid", "/etc/apt", "/etc/cron.d", "/etc/pam.d", "/etc/gitconfig", "/etc/pip.conf"}

// TestIntegrationAttackHostEtc: a namespaced computer's /etc is its own:
// the host's shadow, gshadow, machine-id, ssh, TLS keys and service
// configs are absent, /etc lists exactly the generated files and the
// allowlisted host entries, and its passwd names the grant's user with
// the private HOME. Positive control: a computer with IsolationOff shows
// the host's secrets (stat succeeds) and machine-id.
func TestIntegrationAttackHostEtc(t *testing.T) {
	machineID, err := os.ReadFile("/etc/machine-id")
	if err != nil {
		t.Fatalf("this host has no /etc/machine-id to prove the control with: %v", err)
	}
	var onHost []string
	for _, p := range hostEtcSecrets {
		if _, err := os.Lstat(p); err == nil {
			onHost = append(onHost, p)
		}
	}
	if !slices.Contains(onHost, "/etc/shadow") {
		t.Fatal("this host has no /etc/shadow to prove the control with")
	}
	probe := fmt.Sprintf(`for p in %s; do test -e "$p" -o -L "$p" && echo "PRESENT $p"; done
echo "MACHINE $(cat /etc/machine-id 2>/dev/null)"
echo "ETC $(ls -A /etc | tr '\n' ' ')"
echo "ID $(id -un) $(whoami) $(getent passwd "$(id -u)" | cut -d: -f6)"
exit 0`, strings.Join(onHost, " "))

	c := isolated(t, Options{})
	r := runIn(t, c, probe)
	if strings.Contains(r.out, "PRESENT") || strings.Contains(r.out, strings.TrimSpace(string(machineID))) {
		t.Fatalf("host /etc secrets visible in the computer: %v", r)
	}
	if want := "ID " + User + " " + User + " " + Home + "\n"; !strings.Contains(r.out, want) {
		t.Fatalf("missing %q: %v", want, r)
	}
	if got, want := etcListing(r.out), expectedEtc(); !slices.Equal(got, want) {
		t.Fatalf("/etc lists %v, want %v", got, want)
	}

	testenv.Require(t, "root")
	off := newLocal(t, Options{Isolation: IsolationOff, Bins: receiverBins(t)})
	r = runIn(t, off, probe)
	for _, p := range onHost {
		if !strings.Contains(r.out, "PRESENT "+p+"\n") {
			t.Fatalf("control: %s not seen with isolation off (the probe is broken): %v", p, r)
		}
	}
	if !strings.Contains(r.out, strings.TrimSpace(string(machineID))) {
		t.Fatalf("control: the host's machine-id not seen with isolation off: %v", r)
	}
}

// etcListing is the sorted listing the probe printed after "ETC ".
func etcListing(out string) []string {
	_, rest, _ := strings.Cut(out, "ETC ")
	line, _, _ := strings.Cut(rest, "\n")
	got := strings.Fields(line)
	slices.Sort(got)
	return got
}

// expectedEtc is what a namespaced computer's /etc holds on this host: the
// generated files and the top of each allowlisted entry the host has.
func expectedEtc() []string {
	var want []string
	for _, f := range etcFiles(0, 0, "h") {
		want = append(want, f.Name)
	}
	for _, e := range etcHostEntries {
		top, _, _ := strings.Cut(e, "/")
		if _, err := os.Lstat("/etc/" + e); err == nil && !slices.Contains(want, top) {
			want = append(want, top)
		}
	}
	slices.Sort(want)
	return want
}
