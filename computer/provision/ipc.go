package provision

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// System V IPC objects (shared memory, message queues, semaphore sets)
// outlive the processes that made them. A namespaced computer's live in
// its own IPC namespace and die with it, when its last process is gone;
// teardown still sweeps the host's namespace for objects owned or
// created by the grant's uid (a computer without namespaces leaves them
// there), removes them and reports them (ErrLeftover).

// IPCObject is one System V IPC object.
type IPCObject struct {
	Kind string // "shm", "msg" or "sem"
	ID   int
	UID  uint32 // owner
	CUID uint32 // creator
}

// ipcKinds maps each kind to its /proc/sysvipc file.
var ipcKinds = []string{"shm", "msg", "sem"}

// IPCObjectsOf lists the System V IPC objects of this IPC namespace that
// uid owns or created.
func IPCObjectsOf(uid uint32) ([]IPCObject, error) {
	var out []IPCObject
	for _, k := range ipcKinds {
		f, err := os.Open("/proc/sysvipc/" + k)
		if errors.Is(err, os.ErrNotExist) {
			continue // a kernel without System V IPC
		}
		if err != nil {
			return nil, err
		}
		objs, err := parseSysvipc(f, k)
		f.Close()
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if o.UID == uid || o.CUID == uid {
				out = append(out, o)
			}
		}
	}
	return out, nil
}

// parseSysvipc reads a /proc/sysvipc file of kind: a header naming the
// columns, then one object per line. Lines without the id, uid and cuid
// columns are refused.
func parseSysvipc(r io.Reader, kind string) ([]IPCObject, error) {
	sc := bufio.NewScanner(r)
	if !sc.Scan() {
		return nil, sc.Err()
	}
	head := strings.Fields(sc.Text())
	idCol := slices.Index(head, map[string]string{"shm": "shmid", "msg": "msqid", "sem": "semid"}[kind])
	uidCol, cuidCol := slices.Index(head, "uid"), slices.Index(head, "cuid")
	if idCol < 0 || uidCol < 0 || cuidCol < 0 {
		return nil, fmt.Errorf("/proc/sysvipc/%s: header %q lacks the id, uid or cuid column", kind, sc.Text())
	}
	var out []IPCObject
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) <= max(idCol, uidCol, cuidCol) {
			return nil, fmt.Errorf("/proc/sysvipc/%s: line %q has %d columns, want %d", kind, sc.Text(), len(f), len(head))
		}
		id, e1 := strconv.Atoi(f[idCol])
		uid, e2 := strconv.ParseUint(f[uidCol], 10, 32)
		cuid, e3 := strconv.ParseUint(f[cuidCol], 10, 32)
		if err := errors.Join(e1, e2, e3); err != nil {
			return nil, fmt.Errorf("/proc/sysvipc/%s: line %q: %w", kind, sc.Text(), err)
		}
		out = append(out, IPCObject{Kind: kind, ID: id, UID: uint32(uid), CUID: uint32(cuid)})
	}
	return out, sc.Err()
}

// removeIPC removes every object uid owns or created in this IPC
// namespace and reports them (ErrLeftover); one it cannot remove is
// named too.
func removeIPC(uid uint32) error {
	objs, err := IPCObjectsOf(uid)
	if err != nil || len(objs) == 0 {
		return err
	}
	var desc []string
	var errs []error
	for _, o := range objs {
		desc = append(desc, fmt.Sprintf("%s %d", o.Kind, o.ID))
		if err := removeIPCObject(o); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EIDRM) {
			errs = append(errs, fmt.Errorf("%w: %s %d of uid %d not removed: %w", ErrLeftover, o.Kind, o.ID, uid, err))
		}
	}
	return errors.Join(append(errs, fmt.Errorf("%w: System V IPC objects of uid %d outlived the computer and were removed: %s",
		ErrLeftover, uid, strings.Join(desc, ", ")))...)
}

func removeIPCObject(o IPCObject) error {
	var err error
	switch o.Kind {
	case "shm":
		_, err = unix.SysvShmCtl(o.ID, unix.IPC_RMID, nil)
	case "msg":
		_, _, e := unix.Syscall(unix.SYS_MSGCTL, uintptr(o.ID), unix.IPC_RMID, 0)
		err = errnoErr(e)
	case "sem":
		_, _, e := unix.Syscall6(unix.SYS_SEMCTL, uintptr(o.ID), 0, unix.IPC_RMID, 0, 0, 0)
		err = errnoErr(e)
	}
	return err
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
