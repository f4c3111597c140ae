package rfb

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// testClient is a minimal RFB viewer for tests: raw encoding at 32 bits
// per pixel, so updates can be read without a decoder.
type testClient struct {
	c    net.Conn
	br   *bufio.Reader
	init ServerInit
}

// rawFormat is 32-bit little-endian true colour.
var rawFormat = PixelFormat{BitsPerPixel: 32, Depth: 24, TrueColour: true,
	RedMax: 255, GreenMax: 255, BlueMax: 255, RedShift: 16, GreenShift: 8, BlueShift: 0}

func newTestClient(c net.Conn) (*testClient, error) {
	c.SetDeadline(time.Now().Add(20 * time.Second))
	defer c.SetDeadline(time.Time{})
	init, err := ClientHandshake(c)
	if err != nil {
		return nil, err
	}
	return &testClient{c: c, br: bufio.NewReaderSize(c, 1<<20), init: init}, nil
}

// setup asks for raw 32-bit pixels; call it once the session runs.
func (tc *testClient) setup() error {
	return tc.send(SetPixelFormat{Format: rawFormat}, SetEncodings{Encodings: []int32{0, -223}})
}

func (tc *testClient) send(ms ...Msg) error {
	for _, m := range ms {
		if _, err := tc.c.Write(m.Encode()); err != nil {
			return err
		}
	}
	return nil
}

// update requests an update and reads one FramebufferUpdate, returning
// its rectangles (pixels dropped) and the bytes it took.
func (tc *testClient) update(incremental bool, deadline time.Time) ([][4]uint16, int, error) {
	if err := tc.send(UpdateRequest{Incremental: incremental, W: tc.init.Width, H: tc.init.Height}); err != nil {
		return nil, 0, err
	}
	tc.c.SetReadDeadline(deadline)
	defer tc.c.SetReadDeadline(time.Time{})
	for {
		var t [1]byte
		if _, err := io.ReadFull(tc.br, t[:]); err != nil {
			return nil, 0, err
		}
		switch t[0] {
		case 0:
			return tc.readRects()
		case 2: // bell
		case 3: // server cut text: read and ignore
			var h [7]byte
			if _, err := io.ReadFull(tc.br, h[:]); err != nil {
				return nil, 0, err
			}
			io.CopyN(io.Discard, tc.br, int64(binary.BigEndian.Uint32(h[3:])))
		default:
			return nil, 0, fmt.Errorf("server message type %d", t[0])
		}
	}
}

func (tc *testClient) readRects() ([][4]uint16, int, error) {
	var h [3]byte
	if _, err := io.ReadFull(tc.br, h[:]); err != nil {
		return nil, 0, err
	}
	n, total := int(binary.BigEndian.Uint16(h[1:])), 4
	var rects [][4]uint16
	for range n {
		var r [12]byte
		if _, err := io.ReadFull(tc.br, r[:]); err != nil {
			return nil, 0, err
		}
		x, y, w, hh := be16(r[:]), be16(r[2:]), be16(r[4:]), be16(r[6:])
		enc := int32(binary.BigEndian.Uint32(r[8:]))
		total += 12
		switch enc {
		case 0:
			k := int64(w) * int64(hh) * 4
			if _, err := io.CopyN(io.Discard, tc.br, k); err != nil {
				return nil, 0, err
			}
			total += int(k)
		case -223:
			tc.init.Width, tc.init.Height = w, hh
		default:
			return nil, 0, fmt.Errorf("unexpected encoding %d", enc)
		}
		rects = append(rects, [4]uint16{x, y, w, hh})
	}
	return rects, total, nil
}
