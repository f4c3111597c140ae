package qmpinput

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/digitalocean/go-qemu/qmp/raw"
)

// allowedKeys is the QKeyCode allowlist (QEMU's qapi/ui.json names) for
// Key combos and Type. Power, sleep, wake, sysrq and media keys are left
// out: none of them is needed to drive a desktop and sysrq can reboot or
// kill the guest.
var allowedKeys = map[string]bool{}

func init() {
	for _, k := range strings.Fields(`
		shift shift_r alt alt_r ctrl ctrl_r meta_l meta_r menu
		esc tab ret spc backspace delete insert home end pgup pgdn
		up down left right caps_lock
		f1 f2 f3 f4 f5 f6 f7 f8 f9 f10 f11 f12
		a b c d e f g h i j k l m n o p q r s t u v w x y z
		1 2 3 4 5 6 7 8 9 0
		minus equal bracket_left bracket_right backslash semicolon apostrophe
		grave_accent comma dot slash`) {
		allowedKeys[k] = true
	}
}

// keyAliases are friendlier names accepted in combos.
var keyAliases = map[string]string{
	"control": "ctrl", "super": "meta_l", "meta": "meta_l", "win": "meta_l",
	"enter": "ret", "return": "ret", "space": "spc", "escape": "esc",
	"del": "delete", "pageup": "pgup", "pagedown": "pgdn", "ins": "insert",
}

// deniedSets are key sets that reboot the guest or kill its display
// server (ctrl+alt+delete, ctrl+alt+backspace), by canonical name: a combo
// is denied when it holds every key of one, whatever else it holds.
var deniedSets = [][]string{
	{"ctrl", "alt", "delete"},
	{"ctrl", "alt", "backspace"},
}

// MaxComboKeys bounds the keys pressed together.
const MaxComboKeys = 4

// qcode returns go-qemu's QKeyCode for an allowed key name.
func qcode(name string) (raw.QKeyCode, error) {
	if a, ok := keyAliases[name]; ok {
		name = a
	}
	if !allowedKeys[name] {
		return 0, fmt.Errorf("%w: %q is not in the QKeyCode allowlist", ErrKeyNotAllowed, name)
	}
	var k raw.QKeyCode
	if err := json.Unmarshal([]byte(`"`+name+`"`), &k); err != nil {
		return 0, fmt.Errorf("%w: %q: %w", ErrKeyNotAllowed, name, err)
	}
	return k, nil
}

// parseCombo turns "ctrl+alt+t" into key codes, in press order.
func parseCombo(combo string) ([]raw.QKeyCode, error) {
	parts := strings.Split(strings.ToLower(strings.TrimSpace(combo)), "+")
	if len(parts) == 0 || len(parts) > MaxComboKeys {
		return nil, fmt.Errorf("%w: %q has %d keys, limit %d", ErrKeyNotAllowed, combo, len(parts), MaxComboKeys)
	}
	var codes []raw.QKeyCode
	held := map[string]bool{}
	for _, p := range parts {
		k, err := qcode(p)
		if err != nil {
			return nil, err
		}
		name := canonicalKey(k.String())
		if held[name] {
			return nil, fmt.Errorf("%w: %q repeats %s", ErrKeyNotAllowed, combo, name)
		}
		held[name] = true
		codes = append(codes, k)
	}
	for _, set := range deniedSets {
		if holdsAll(held, set) {
			return nil, fmt.Errorf("%w: combo %q contains the denied %s", ErrKeyNotAllowed, combo, strings.Join(set, "+"))
		}
	}
	return codes, nil
}

// canonicalKey folds left and right modifiers to one name, so neither a
// denied combo nor a repeat can hide behind the other side's key.
func canonicalKey(n string) string {
	switch n {
	case "ctrl_r":
		return "ctrl"
	case "alt_r":
		return "alt"
	case "shift_r":
		return "shift"
	case "meta_l", "meta_r":
		return "meta"
	}
	return n
}

func holdsAll(held map[string]bool, set []string) bool {
	for _, k := range set {
		if !held[k] {
			return false
		}
	}
	return true
}

// typedKey is one character of Type: a key and whether shift is held.
type typedKey struct {
	code  raw.QKeyCode
	shift bool
}

// usLayout maps printable ASCII, tab and newline to keys on a US layout.
var usLayout = map[rune]typedKey{}

func init() {
	add := func(chars, names string, shift bool) {
		ns := strings.Fields(names)
		for i, r := range chars {
			k, err := qcode(ns[i])
			if err != nil {
				panic(err)
			}
			usLayout[r] = typedKey{k, shift}
		}
	}
	add("abcdefghijklmnopqrstuvwxyz", "a b c d e f g h i j k l m n o p q r s t u v w x y z", false)
	add("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "a b c d e f g h i j k l m n o p q r s t u v w x y z", true)
	add("1234567890", "1 2 3 4 5 6 7 8 9 0", false)
	add("!@#$%^&*()", "1 2 3 4 5 6 7 8 9 0", true)
	add("-=[]\\;',./`", "minus equal bracket_left bracket_right backslash semicolon apostrophe comma dot slash grave_accent", false)
	add("_+{}|:\"<>?~", "minus equal bracket_left bracket_right backslash semicolon apostrophe comma dot slash grave_accent", true)
	add(" \t\n", "spc tab ret", false)
}
