package spawn

// rawClone is clone_amd64.s: clone3 with plan.args; the child runs
// plan.steps and never returns. It returns the kernel's raw result. Not
// go:noescape on purpose: plan, and so every buffer it holds, lives on the
// heap, which the child reads while the parent's goroutine sleeps.
func rawClone(plan *clonePlan) uintptr

const cloneArch = true
