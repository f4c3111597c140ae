package jail

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Under NetworkHost the agent shares the host's network namespace, so a
// socket it serves is served on the host. Landlock's TCP bind right
// (restrictExec handles it with no port allowed) refuses bind(2) of a
// TCP socket, but not two ways around it, seen on Linux 6.18: listen(2)
// on an unbound TCP socket binds an ephemeral port itself, and Multipath
// TCP sockets are outside Landlock's TCP rules (go-landlock's
// documentation; landlock-lsm/linux issue 54). noServeFilter closes both
// with a seccomp filter: listen(2) and socket(2) with IPPROTO_MPTCP fail
// with EPERM, and so does io_uring_setup(2), whose listen operation would
// not pass through the filter; a system call of another architecture (or
// x86-64's x32 numbers) fails too. Connect stays allowed: the agent must
// reach its model.

// ipprotoMPTCP is IPPROTO_MPTCP (linux/in.h).
const ipprotoMPTCP = 262

// seccompArch is the AUDIT_ARCH_* value of the architectures the filter
// is built for.
var seccompArch = map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}

// noServeFilter returns the filter's program for this architecture;
// allowListen leaves listen(2) out of it (Options.Listen).
func noServeFilter(allowListen bool) ([]unix.SockFilter, error) {
	arch, ok := seccompArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("no seccomp filter for %s: the jail cannot keep the agent from serving on the host's network; use jail.network %q", runtime.GOARCH, NetworkNone)
	}
	const (
		ld      = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq     = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge     = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		ret     = unix.BPF_RET | unix.BPF_K
		offNr   = 0  // seccomp_data.nr
		offArch = 4  // seccomp_data.arch
		offArg2 = 32 // the low 32 bits of seccomp_data.args[2] (little-endian)
		x32Bit  = 0x40000000
	)
	denied := []uint32{unix.SYS_LISTEN, unix.SYS_IO_URING_SETUP}
	if allowListen {
		denied = denied[1:]
	}
	// The program: the arch check, the number, the x32 check, one test per
	// denied number, the socket(2) protocol test, allow, deny. toDeny(i)
	// is the jump from instruction i to deny (offsets count from the next
	// instruction).
	deny := 8 + len(denied)
	toDeny := func(i int) uint8 { return uint8(deny - i - 1) }
	prog := []unix.SockFilter{
		{Code: ld, K: offArch},
		{Code: jeq, K: arch, Jt: 0, Jf: toDeny(1)},
		{Code: ld, K: offNr},
		{Code: jge, K: x32Bit, Jt: toDeny(3)},
	}
	for _, nr := range denied {
		prog = append(prog, unix.SockFilter{Code: jeq, K: nr, Jt: toDeny(len(prog))})
	}
	return append(prog,
		unix.SockFilter{Code: jeq, K: unix.SYS_SOCKET, Jt: 0, Jf: 2},
		unix.SockFilter{Code: ld, K: offArg2},
		unix.SockFilter{Code: jeq, K: ipprotoMPTCP, Jt: 1, Jf: 0},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
	), nil
}

// installNoServe installs noServeFilter on the calling thread, which must
// have no_new_privs set; the program it executes inherits it.
func installNoServe(allowListen bool) error {
	prog, err := noServeFilter(allowListen)
	if err != nil {
		return err
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0); err != nil {
		return fmt.Errorf("install the seccomp filter against serving on the host: %w", err)
	}
	runtime.KeepAlive(prog)
	return nil
}
