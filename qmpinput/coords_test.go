package qmpinput

import (
	"math/rand/v2"
	"testing"
)

// scaleAxisQEMU is qemu_input_scale_axis from ui/input.c, transcribed
// with its general min/max arguments, as the reference PixelToAbs must
// equal for min_in = 0, max_in = size, min_out = 0, max_out = 0x7FFF.
func scaleAxisQEMU(value, minIn, maxIn, minOut, maxOut int) int {
	rangeIn := int64(maxIn) - int64(minIn)
	rangeOut := int64(maxOut) - int64(minOut)
	if rangeIn < 1 {
		return minOut + int(rangeOut/2)
	}
	return int((int64(value)-int64(minIn))*rangeOut/rangeIn + int64(minOut))
}

// TestCoordinateRoundTripEveryResolution is the property the coordinate
// contract promises: for every width 640..3840 and every height 480..2160,
// the four corners and the centre map to QEMU's abs value and back within
// one pixel (in fact exactly).
func TestCoordinateRoundTripEveryResolution(t *testing.T) {
	check := func(axis string, size int) {
		for _, p := range []int{0, size - 1, size / 2} {
			abs := PixelToAbs(p, size)
			if want := scaleAxisQEMU(p, 0, size, 0, AbsMax); abs != want {
				t.Fatalf("%s size %d pixel %d: abs %d, QEMU formula %d", axis, size, p, abs, want)
			}
			if abs < 0 || abs > AbsMax {
				t.Fatalf("%s size %d pixel %d: abs %d outside 0..%d", axis, size, p, abs, AbsMax)
			}
			back := AbsToPixel(abs, size)
			if d := back - p; d < -1 || d > 1 {
				t.Fatalf("%s size %d pixel %d: round trip gives %d", axis, size, p, back)
			}
			if back != p {
				t.Fatalf("%s size %d pixel %d: round trip gives %d (want exact)", axis, size, p, back)
			}
		}
	}
	for w := 640; w <= 3840; w++ {
		check("x", w)
	}
	for h := 480; h <= 2160; h++ {
		check("y", h)
	}
}

// TestCoordinateRoundTripRandomPoints extends the property to random
// interior pixels.
func TestCoordinateRoundTripRandomPoints(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		size := 640 + r.IntN(3840-640+1)
		p := r.IntN(size)
		if back := AbsToPixel(PixelToAbs(p, size), size); back != p {
			t.Fatalf("size %d pixel %d: round trip gives %d", size, p, back)
		}
	}
}

// TestCoordinateMonotonic: distinct pixels never collapse onto one abs
// value at these sizes, so a click lands on the pixel asked for.
func TestCoordinateMonotonic(t *testing.T) {
	for _, size := range []int{640, 1024, 1920, 3840} {
		prev := -1
		for p := range size {
			a := PixelToAbs(p, size)
			if a <= prev {
				t.Fatalf("size %d: pixel %d abs %d not above %d", size, p, a, prev)
			}
			prev = a
		}
	}
}
