package bundle

import (
	"fmt"
	"strings"
)

// The accelerator pin. QEMU picks its accelerator from -accel, from
// -machine accel=, from -enable-kvm, from a xen machine type, from a
// config file, or, when none is given, from a default that depends on the
// binary's name (a binary named qemu-kvm prefers kvm). So the machine
// arguments must select tcg exactly once, with "-accel tcg[,prop=value...]",
// must carry -no-user-config (so the host's qemu.conf cannot add an [accel]
// section), and every other way of choosing is refused.

// foreignAccels are accelerator names refused anywhere in an argument.
var foreignAccels = []string{"kvm", "hvf", "whpx", "nvmm", "hax", "xen"}

// refusedOptions choose an accelerator, or load settings that can, behind
// the pinned arguments' back.
var refusedOptions = map[string]bool{
	"enable-kvm": true, "no-kvm": true, "enable-hax": true,
	"qtest": true, "qtest-log": true, "readconfig": true, "set": true,
}

// flagOptions are QEMU options known to take no value: an -accel right
// after one of them is still read as an option.
var flagOptions = map[string]bool{
	"nographic": true, "snapshot": true, "no-reboot": true, "no-shutdown": true,
	"nodefaults": true, "no-user-config": true, "S": true, "s": true, "full-screen": true,
}

// tcgProps are the properties "-accel tcg,..." may set.
var tcgProps = map[string]bool{"thread": true, "tb-size": true, "split-wx": true, "one-insn-per-tb": true}

// qemuOption reports whether tok is a QEMU option and its name. QEMU
// treats "--name" as "-name"; a "-name=value" token is read as option name
// with an inline value, so a value cannot hide there either.
func qemuOption(tok string) (name, inline string, hasInline, ok bool) {
	if len(tok) < 2 || tok[0] != '-' {
		return "", "", false, false
	}
	name = strings.TrimPrefix(tok[1:], "-")
	name, inline, hasInline = strings.Cut(name, "=")
	return name, inline, hasInline, true
}

// checkAccelArgs refuses machine arguments that do not select tcg exactly
// once through "-accel tcg[,...]", or that select anything else by any
// other route.
func checkAccelArgs(args []string) error {
	selections, noUserConfig := 0, false
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if err := checkForeignName(arg); err != nil {
			return err
		}
		name, inline, hasInline, ok := qemuOption(arg)
		if !ok {
			continue
		}
		value, valueOK := inline, hasInline
		if !hasInline && i+1 < len(args) {
			value, valueOK = args[i+1], true
		}
		switch {
		case name == "no-user-config" && !hasInline:
			noUserConfig = true
		case refusedOptions[name] || strings.HasPrefix(name, "xen"):
			return fmt.Errorf("%w: machine argument %q selects or loads another accelerator", ErrAccelerator, arg)
		case name == "machine" || name == "M":
			if err := checkMachine(value); err != nil {
				return err
			}
		case name == "accel":
			if err := checkAccelSelection(args, i, value, valueOK); err != nil {
				return err
			}
			selections++
		}
	}
	if !noUserConfig {
		return fmt.Errorf("%w: -no-user-config missing: the host's QEMU config file could choose the accelerator", ErrAccelerator)
	}
	if selections != 1 {
		return fmt.Errorf("%w: %d accelerator selections in the machine arguments, want exactly one \"-accel tcg\"", ErrAccelerator, selections)
	}
	return nil
}

func checkForeignName(arg string) error {
	low := strings.ToLower(arg)
	for _, bad := range foreignAccels {
		if strings.Contains(low, bad) {
			return fmt.Errorf("%w: machine argument %q names %s", ErrAccelerator, arg, bad)
		}
	}
	for _, part := range strings.Split(low, ",") {
		if v, ok := strings.CutPrefix(part, "accel="); ok && v != AccelTCG {
			return fmt.Errorf("%w: machine argument %q", ErrAccelerator, arg)
		}
	}
	return nil
}

// checkAccelSelection checks the -accel at args[i]: it must stand where
// QEMU reads an option (first, or after a value rather than after an
// option that would swallow it as its value), and its value must be tcg
// with only known tcg properties.
func checkAccelSelection(args []string, i int, value string, valueOK bool) error {
	if i > 0 {
		if prev, _, hasInline, isOption := qemuOption(args[i-1]); isOption && !hasInline && !flagOptions[prev] {
			return fmt.Errorf("%w: %q follows the option %q, which may take it as its value", ErrAccelerator, args[i], args[i-1])
		}
	}
	if !valueOK || strings.Contains(value, ",,") {
		return fmt.Errorf("%w: -accel %q", ErrAccelerator, value)
	}
	parts := strings.Split(strings.ToLower(value), ",")
	if parts[0] != AccelTCG && parts[0] != "accel="+AccelTCG {
		return fmt.Errorf("%w: -accel %q", ErrAccelerator, value)
	}
	for _, p := range parts[1:] {
		if k, _, ok := strings.Cut(p, "="); !ok || !tcgProps[k] {
			return fmt.Errorf("%w: -accel %q: property %q is not a known tcg property", ErrAccelerator, value, p)
		}
	}
	return nil
}

// checkMachine refuses a -machine value that sets accel= (the accelerator
// is chosen by -accel only) or names a xen machine type.
func checkMachine(value string) error {
	if strings.Contains(value, ",,") {
		return fmt.Errorf("%w: -machine %q has an escaped comma", ErrAccelerator, value)
	}
	for i, p := range strings.Split(strings.ToLower(value), ",") {
		k, v, hasEq := strings.Cut(p, "=")
		if hasEq && k == "accel" {
			return fmt.Errorf("%w: -machine %q sets accel=; use -accel tcg", ErrAccelerator, value)
		}
		typ := ""
		switch {
		case i == 0 && !hasEq:
			typ = p
		case hasEq && k == "type":
			typ = v
		}
		if strings.HasPrefix(typ, "xen") {
			return fmt.Errorf("%w: -machine %q is a xen machine type", ErrAccelerator, value)
		}
	}
	return nil
}
