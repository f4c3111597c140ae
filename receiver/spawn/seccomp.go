package spawn

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	bpfseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	dockerprofile "github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// ErrSeccomp wraps every failure to build or install the seccomp filter.
var ErrSeccomp = errors.New("seccomp")

// Filter is the compiled seccomp program every command runs under:
// Docker's default profile (github.com/moby/profiles/seccomp) for a
// process without capabilities on this architecture, tightened by
// the computer's own rules (tightenings), with system call tables from
// github.com/elastic/go-seccomp-bpf. A Filter is immutable and may be
// used by many concurrent Starts.
type Filter struct {
	prog []unix.SockFilter
}

// Len returns the number of BPF instructions of the program.
func (f *Filter) Len() int { return len(f.prog) }

// tightening is one rule the computer adds in front of Docker's default:
// every call it matches fails with Errno, whatever Docker's profile says.
type tightening struct {
	// Names are the system calls the rule applies to.
	Names []string
	// Args are ANDed conditions on the arguments; none means every call.
	Args []bpfseccomp.Condition
	// Errno is what a matching call returns.
	Errno unix.Errno
}

// Namespace flags of clone and unshare: CLONE_NEWNS, NEWCGROUP, NEWUTS,
// NEWIPC, NEWUSER, NEWPID, NEWNET (Docker's clone mask 0x7E020000) and
// CLONE_NEWTIME (0x80, unshare only).
const nsFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWTIME

// tightenings are the computer's rules, checked in order before Docker's
// allow list; SECURITY.md lists each with its reason. The socket rules
// compare whole 64-bit arguments: a domain with stray high bits matches
// no allow rule of Docker's either and falls to the default EPERM.
var tightenings = []tightening{
	// Kernel surfaces a command never needs: "not implemented", so callers
	// (libuv, liburing, keyutils) take their fallback path.
	{Names: []string{"clone3", "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf",
		"perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key"}, Errno: unix.ENOSYS},
	// Privileged or namespace-shaped calls: "not permitted", as without
	// capabilities.
	{Names: []string{"unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree",
		"move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "kexec_load",
		"kexec_file_load", "init_module", "finit_module", "delete_module", "ptrace",
		"process_vm_readv", "process_vm_writev", "modify_ldt"}, Errno: unix.EPERM},
	{Names: []string{"clone"}, Args: []bpfseccomp.Condition{
		{Argument: 0, Operation: bpfseccomp.BitsSet, Value: nsFlags}}, Errno: unix.EPERM},
	// Socket families beyond unix, IPv4, IPv6 and netlink: as if the
	// kernel had none of them.
	{Names: []string{"socket"}, Args: notAnyOf(0, socketDomains), Errno: unix.EAFNOSUPPORT},
	{Names: []string{"socketpair"}, Args: []bpfseccomp.Condition{
		{Argument: 0, Operation: bpfseccomp.NotEqual, Value: unix.AF_UNIX}}, Errno: unix.EAFNOSUPPORT},
	// Netlink: NETLINK_ROUTE only (getaddrinfo, ip); NETLINK_NETFILTER,
	// audit, sock_diag and the rest are unknown protocols.
	{Names: []string{"socket"}, Args: []bpfseccomp.Condition{
		{Argument: 0, Operation: bpfseccomp.Equal, Value: unix.AF_NETLINK},
		{Argument: 2, Operation: bpfseccomp.NotEqual, Value: unix.NETLINK_ROUTE}}, Errno: unix.EPROTONOSUPPORT},
}

// socketDomains are the socket families a command may create.
var socketDomains = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// notAnyOf is the conditions "argument arg equals none of values".
func notAnyOf(arg uint32, values []uint64) []bpfseccomp.Condition {
	out := make([]bpfseccomp.Condition, len(values))
	for i, v := range values {
		out[i] = bpfseccomp.Condition{Argument: arg, Operation: bpfseccomp.NotEqual, Value: v}
	}
	return out
}

// unreachable reports whether Docker's rule r can never decide a call
// because a tightening decides it first: an allow of socket for one
// domain the tightenings refuse. Leaving such rules out keeps the
// program short (installing a filter costs the kernel time in
// proportion to its length, on every spawn).
func unreachable(r *dockerprofile.Syscall) bool {
	if !slices.Equal(r.Names, []string{"socket"}) || len(r.Args) != 1 {
		return false
	}
	a := r.Args[0]
	return a.Index == 0 && a.Op == specs.OpEqualTo && !slices.Contains(socketDomains, a.Value)
}

// NewFilter compiles the computer's filter for this architecture (amd64
// or arm64) and running kernel: the tightenings first, then Docker's
// errno rules, then Docker's allow rules, then ENOSYS for a number beyond
// the table (a system call newer than it: glibc then falls back, as
// under runc) and EPERM for the rest (Docker's default). The first rule
// that matches decides. System call numbers and the audit
// architecture come from go-seccomp-bpf's tables; the program is emitted
// by compile (see there for why not by go-seccomp-bpf's assembler).
func NewFilter() (*Filter, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSeccomp, err)
	}
	kernel, err := kernelVersion()
	if err != nil {
		return nil, err
	}
	groups := tighteningGroups()
	docker, err := dockerGroups(dockerprofile.DefaultProfile(), info, kernel)
	if err != nil {
		return nil, err
	}
	prog, err := compile(info, append(groups, docker...))
	if err != nil {
		return nil, err
	}
	return &Filter{prog: prog}, nil
}

// tighteningGroups turns tightenings into groups, one per rule, in order.
func tighteningGroups() []bpfseccomp.SyscallGroup {
	var groups []bpfseccomp.SyscallGroup
	for _, t := range tightenings {
		g := bpfseccomp.SyscallGroup{Action: bpfseccomp.ActionErrno | bpfseccomp.Action(t.Errno)}
		if len(t.Args) == 0 {
			g.Names = slices.Clone(t.Names)
		} else {
			for _, n := range t.Names {
				g.NamesWithCondtions = append(g.NamesWithCondtions, bpfseccomp.NameWithConditions{Name: n, Conditions: t.Args})
			}
		}
		groups = append(groups, g)
	}
	return groups
}

// tightened reports whether a tightening denies name without condition,
// so Docker's rule for it is left out.
func tightened(name string) bool {
	for _, t := range tightenings {
		if len(t.Args) == 0 && slices.Contains(t.Names, name) {
			return true
		}
	}
	return false
}

// dockerGroups converts the rules of Docker's profile that apply to a
// process without capabilities on info's architecture and this kernel:
// its errno rules first (clone3's ENOSYS), then one allow group. Names
// the architecture does not know (the profile serves every
// architecture) are skipped, so they stay denied.
func dockerGroups(p *dockerprofile.Seccomp, info *arch.Info, kernel [2]uint64) ([]bpfseccomp.SyscallGroup, error) {
	if p.DefaultAction != specs.ActErrno || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != uint(unix.EPERM) {
		return nil, fmt.Errorf("%w: Docker's profile no longer defaults to EPERM", ErrSeccomp)
	}
	allow := bpfseccomp.SyscallGroup{Action: bpfseccomp.ActionAllow}
	var errnos []bpfseccomp.SyscallGroup
	for _, r := range p.Syscalls {
		if !appliesUnprivileged(r, kernel) || unreachable(r) {
			continue
		}
		conds, err := dockerArgs(r.Args)
		if err != nil {
			return nil, err
		}
		var g *bpfseccomp.SyscallGroup
		switch {
		case r.Action == specs.ActAllow:
			g = &allow
		case r.Action == specs.ActErrno && r.ErrnoRet != nil:
			errnos = append(errnos, bpfseccomp.SyscallGroup{Action: bpfseccomp.ActionErrno | bpfseccomp.Action(*r.ErrnoRet)})
			g = &errnos[len(errnos)-1]
		default:
			return nil, fmt.Errorf("%w: Docker rule %v has action %s", ErrSeccomp, r.Names, r.Action)
		}
		for _, n := range append(slices.Clone(r.Names), r.Name) {
			if _, known := info.SyscallNames[n]; !known || tightened(n) {
				continue
			}
			if conds == nil {
				g.Names = append(g.Names, n)
			} else {
				g.NamesWithCondtions = append(g.NamesWithCondtions, bpfseccomp.NameWithConditions{Name: n, Conditions: conds})
			}
		}
	}
	return append(errnos, allow), nil
}

// appliesUnprivileged reports whether Docker applies rule r to a process
// with no capabilities on runtime.GOARCH and a kernel of version kernel.
func appliesUnprivileged(r *dockerprofile.Syscall, kernel [2]uint64) bool {
	if in := r.Includes; in != nil {
		if len(in.Caps) > 0 || len(in.Arches) > 0 && !slices.Contains(in.Arches, runtime.GOARCH) {
			return false
		}
		if k := in.MinKernel; k != nil && !atLeast(kernel, k) {
			return false
		}
	}
	if ex := r.Excludes; ex != nil {
		// excluded capabilities are ones the process lacks: the rule applies
		if slices.Contains(ex.Arches, runtime.GOARCH) || ex.MinKernel != nil && atLeast(kernel, ex.MinKernel) {
			return false
		}
	}
	return true
}

// atLeast reports whether kernel is version k or later.
func atLeast(kernel [2]uint64, k *dockerprofile.KernelVersion) bool {
	return kernel[0] > k.Kernel || kernel[0] == k.Kernel && kernel[1] >= k.Major
}

// dockerArgs converts the argument conditions of a Docker rule; nil when
// it has none. Only the comparisons the default profile uses are known.
func dockerArgs(args []specs.LinuxSeccompArg) ([]bpfseccomp.Condition, error) {
	var out []bpfseccomp.Condition
	for _, a := range args {
		c := bpfseccomp.Condition{Argument: uint32(a.Index), Value: a.Value}
		switch a.Op {
		case specs.OpEqualTo:
			c.Operation = bpfseccomp.Equal
		case specs.OpNotEqual:
			c.Operation = bpfseccomp.NotEqual
		case specs.OpLessThan:
			c.Operation = bpfseccomp.LessThan
		case specs.OpLessEqual:
			c.Operation = bpfseccomp.LessOrEqual
		case specs.OpGreaterThan:
			c.Operation = bpfseccomp.GreaterThan
		case specs.OpGreaterEqual:
			c.Operation = bpfseccomp.GreaterOrEqual
		case specs.OpMaskedEqual:
			if a.ValueTwo != 0 {
				return nil, fmt.Errorf("%w: Docker rule compares arg %d masked with %#x to %#x", ErrSeccomp, a.Index, a.Value, a.ValueTwo)
			}
			c.Operation = bpfseccomp.BitsNotSet // (arg & Value) == 0
		default:
			return nil, fmt.Errorf("%w: Docker rule uses the comparison %s", ErrSeccomp, a.Op)
		}
		out = append(out, c)
	}
	return out, nil
}

// kernelVersion returns the running kernel's version and major revision.
func kernelVersion() ([2]uint64, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return [2]uint64{}, fmt.Errorf("%w: uname: %w", ErrSeccomp, err)
	}
	var v [2]uint64
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &v[0], &v[1]); err != nil {
		return [2]uint64{}, fmt.Errorf("%w: kernel release %q: %w", ErrSeccomp, unix.ByteSliceToString(u.Release[:]), err)
	}
	return v, nil
}

// SeccompSupported reports whether the kernel can enforce a filter with
// every return action the Filter uses (SECCOMP_GET_ACTION_AVAIL).
func SeccompSupported() error {
	for _, a := range []uint32{unix.SECCOMP_RET_ERRNO, unix.SECCOMP_RET_ALLOW} {
		if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&a))); e != 0 {
			return fmt.Errorf("%w: the kernel cannot enforce a filter (action %#x): %w", ErrSeccomp, a, e)
		}
	}
	return nil
}

// installThread installs f on the calling thread alone. The thread must
// have no_new_privs set. A thread the runtime clones later from a locked
// thread is cloned from the template thread instead, so the filter never
// spreads to another receiver thread.
func (f *Filter) installThread() error { return f.install(0) }

// installAllThreads installs f on every thread of the process (TSYNC).
func (f *Filter) installAllThreads() error { return f.install(unix.SECCOMP_FILTER_FLAG_TSYNC) }

func (f *Filter) install(flags uintptr) error {
	prog := unix.SockFprog{Len: uint16(len(f.prog)), Filter: &f.prog[0]}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(f)
	if e != 0 {
		return fmt.Errorf("%w: install the filter: %w", ErrSeccomp, e)
	}
	if flags&unix.SECCOMP_FILTER_FLAG_TSYNC != 0 && r != 0 {
		return fmt.Errorf("%w: install the filter: thread %d could not be synchronized", ErrSeccomp, r)
	}
	return nil
}

// filterBytes is the program as the helper receives it: each instruction
// as code, jt, jf and k in native byte order (struct sock_filter).
func (f *Filter) bytes() []byte {
	b := make([]byte, 0, 8*len(f.prog))
	for _, in := range f.prog {
		b = append(b, unsafe.Slice((*byte)(unsafe.Pointer(&in)), 8)...)
	}
	return b
}

// errFilterBytes is wrapped when a helper's program is not whole
// instructions or is empty or too long.
var errFilterBytes = errors.New("seccomp program is not 1..4096 instructions of 8 bytes")

// filterFromBytes decodes a program sent to a helper.
func filterFromBytes(b []byte) (*Filter, error) {
	n := len(b) / 8
	if len(b)%8 != 0 || n == 0 || n > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("%w: %w (%d bytes)", ErrSeccomp, errFilterBytes, len(b))
	}
	f := &Filter{prog: make([]unix.SockFilter, n)}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&f.prog[0])), len(b)), b)
	return f, nil
}
