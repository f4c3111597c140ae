package provision

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/tetherdev/tether/admission/idfiles"
)

// Fresh ids are drawn from [MinID, MinID+idSpan). They are above every id
// a distribution assigns and need no passwd entry.
const (
	MinID  = 60000
	idSpan = 1 << 22
)

// FreshID picks an id that no process uses as a uid, that neither
// /etc/passwd nor /etc/group names, and that lies in no subordinate id
// range of /etc/subuid or /etc/subgid (which map to the files of
// rootless containers' users), so files and processes owned by it belong
// to this computer alone. 65534 and 65535 (nobody, -1 as 16 bits) are
// never picked. Ids used only by files on some filesystem are not seen.
func FreshID() (uint32, error) {
	taken, err := namedIDs()
	if err != nil {
		return 0, err
	}
	sub, err := subIDRanges(subIDFiles...)
	if err != nil {
		return 0, err
	}
	for range 64 {
		id := uint32(MinID + rand.IntN(idSpan))
		if id == 65534 || id == 65535 || taken[id] || sub.contain(id) {
			continue
		}
		used, err := uidInUse(id)
		if err != nil {
			return 0, err
		}
		if !used {
			return id, nil
		}
	}
	return 0, fmt.Errorf("%w: no free id found in 64 tries", ErrOptions)
}

// namedIDs returns every uid and gid /etc/passwd and /etc/group name.
func namedIDs() (map[uint32]bool, error) {
	out := map[uint32]bool{}
	if err := idfiles.Named(out, "/etc/passwd", 2, 3); err != nil {
		return nil, err
	}
	if err := idfiles.Named(out, "/etc/group", 2); err != nil {
		return nil, err
	}
	return out, nil
}

// subIDFiles are the subordinate id files FreshID avoids.
var subIDFiles = []string{"/etc/subuid", "/etc/subgid"}

// idRanges are subordinate id ranges (admission/idfiles).
type idRanges struct{ idfiles.Ranges }

func (rs idRanges) contain(id uint32) bool { return rs.Contain(id) }

// subIDRanges reads subordinate id files (idfiles.Subordinate); a line
// that does not parse is refused as ErrOptions: an unreadable range must
// not let a fresh id fall inside it.
func subIDRanges(paths ...string) (idRanges, error) {
	rs, err := idfiles.Subordinate(paths...)
	if errors.Is(err, idfiles.ErrMalformed) {
		return idRanges{}, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	return idRanges{rs}, err
}
