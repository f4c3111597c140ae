package jail

import (
	"strconv"
	"strings"
)

// scratchPrefix begins the name of every scratch directory and cgroup
// of a jail.
const scratchPrefix = "tether-jail-"

// scratchPattern is os.MkdirTemp's pattern for uid's scratch directory:
// "tether-jail-<uid>-<random digits>".
func scratchPattern(uid uint32) string {
	return scratchPrefix + strconv.FormatUint(uint64(uid), 10) + "-*"
}

// parseScratchName returns the uid in a scratch directory's name
// ("tether-jail-<uid>-<digits>", the uid in canonical decimal, not 0).
func parseScratchName(name string) (uint32, bool) {
	rest, ok := strings.CutPrefix(name, scratchPrefix)
	if !ok {
		return 0, false
	}
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	digits, suffix := rest[:i], rest[i:]
	if len(suffix) < 2 || suffix[0] != '-' || !allDigits(suffix[1:]) {
		return 0, false
	}
	uid, err := strconv.ParseUint(digits, 10, 32)
	if err != nil || uid == 0 || strconv.FormatUint(uid, 10) != digits {
		return 0, false
	}
	return uint32(uid), true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// cgroupName is the name of the cgroup of the jail whose uid is uid:
// "tether-jail-<uid>".
func cgroupName(uid uint32) string {
	return scratchPrefix + strconv.FormatUint(uint64(uid), 10)
}

// parseCgroupName returns the uid in a jail cgroup's name (cgroupName,
// the uid in canonical decimal, not 0).
func parseCgroupName(name string) (uint32, bool) {
	digits, ok := strings.CutPrefix(name, scratchPrefix)
	if !ok || !allDigits(digits) {
		return 0, false
	}
	uid, err := strconv.ParseUint(digits, 10, 32)
	if err != nil || uid == 0 || strconv.FormatUint(uid, 10) != digits {
		return 0, false
	}
	return uint32(uid), true
}
