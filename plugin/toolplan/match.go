package toolplan

import (
	"path"
	"strings"

	"github.com/tetherdev/tether/admission/errcode"
)

// Bounds on a glob pattern keep Match's backtracking over "**" small.
const (
	MaxPatternBytes = 512
	MaxDoubleStars  = 4
)

// ValidPattern checks a glob pattern: relative, at most MaxPatternBytes and
// MaxDoubleStars "**" segments, no empty, "." or ".." segment, and each
// segment a valid path.Match pattern or "**".
func ValidPattern(pattern string) error {
	if pattern == "" || path.IsAbs(pattern) || len(pattern) > MaxPatternBytes {
		return errcode.Errorf(errcode.CodeInvalid, "glob: pattern must be a relative pattern of 1-%d bytes", MaxPatternBytes)
	}
	stars := 0
	for _, seg := range strings.Split(pattern, "/") {
		switch seg {
		case "", ".", "..":
			return errcode.Errorf(errcode.CodeInvalid, "glob: pattern %q has an empty, . or .. segment", pattern)
		case "**":
			if stars++; stars > MaxDoubleStars {
				return errcode.Errorf(errcode.CodeInvalid, "glob: pattern has more than %d ** segments", MaxDoubleStars)
			}
			continue
		}
		if _, err := path.Match(seg, ""); err != nil {
			return errcode.Errorf(errcode.CodeInvalid, "glob: segment %q: %v", seg, err)
		}
	}
	return nil
}

// Match reports whether the slash-separated relative path name matches
// pattern: each segment as path.Match, and "**" matching zero or more whole
// segments. An invalid pattern matches nothing.
func Match(pattern, name string) bool {
	if ValidPattern(pattern) != nil || name == "" {
		return false
	}
	return matchSegs(strings.Split(pattern, "/"), strings.Split(name, "/"))
}

func matchSegs(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			// Collapse runs of ** and try every split point.
			for len(pat) > 0 && pat[0] == "**" {
				pat = pat[1:]
			}
			if len(pat) == 0 {
				return true
			}
			for i := 0; i <= len(name); i++ {
				if matchSegs(pat, name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}
