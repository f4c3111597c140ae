package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// hdr is a frame header declaring n payload bytes.
func hdr(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

func TestReadFrameBoundaries(t *testing.T) {
	full := append(hdr(2), "{}"...)
	cases := []struct {
		name  string
		in    []byte
		limit int
		want  error
	}{
		{"clean EOF", nil, 0, io.EOF},
		{"half header", []byte{0, 0}, 0, ErrFrameTruncated},
		{"zero length", hdr(0), 0, ErrFrameEmpty},
		{"short payload", append(hdr(10), "{}"...), 0, ErrFrameTruncated},
		{"header only", hdr(10), 0, ErrFrameTruncated},
		{"over protocol max", hdr(MaxFrameSize + 1), 0, ErrFrameTooLarge},
		{"over configured limit", append(hdr(5), "12345"...), 4, ErrFrameTooLarge},
		{"max uint32", hdr(^uint32(0)), 0, ErrFrameTooLarge},
		{"complete", full, 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fr, err := NewFrameReader(bytes.NewReader(c.in), c.limit)
			if err != nil {
				t.Fatal(err)
			}
			got, err := fr.ReadFrame()
			if c.want != io.EOF && errors.Is(err, io.EOF) {
				t.Fatalf("ReadFrame() err = %v also matches io.EOF: a truncation would pass for a clean end", err)
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("ReadFrame() err = %v, want %v", err, c.want)
			}
			if c.want == nil && string(got) != "{}" {
				t.Fatalf("payload %q", got)
			}
		})
	}
}

// A frame declaring a huge length is refused before any payload is read,
// so a peer cannot make the reader wait for (or allocate) a gigabyte.
func TestReadFrameTooLargeReadsNoPayload(t *testing.T) {
	in := io.MultiReader(bytes.NewReader(hdr(MaxFrameSize+1)), failReader{t})
	fr, _ := NewFrameReader(in, 0)
	_, err := fr.ReadFrame()
	var fse *FrameSizeError
	if !errors.As(err, &fse) || fse.Size != MaxFrameSize+1 || fse.Limit != MaxFrameSize {
		t.Fatalf("err = %#v, want FrameSizeError{%d, %d}", err, MaxFrameSize+1, MaxFrameSize)
	}
}

type failReader struct{ t *testing.T }

func (f failReader) Read([]byte) (int, error) {
	f.t.Error("payload read after an oversize header")
	return 0, io.EOF
}

func TestWriteFrameRefusesOversizeAndEmpty(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteFrame(&buf, make([]byte, 11), 10); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("oversize: %v", err)
	}
	if err := WriteFrame(&buf, nil, 0); !errors.Is(err, ErrFrameEmpty) {
		t.Errorf("empty: %v", err)
	}
	if buf.Len() != 0 {
		t.Errorf("refused frames wrote %d bytes", buf.Len())
	}
	if err := WriteFrame(&buf, []byte(`{"a":1}`), 0); err != nil {
		t.Fatal(err)
	}
	fr, _ := NewFrameReader(&buf, 0)
	if got, err := fr.ReadFrame(); err != nil || string(got) != `{"a":1}` {
		t.Fatalf("round trip: %q %v", got, err)
	}
}
