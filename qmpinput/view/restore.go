package view

import (
	"errors"
	"os"

	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/auditlog"
	"github.com/tetherdev/tether/qmpinput/statedir"
)

// RestorePause reads the audit log in dir and, if its last pause has no
// resume after it, tells the adapter the VM is still paused
// (Adapter.AdoptPause): a view restarted while the VM was frozen keeps the
// agent fenced and offers Resume. The closed command set has no query, so
// the log is the record of what the view did. It reports whether a pause
// was restored; a log that does not verify is an error.
func RestorePause(dir *statedir.Dir, a *qmpinput.Adapter) (bool, error) {
	recs, err := auditlog.Read(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for i := len(recs) - 1; i >= 0; i-- {
		switch recs[i].Kind {
		case auditlog.KindResume:
			return false, nil
		case auditlog.KindPause:
			return true, a.AdoptPause(recs[i].Actor, recs[i].Time)
		}
	}
	return false, nil
}
