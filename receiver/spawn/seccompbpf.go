package spawn

import (
	"encoding/binary"
	"fmt"

	bpfseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"
)

// BPF opcodes the filter uses (classic BPF, as seccomp runs it).
const (
	bpfLdAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeq    = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJgt    = unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K
	bpfJge    = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	bpfJset   = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfRet    = unix.BPF_RET | unix.BPF_K
)

// Offsets in struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// Jump targets of a condition block, resolved when the block ends.
const (
	toNext = -1 // the next instruction
	toPass = -2 // the condition holds: the next condition (or the action)
	toFail = -3 // the condition fails: the next rule
)

// asm is a program under construction with symbolic jump targets.
type asm struct {
	prog    []unix.SockFilter
	targets [][2]int // per instruction: jt, jf as toNext, toPass or toFail
}

func (a *asm) ld(off uint32) { a.emit(unix.SockFilter{Code: bpfLdAbsW, K: off}, toNext, toNext) }
func (a *asm) ret(k uint32)  { a.emit(unix.SockFilter{Code: bpfRet, K: k}, toNext, toNext) }

// jmp emits a jump whose targets are toNext, toPass or toFail.
func (a *asm) jmp(code uint16, k uint32, jt, jf int) {
	a.emit(unix.SockFilter{Code: code, K: k}, jt, jf)
}

// skip emits a jump over jt or jf instructions.
func (a *asm) skip(code uint16, k uint32, jt, jf uint8) {
	a.emit(unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}, toNext, toNext)
}

func (a *asm) emit(in unix.SockFilter, jt, jf int) {
	a.prog = append(a.prog, in)
	a.targets = append(a.targets, [2]int{jt, jf})
}

// resolve sets the pending targets of the instructions from index from
// on: toPass to pass and toFail to fail (absolute indexes; -1 leaves that
// kind pending). A jump is never more than 255 instructions long.
func (a *asm) resolve(from, pass, fail int) error {
	for i := from; i < len(a.prog); i++ {
		for j, t := range a.targets[i] {
			to := -1
			switch t {
			case toPass:
				to = pass
			case toFail:
				to = fail
			}
			if to < 0 {
				continue
			}
			skip := to - i - 1
			if skip < 0 || skip > 255 {
				return fmt.Errorf("%w: jump of %d instructions", ErrSeccomp, skip)
			}
			if j == 0 {
				a.prog[i].Jt = uint8(skip)
			} else {
				a.prog[i].Jf = uint8(skip)
			}
			a.targets[i][j] = toNext
		}
	}
	return nil
}

// compile emits the program: wrong architecture and x32 denied, then one
// rule per system call of each group in order, each "if nr matches and
// every condition holds, return the group's action", then ENOSYS for a
// number beyond info's table and EPERM for the rest.
//
// go-seccomp-bpf's own assembler (Policy.Assemble, v1.6.0) is not used:
// when an argument condition fails it goes on comparing the next system
// call numbers against the argument it last loaded, not the number, so a
// call's fate could depend on a later rule for another call (clone with
// CLONE_CHILD_SETTID was denied in our tests). Here every rule that
// loads an argument is followed by a reload of the number, and
// TestFilterDecisions evaluates the emitted program.
func compile(info *arch.Info, groups []bpfseccomp.SyscallGroup) ([]unix.SockFilter, error) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		return nil, fmt.Errorf("%w: only little-endian architectures are supported", ErrSeccomp)
	}
	a := &asm{}
	a.ld(offArch)
	a.skip(bpfJeq, uint32(info.ID), 1, 0)
	a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	a.ld(offNr)
	if info.ID == arch.X86_64.ID { // x32 system calls share the audit arch
		a.skip(bpfJge, uint32(arch.X32.SeccompMask), 0, 1)
		a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS))
	}
	for _, g := range groups {
		action := uint32(g.Action)
		if action == unix.SECCOMP_RET_ERRNO { // errno 0 would be success
			return nil, fmt.Errorf("%w: a rule of %v returns errno 0", ErrSeccomp, g.Names)
		}
		for _, n := range g.Names {
			nr, ok := info.SyscallNames[n]
			if !ok {
				return nil, fmt.Errorf("%w: %s has no number on %s", ErrSeccomp, n, info.Name)
			}
			a.skip(bpfJeq, uint32(nr), 0, 1)
			a.ret(action)
		}
		for _, nc := range g.NamesWithCondtions {
			nr, ok := info.SyscallNames[nc.Name]
			if !ok {
				return nil, fmt.Errorf("%w: %s has no number on %s", ErrSeccomp, nc.Name, info.Name)
			}
			if err := a.conditional(uint32(nr), nc.Conditions, action); err != nil {
				return nil, err
			}
		}
	}
	// A holds the number here: a conditional rule reloads it after itself.
	a.skip(bpfJgt, maxNumber(info), 0, 1)
	a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS))
	a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	if len(a.prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("%w: %d instructions, the kernel takes %d", ErrSeccomp, len(a.prog), unix.BPF_MAXINSNS)
	}
	return a.prog, nil
}

// conditional emits one rule with argument conditions (all must hold)
// and reloads the system call number after it, whichever way it went.
func (a *asm) conditional(nr uint32, conds []bpfseccomp.Condition, action uint32) error {
	start := len(a.prog)
	a.jmp(bpfJeq, nr, toNext, toFail)
	for _, c := range conds {
		from := len(a.prog)
		if err := a.condition(c); err != nil {
			return err
		}
		if err := a.resolve(from, len(a.prog), -1); err != nil {
			return err
		}
	}
	a.ret(action)
	if err := a.resolve(start, -1, len(a.prog)); err != nil {
		return err
	}
	a.ld(offNr)
	return nil
}

// condition emits the test of one 64-bit argument against a value, as
// two 32-bit halves (little-endian: the low half first in memory). Every
// jump goes to toPass, toFail or the next instruction.
func (a *asm) condition(c bpfseccomp.Condition) error {
	if c.Argument > 5 {
		return fmt.Errorf("%w: argument %d", ErrSeccomp, c.Argument)
	}
	lo, hi := uint32(offArgs+8*c.Argument), uint32(offArgs+8*c.Argument+4)
	vlo, vhi := uint32(c.Value), uint32(c.Value>>32)
	switch c.Operation {
	case bpfseccomp.Equal:
		a.ld(hi)
		a.jmp(bpfJeq, vhi, toNext, toFail)
		a.ld(lo)
		a.jmp(bpfJeq, vlo, toPass, toFail)
	case bpfseccomp.NotEqual:
		a.ld(hi)
		a.jmp(bpfJeq, vhi, toNext, toPass)
		a.ld(lo)
		a.jmp(bpfJeq, vlo, toFail, toPass)
	case bpfseccomp.LessThan, bpfseccomp.LessOrEqual:
		a.ld(hi)
		a.jmp(bpfJge, vhi, toNext, toPass) // hi < vhi
		a.jmp(bpfJeq, vhi, toNext, toFail) // hi > vhi
		a.ld(lo)
		if c.Operation == bpfseccomp.LessThan {
			a.jmp(bpfJge, vlo, toFail, toPass)
		} else {
			a.jmp(bpfJgt, vlo, toFail, toPass)
		}
	case bpfseccomp.GreaterThan, bpfseccomp.GreaterOrEqual:
		a.ld(hi)
		a.jmp(bpfJgt, vhi, toPass, toNext)
		a.jmp(bpfJeq, vhi, toNext, toFail)
		a.ld(lo)
		if c.Operation == bpfseccomp.GreaterThan {
			a.jmp(bpfJgt, vlo, toPass, toFail)
		} else {
			a.jmp(bpfJge, vlo, toPass, toFail)
		}
	case bpfseccomp.BitsNotSet: // (arg & Value) == 0
		a.ld(hi)
		a.jmp(bpfJset, vhi, toFail, toNext)
		a.ld(lo)
		a.jmp(bpfJset, vlo, toFail, toPass)
	case bpfseccomp.BitsSet: // (arg & Value) != 0
		a.ld(hi)
		a.jmp(bpfJset, vhi, toPass, toNext)
		a.ld(lo)
		a.jmp(bpfJset, vlo, toPass, toFail)
	default:
		return fmt.Errorf("%w: comparison %s", ErrSeccomp, c.Operation)
	}
	return nil
}

// maxNumber is the highest system call number in info's table.
func maxNumber(info *arch.Info) uint32 {
	var highest int
	for nr := range info.SyscallNumbers {
		highest = max(highest, nr)
	}
	return uint32(highest)
}
