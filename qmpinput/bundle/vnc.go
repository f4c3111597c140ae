package bundle

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// ErrDisplay: a machine argument would serve the screen or accept input
// anywhere but the pinned VNC unix socket the live view proxies.
var ErrDisplay = errors.New("bundle display arguments")

// vncProps are the only properties "-vnc unix:PATH,..." may carry. A
// password, TLS, SASL, a websocket, a reverse connection, power control
// (xvp), an audio device or a share mode that lets one client disconnect
// the others are refused: the view proxy is the only way in.
var vncProps = map[string]string{"share": "force-shared", "lossy": "off", "non-adaptive": "on"}

// refusedDisplayOptions serve the screen or input outside the pinned socket.
var refusedDisplayOptions = map[string]bool{"spice": true, "display-vnc": true}

// checkVNCArgs allows at most one -vnc, of the form
// "unix:/absolute/clean/path[,share=force-shared][,lossy=off][,non-adaptive=on]"
// with share=force-shared required, and refuses -display vnc and -spice.
func checkVNCArgs(args []string) error {
	seen := 0
	for i, arg := range args {
		name, inline, hasInline, ok := qemuOption(arg)
		if !ok {
			continue
		}
		value := inline
		if !hasInline && i+1 < len(args) {
			value = args[i+1]
		}
		switch {
		case refusedDisplayOptions[name]:
			return fmt.Errorf("%w: %q serves the screen outside the pinned VNC socket", ErrDisplay, arg)
		case name == "display" && strings.HasPrefix(value, "vnc"):
			return fmt.Errorf("%w: -display %q; use -vnc unix:PATH,share=force-shared", ErrDisplay, value)
		case name == "vnc":
			if err := checkVNCValue(value); err != nil {
				return err
			}
			seen++
		}
	}
	if seen > 1 {
		return fmt.Errorf("%w: %d -vnc options, at most one", ErrDisplay, seen)
	}
	return nil
}

func checkVNCValue(v string) error {
	if strings.Contains(v, ",,") {
		return fmt.Errorf("%w: -vnc %q has an escaped comma", ErrDisplay, v)
	}
	parts := strings.Split(v, ",")
	p, ok := strings.CutPrefix(parts[0], "unix:")
	if !ok || !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("%w: -vnc %q: only an absolute unix socket path is allowed (no TCP display)", ErrDisplay, v)
	}
	shared := false
	for _, kv := range parts[1:] {
		k, val, _ := strings.Cut(kv, "=")
		if want, ok := vncProps[k]; !ok || val != want {
			return fmt.Errorf("%w: -vnc property %q (allowed: share=force-shared, lossy=off, non-adaptive=on)", ErrDisplay, kv)
		}
		shared = shared || k == "share"
	}
	if !shared {
		return fmt.Errorf("%w: -vnc %q needs share=force-shared", ErrDisplay, v)
	}
	return nil
}
