package qmpinput

import "errors"

// codes maps every sentinel to the stable name tether-qmp prints; callers
// of the CLI branch on these names, Go callers on the sentinels.
var codes = []struct {
	err  error
	code string
}{
	{ErrNotUnixSocket, "not_unix_socket"}, {ErrSocketOwner, "socket_owner"}, {ErrSocketMode, "socket_mode"},
	{ErrSocketChanged, "socket_changed"}, {ErrVersion, "qemu_version"}, {ErrProtocol, "protocol"},
	{ErrCommandNotAllowed, "command_not_allowed"}, {ErrActionDeadline, "action_deadline"}, {ErrDeadline, "deadline"}, {ErrClosed, "closed"},
	{ErrCommandFailed, "command_failed"}, {ErrNoCapture, "no_capture"}, {ErrOutOfBounds, "out_of_bounds"},
	{ErrKeyNotAllowed, "key_not_allowed"}, {ErrTextNotAllowed, "text_not_allowed"},
	{ErrScrollNotAllowed, "scroll_not_allowed"}, {ErrPoolFull, "pool_full"}, {ErrCapture, "capture_invalid"},
	{ErrFenced, "fenced"}, {ErrMasked, "masked"}, {ErrHandoverActive, "handover_active"},
	{ErrPaused, "paused"}, {ErrNotPaused, "not_paused"},
	{ErrUnsupported, "unsupported"}, {ErrConfig, "config"}, {ErrScript, "script"},
}

// ErrorCode returns the stable name of err's sentinel, or "error" when err
// wraps none of them (for example a cancelled context).
func ErrorCode(err error) string {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "error"
}
