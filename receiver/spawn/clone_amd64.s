#include "go_asm.h"
#include "textflag.h"

// func rawClone(plan *clonePlan) uintptr
//
// clone3(plan.args, plan.size). The parent returns the kernel's result
// (the child's pid, or -errno). The child (CLONE_VM|CLONE_VFORK: it runs
// in the parent's memory while the parent thread sleeps) never returns:
// it runs plan.steps, one raw system call each, using only registers and
// the plan's memory, never the stack, and ends in execve; on the first
// failure it records the errno and the steps left in the plan and exits
// 127. The child's signal handlers are the defaults (CLONE_CLEAR_SIGHAND),
// so no Go handler ever runs on the parent's memory.
TEXT ·rawClone(SB),NOSPLIT|NOFRAME,$0-16
	MOVQ	plan+0(FP), BX
	MOVQ	clonePlan_args(BX), DI
	MOVQ	clonePlan_size(BX), SI
	MOVQ	clonePlan_steps(BX), R12
	MOVQ	clonePlan_n(BX), R13
	MOVQ	$435, AX // SYS_clone3
	SYSCALL
	TESTQ	AX, AX
	JEQ	child
	MOVQ	AX, ret+8(FP)
	RET

child:
	// BX (the plan), R12 (the next step) and R13 (steps left) survive
	// SYSCALL, which clobbers only AX, CX and R11.
	TESTQ	R13, R13
	JEQ	noexec
	MOVQ	step_nr(R12), AX
	MOVQ	step_a1(R12), DI
	MOVQ	step_a2(R12), SI
	MOVQ	step_a3(R12), DX
	MOVQ	step_a4(R12), R10
	MOVQ	step_a5(R12), R8
	MOVQ	step_a6(R12), R9
	SYSCALL
	CMPQ	AX, $0xfffffffffffff001
	JCC	failed // -4095 <= AX < 0: an errno
	MOVQ	step_mismatch(R12), CX
	TESTQ	CX, CX
	JEQ	next
	CMPQ	AX, step_want(R12)
	JEQ	next
	MOVQ	CX, AX
	JMP	record

next:
	ADDQ	$step__size, R12
	DECQ	R13
	JMP	child

noexec:
	// Every plan ends in execve, which does not return on success.
	MOVQ	$8, AX // ENOEXEC
	JMP	record

failed:
	NEGQ	AX

record:
	MOVQ	AX, clonePlan_errno(BX)
	MOVQ	R13, clonePlan_left(BX)
	MOVQ	$127, DI
	MOVQ	$231, AX // SYS_exit_group
	SYSCALL
	JMP	record // not reached
