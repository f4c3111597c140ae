package jail

import (
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	for _, c := range []struct {
		in         string
		ppid, pgrp int
		ok         bool
	}{
		{"18125 (node) S 18124 18124 18124 0 -1 4194560", 18124, 18124, true},
		{"7 (a) b (c) ) R 3 9 9 0", 3, 9, true}, // a command name with spaces and parentheses
		{"7 (x) S 3", 0, 0, false},
		{"7 x S 3 4 5", 0, 0, false},
		{"7 (x) S three 4 5", 0, 0, false},
	} {
		ppid, pgrp, err := parseStat([]byte(c.in))
		if (err == nil) != c.ok || ppid != c.ppid || pgrp != c.pgrp {
			t.Errorf("parseStat(%q) = %d, %d, %v; want %d, %d, ok=%v", c.in, ppid, pgrp, err, c.ppid, c.pgrp, c.ok)
		}
	}
	ppid, pgrp, err := parentAndGroup(os.Getpid())
	if err != nil || ppid != os.Getppid() {
		t.Fatalf("parentAndGroup(self) = %d, %d, %v; want ppid %d", ppid, pgrp, err, os.Getppid())
	}
	if pgrp <= 0 {
		t.Errorf("process group %d", pgrp)
	}
}

func FuzzParseStat(f *testing.F) {
	for _, s := range []string{"1 (init) S 0 1 1 0 -1", "7 (a) b) R 3 9 9", "7 ()) S 1 2", "(", ")"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ppid, pgrp, err := parseStat(data)
		if err != nil && (ppid != 0 || pgrp != 0) {
			t.Fatalf("error %v with ppid %d pgrp %d", err, ppid, pgrp)
		}
	})
}
