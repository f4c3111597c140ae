package acpmeta

import (
	"regexp"
	"strings"
	"testing"
)

// The patterns ValidOpKey and ValidDigest were written as regexps before
// they became loops; the regexps stay here as the oracle.
var (
	opKeyPattern  = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	digestPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// TestValidMatchesPattern: every byte value at the first, a middle and the
// last place of keys and digests of every length around the bounds is
// judged as the regexp judges it, and so are the cases named below.
func TestValidMatchesPattern(t *testing.T) {
	check := func(s string) {
		t.Helper()
		if got, want := ValidOpKey(s), opKeyPattern.MatchString(s); got != want {
			t.Fatalf("ValidOpKey(%q) = %v, the pattern says %v", s, got, want)
		}
		if got, want := ValidDigest(s), digestPattern.MatchString(s); got != want {
			t.Fatalf("ValidDigest(%q) = %v, the pattern says %v", s, got, want)
		}
	}
	for _, s := range []string{"", "\n", "a\n", strings.Repeat("a", 64) + "\n", "\n" + strings.Repeat("a", 64),
		strings.Repeat("A", 64), strings.Repeat("f", 64), strings.Repeat("g", 64), "op-1:a.b_c", "é"} {
		check(s)
	}
	var accepted, refused int
	for _, n := range []int{1, 2, 63, 64, 65, 127, 128, 129} {
		for _, at := range []int{0, n / 2, n - 1} {
			for c := range 256 {
				b := []byte(strings.Repeat("0", n))
				b[at] = byte(c)
				check(string(b))
				if ValidOpKey(string(b)) {
					accepted++
				} else {
					refused++
				}
			}
		}
	}
	if accepted == 0 || refused == 0 { // the loop saw both answers
		t.Fatalf("accepted %d, refused %d", accepted, refused)
	}
}

// FuzzValidMatchesPattern checks both loops against their regexps.
func FuzzValidMatchesPattern(f *testing.F) {
	for _, s := range []string{"", "op-1", strings.Repeat("a", 64), strings.Repeat("Z", 128), "a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidOpKey(s), opKeyPattern.MatchString(s); got != want {
			t.Fatalf("ValidOpKey(%q) = %v, the pattern says %v", s, got, want)
		}
		if got, want := ValidDigest(s), digestPattern.MatchString(s); got != want {
			t.Fatalf("ValidDigest(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}
