package spawn

import (
	"encoding/binary"
	"fmt"
	"slices"

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
	bpfJa     = unix.BPF_JMP | unix.BPF_JA
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
	toEnd  = -4 // not this rule's system call: past its rules
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

// callRules are the rules that can decide one system call, in order:
// conditional rules, then the first unconditional one (later rules for
// the call can never decide it).
type callRules struct {
	nr       uint32
	conds    []condRule
	final    uint32 // the first unconditional rule's action
	hasFinal bool
}

// condRule returns action when every condition holds.
type condRule struct {
	conds  []bpfseccomp.Condition
	action uint32
}

// rulesByCall gathers groups (first match decides) into one callRules
// per system call.
func rulesByCall(info *arch.Info, groups []bpfseccomp.SyscallGroup) (map[uint32]*callRules, error) {
	calls := map[uint32]*callRules{}
	get := func(name string) (*callRules, error) {
		nr, ok := info.SyscallNames[name]
		if !ok {
			return nil, fmt.Errorf("%w: %s has no number on %s", ErrSeccomp, name, info.Name)
		}
		if calls[uint32(nr)] == nil {
			calls[uint32(nr)] = &callRules{nr: uint32(nr)}
		}
		return calls[uint32(nr)], nil
	}
	for _, g := range groups {
		action := uint32(g.Action)
		if action == unix.SECCOMP_RET_ERRNO { // errno 0 would be success
			return nil, fmt.Errorf("%w: a rule of %v returns errno 0", ErrSeccomp, g.Names)
		}
		for _, n := range g.Names {
			r, err := get(n)
			if err != nil {
				return nil, err
			}
			if !r.hasFinal {
				r.final, r.hasFinal = action, true
			}
		}
		for _, nc := range g.NamesWithCondtions {
			r, err := get(nc.Name)
			if err != nil {
				return nil, err
			}
			if !r.hasFinal {
				r.conds = append(r.conds, condRule{conds: nc.Conditions, action: action})
			}
		}
	}
	return calls, nil
}

// compile emits the program: a wrong architecture and x32 denied; then,
// for each system call with argument conditions, its rules in order;
// then a binary search on the number over the calls that no argument
// decides, each returning its action; any other number gets ENOSYS
// beyond info's table and EPERM within it.
//
// go-seccomp-bpf's own assembler (Policy.Assemble, v1.6.0) is not used:
// when an argument condition fails it goes on comparing the next system
// call numbers against the argument it last loaded, not the number, so a
// call's fate could depend on a later rule for another call (clone with
// CLONE_CHILD_SETTID was denied in our tests). Its linear chain also
// made installing the filter slow: the kernel runs the filter for every
// system call number when it is installed (the allow cache), on every
// spawn. Here a call's conditional rules all end in a return, so the
// number is never compared with an argument, and TestFilterDecisions
// compares the emitted program with the rules for every number.
func compile(info *arch.Info, groups []bpfseccomp.SyscallGroup) ([]unix.SockFilter, error) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		return nil, fmt.Errorf("%w: only little-endian architectures are supported", ErrSeccomp)
	}
	calls, err := rulesByCall(info, groups)
	if err != nil {
		return nil, err
	}
	var conditional, flat []*callRules
	for _, r := range calls {
		if len(r.conds) > 0 {
			conditional = append(conditional, r)
		} else {
			flat = append(flat, r)
		}
	}
	byNr := func(x, y *callRules) int { return int(x.nr) - int(y.nr) }
	slices.SortFunc(conditional, byNr)
	slices.SortFunc(flat, byNr)
	a := &asm{}
	a.ld(offArch)
	a.skip(bpfJeq, uint32(info.ID), 1, 0)
	a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	a.ld(offNr)
	if info.ID == arch.X86_64.ID { // x32 system calls share the audit arch
		a.skip(bpfJge, uint32(arch.X32.SeccompMask), 0, 1)
		a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS))
	}
	for _, r := range conditional {
		if err := a.chain(r); err != nil {
			return nil, err
		}
	}
	var toTail []int
	a.tree(flat, &toTail)
	for _, j := range toTail {
		a.prog[j].K = uint32(len(a.prog) - j - 1)
	}
	a.skip(bpfJgt, maxNumber(info), 0, 1) // A holds the number on every path here
	a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS))
	a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	if len(a.prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("%w: %d instructions, the kernel takes %d", ErrSeccomp, len(a.prog), unix.BPF_MAXINSNS)
	}
	return a.prog, nil
}

// leafSize is the most calls a leaf of the search compares one by one.
const leafSize = 8

// tree emits a binary search over rs (sorted by number): nr >= the
// middle goes on to a long jump to the upper half, below it skips that
// jump into the lower half. A leaf compares each number and returns its
// action; a number in none jumps to the tail (appended to toTail for the
// caller to patch). A is never changed.
func (a *asm) tree(rs []*callRules, toTail *[]int) {
	if len(rs) <= leafSize {
		a.leaf(rs, toTail)
		return
	}
	mid := len(rs) / 2
	a.skip(bpfJge, rs[mid].nr, 0, 1)
	ja := len(a.prog)
	a.skip(bpfJa, 0, 0, 0)
	a.tree(rs[:mid], toTail)
	a.prog[ja].K = uint32(len(a.prog) - ja - 1)
	a.tree(rs[mid:], toTail)
}

// leaf emits "if nr is one of rs, return its action, else go to the
// tail": one comparison per call, then the jump to the tail, then one
// return per distinct action.
func (a *asm) leaf(rs []*callRules, toTail *[]int) {
	var actions []uint32
	for _, r := range rs {
		if !slices.Contains(actions, r.final) {
			actions = append(actions, r.final)
		}
	}
	for i, r := range rs { // over the rest and the jump, to the action's return
		a.skip(bpfJeq, r.nr, uint8(len(rs)-i+slices.Index(actions, r.final)), 0)
	}
	*toTail = append(*toTail, len(a.prog))
	a.skip(bpfJa, 0, 0, 0)
	for _, act := range actions {
		a.ret(act)
	}
}

// chain emits the rules of one call with argument conditions: if nr is
// r's, each rule in order (all its conditions hold: return its action),
// then r's unconditional action, or EPERM without one. Every path in it
// ends in a return; a different nr jumps over it with A unchanged.
func (a *asm) chain(r *callRules) error {
	start := len(a.prog)
	a.jmp(bpfJeq, r.nr, toNext, toEnd)
	for _, cr := range r.conds {
		ruleStart := len(a.prog)
		for _, c := range cr.conds {
			from := len(a.prog)
			if err := a.condition(c); err != nil {
				return err
			}
			if err := a.resolve(from, len(a.prog), -1); err != nil {
				return err
			}
		}
		a.ret(cr.action)
		if err := a.resolve(ruleStart, -1, len(a.prog)); err != nil { // a failed condition: the next rule
			return err
		}
	}
	if r.hasFinal {
		a.ret(r.final)
	} else {
		a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	}
	return a.resolveEnd(start, len(a.prog))
}

// resolveEnd sets the toEnd target of the instruction at index i.
func (a *asm) resolveEnd(i, end int) error {
	skip := end - i - 1
	if skip > 255 {
		return fmt.Errorf("%w: the rules of system call %d take %d instructions", ErrSeccomp, a.prog[i].K, skip)
	}
	a.prog[i].Jf = uint8(skip)
	a.targets[i][1] = toNext
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
