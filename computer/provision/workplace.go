package provision

import (
	"maps"

	"github.com/tetherdev/tether/receiver"
)

// A namespaced computer is a place to work (docs/operations.md, "Working
// in a computer"): its commands write its private /tmp, /var/tmp and
// /dev/shm (TMPDIR is /tmp), their HOME is a private directory that is
// not beneath the tuple root, so the caches and dotfiles of tools stay
// out of the project folder, and a server on a loopback port is reached
// from inside. The tmp dirs are size-bounded tmpfs mounts of the
// computer's own mount namespace; the home is the home directory of the
// computer's disk, beside the tuple root's project directory (disk.go),
// bounded with it by max_disk_bytes. Nothing of it survives teardown,
// and none of it is the host's. A computer with IsolationOff shares the
// host's /tmp and has no disk and no private home: its commands get
// neither (HOME stays the grant root, as the receiver defaults it).

// User and Home are the name and home directory of the grant's user
// inside a namespaced computer (its /etc/passwd entry).
const (
	User = "user"
	Home = "/home/" + User
)

// TmpDir is TMPDIR of a namespaced computer's commands.
const TmpDir = "/tmp"

// workDirs are the directories a namespaced computer's commands get every
// right beneath besides their grant root: the private tmpfs mounts and
// the home on the computer's own disk. None is a directory the host uses.
var workDirs = []string{"/tmp", "/var/tmp", "/dev/shm", Home}

// receiverLandlock is the Landlock configuration of the computer's
// receiver: the mode alone with IsolationOff (today's strict default);
// on a namespaced computer also the work directories, and TCP left to
// the network namespace, which has nothing but the computer's own
// loopback (receiver.TCPAny).
func (s State) receiverLandlock(mode string) receiver.LandlockConfig {
	l := receiver.LandlockConfig{Mode: mode}
	if s.namespaced() {
		l.Writable, l.TCP = workDirs, receiver.TCPAny
		l.ReadExec = refusalReadExec() // refusals.go
	}
	return l
}

// childEnv is the receiver's child_env: nil (the receiver's default) with
// IsolationOff; on a namespaced computer the default plus HOME, TMPDIR,
// USER and LOGNAME. A grant's env and a request's env still go over it.
func (s State) childEnv() map[string]string {
	if !s.namespaced() {
		return nil
	}
	env := maps.Clone(receiver.DefaultChildEnv)
	env["HOME"], env["TMPDIR"], env["USER"], env["LOGNAME"] = Home, TmpDir, User, User
	return env
}
