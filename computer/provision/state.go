package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/strictjson"
)

const stateVersion = 1

// State is DIR/computer.json: what Down needs to find and stop the
// computer again from another process, and what `tether-demo up` prints.
type State struct {
	Version       int             `json:"version"`
	Dir           string          `json:"dir"`
	Tuple         admission.Tuple `json:"tuple"`
	UID           uint32          `json:"uid"`
	GID           uint32          `json:"gid"`
	CustodianUID  uint32          `json:"custodian_uid"`
	CustodianGID  uint32          `json:"custodian_gid"`
	Transport     string          `json:"transport"`
	Address       string          `json:"address,omitempty"`
	CASPKISHA256  string          `json:"ca_spki_sha256,omitempty"`
	Landlock      string          `json:"landlock"`
	Cgroup        string          `json:"cgroup,omitempty"`
	CgroupParent  string          `json:"cgroup_parent,omitempty"`
	ReceiverPID   int             `json:"receiver_pid,omitempty"`
	ReceiverStart uint64          `json:"receiver_start_ticks,omitempty"`
	// Isolation is IsolationNamespaces or IsolationOff ("" in a state
	// written before there was a choice: off).
	Isolation string `json:"isolation,omitempty"`
	// Socket is the receiver's unix socket (namespaced computers and
	// TransportUnix); Address its TCP address otherwise.
	Socket string `json:"socket,omitempty"`
	// LandlockABI is the kernel's Landlock ABI when Landlock is required.
	LandlockABI int `json:"landlock_abi,omitempty"`
	// Resources are the resource limits the computer enforces (only the
	// max_pids, max_memory_bytes, max_disk_bytes, max_open_files and
	// max_file_size_bytes fields are used).
	Resources admission.Limits `json:"resources,omitzero"`
	// Disk is the root's own file system, once made.
	Disk *Disk `json:"disk,omitempty"`
	// LimitCgroups are the computer's cgroup v1 directories (one per
	// hierarchy, named tether-<sandbox>) that hold its limits.
	LimitCgroups []string `json:"limit_cgroups,omitempty"`
}

// saveState writes the state file. Saves are serialized (saveMu), each
// writing the state as it is when its turn comes, so that steps running
// at once (Provisioner.Prepare's) never share the temporary file and the
// last file written is the latest state.
func (c *Local) saveState(context.Context) error {
	c.saveMu.Lock()
	defer c.saveMu.Unlock()
	c.mu.Lock()
	data, err := json.MarshalIndent(c.state, "", "  ")
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return replaceFile(c.paths.state, append(data, '\n'), 0o600)
}

// ReadState reads DIR/computer.json, refusing anything that is not a
// root-owned regular file describing a computer in dir.
func ReadState(dir string) (State, error) {
	p := layout(dir).state
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return State{}, fmt.Errorf("%w: %s: %w", ErrNotComputer, dir, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return State{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || !ok || st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 || fi.Size() > 1<<20 {
		return State{}, fmt.Errorf("%w: %s is not a root-owned regular file writable by root alone", ErrNotComputer, p)
	}
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return State{}, err
	}
	return decodeState(data, dir)
}

// maxStateBytes bounds a state file.
const maxStateBytes = 1 << 20

// decodeState strictly decodes a state file and requires it to describe a
// computer living in dir: one JSON object, no unknown field, nothing after
// it, this version, a fresh uid, a valid tuple rooted at dir/root.
func decodeState(data []byte, dir string) (State, error) {
	var s State
	if err := strictjson.Decode(data, maxStateBytes, &s); err != nil {
		return State{}, fmt.Errorf("%w: state: %w", ErrNotComputer, err)
	}
	if s.Version != stateVersion || s.Dir != dir || s.UID < MinID || s.GID < MinID || s.Tuple.Root != layout(dir).root {
		return State{}, fmt.Errorf("%w: the state describes another computer (dir %q, uid %d)", ErrNotComputer, s.Dir, s.UID)
	}
	if err := s.Tuple.Validate(); err != nil {
		return State{}, fmt.Errorf("%w: state: %w", ErrNotComputer, err)
	}
	if err := s.checkCgroup(); err != nil {
		return State{}, fmt.Errorf("%w: state: %w", ErrNotComputer, err)
	}
	if err := s.checkIsolation(dir); err != nil {
		return State{}, fmt.Errorf("%w: state: %w", ErrNotComputer, err)
	}
	if s.ReceiverPID < 0 || s.ReceiverPID == 1 {
		return State{}, fmt.Errorf("%w: state: receiver pid %d", ErrNotComputer, s.ReceiverPID)
	}
	return s, nil
}

// Down stops the computer in dir that another process left running
// (tether-demo up) and removes it, like Close.
func Down(ctx context.Context, dir string) error {
	d, err := checkExisting(dir)
	if err != nil {
		return err
	}
	s, err := ReadState(d)
	if err != nil {
		return err
	}
	c := &Local{paths: layout(d), state: s}
	if s.ReceiverPID > 0 {
		c.recv = &receiverProc{pid: s.ReceiverPID, ticks: s.ReceiverStart}
	}
	return c.Close(ctx)
}

// checkExisting resolves an existing computer directory.
func checkExisting(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%w: no directory given", ErrNotComputer)
	}
	d, err := os.Readlink(dir)
	if err == nil {
		return "", fmt.Errorf("%w: %s is a symlink (to %s)", ErrNotComputer, dir, d)
	}
	abs, err := absClean(dir)
	if err != nil {
		return "", err
	}
	if _, err := os.Lstat(abs); errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%w: %s does not exist", ErrNotComputer, abs)
	}
	return abs, nil
}

// checkCgroup requires the cgroup fields to name a known mode and, with
// CgroupRequired, a parent cgroup named for this computer's sandbox, so a
// state file never makes Down kill another cgroup.
func (s State) checkCgroup() error {
	switch s.Cgroup {
	case CgroupAuto, CgroupOff:
		if s.CgroupParent != "" {
			return fmt.Errorf("cgroup parent %q without cgroup %q", s.CgroupParent, CgroupRequired)
		}
		return nil
	case CgroupRequired:
		p := s.CgroupParent
		if p == "" { // recorded before the parent was made
			return nil
		}
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || filepath.Base(p) != CgroupParentName(s.Tuple.Sandbox) {
			return fmt.Errorf("cgroup parent %q is not an absolute clean path named %s", p, CgroupParentName(s.Tuple.Sandbox))
		}
		return nil
	}
	return fmt.Errorf("cgroup mode %q is not %q or %q", s.Cgroup, CgroupRequired, CgroupOff)
}

// checkIsolation requires the isolation fields to name a known tier and
// only this computer's own disk, socket and cgroups, so a state file
// never makes Down unmount, detach or kill anything else.
func (s State) checkIsolation(dir string) error {
	p := layout(dir)
	switch s.Isolation {
	case "", IsolationOff, IsolationNamespaces:
	default:
		return fmt.Errorf("isolation %q is not %q or %q", s.Isolation, IsolationNamespaces, IsolationOff)
	}
	if s.Socket != "" && s.Socket != p.socket {
		return fmt.Errorf("socket %q is not %s", s.Socket, p.socket)
	}
	if d := s.Disk; d != nil {
		switch {
		case d.Kind != DiskExt4 && d.Kind != DiskTmpfs:
			return fmt.Errorf("disk kind %q is not %q or %q", d.Kind, DiskExt4, DiskTmpfs)
		case d.Kind == DiskTmpfs && (d.Image != "" || d.Loop != ""):
			return fmt.Errorf("a tmpfs disk names image %q and loop %q", d.Image, d.Loop)
		case d.Kind == DiskExt4 && d.Image != p.disk:
			return fmt.Errorf("disk image %q is not %s", d.Image, p.disk)
		case d.Loop != "" && !loopName.MatchString(d.Loop):
			return fmt.Errorf("loop device %q is not /dev/loopN", d.Loop)
		}
	}
	for _, c := range s.LimitCgroups {
		if !filepath.IsAbs(c) || filepath.Clean(c) != c || filepath.Base(c) != CgroupParentName(s.Tuple.Sandbox) {
			return fmt.Errorf("limit cgroup %q is not an absolute clean path named %s", c, CgroupParentName(s.Tuple.Sandbox))
		}
	}
	return nil
}
