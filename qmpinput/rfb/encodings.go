package rfb

// The encodings a viewer may ask QEMU for. Everything else in a
// SetEncodings is removed before it is forwarded, so QEMU never turns on
// a feature the proxy does not parse or allow: the extended clipboard,
// xvp power control, fences, continuous updates, audio, extended desktop
// size (which would let a viewer resize the guest's screen), extended
// mouse buttons (a 7-byte pointer event the parser refuses) and pointer
// type changes.
var allowedEncodings = map[int32]string{
	0:    "raw",
	1:    "copyrect",
	2:    "rre",
	5:    "hextile",
	6:    "zlib",
	7:    "tight",
	16:   "zrle",
	-260: "tightpng",
	-223: "desktop-size",
	-224: "last-rect",
	-239: "cursor",
	-258: "qemu-extended-key-event",
	-261: "qemu-led-state",
	-307: "desktop-name",
	// VMware cursor (0x574d5664), as noVNC names it.
	0x574d5664: "vmware-cursor",
}

// Quality (-32..-23) and compression (-256..-247) levels tune the tight
// encoder and carry no feature.
func levelEncoding(e int32) bool {
	return (e >= -32 && e <= -23) || (e >= -256 && e <= -247)
}

// AllowedEncoding reports whether e may be forwarded to QEMU.
func AllowedEncoding(e int32) bool {
	_, ok := allowedEncodings[e]
	return ok || levelEncoding(e)
}

// FilterEncodings returns m with only allowed encodings, in the viewer's
// order, and how many were removed.
func FilterEncodings(m SetEncodings) (SetEncodings, int) {
	out := SetEncodings{Encodings: make([]int32, 0, len(m.Encodings))}
	for _, e := range m.Encodings {
		if AllowedEncoding(e) {
			out.Encodings = append(out.Encodings, e)
		}
	}
	return out, len(m.Encodings) - len(out.Encodings)
}
