package qmpinput

// AbsMax is INPUT_EVENT_ABS_MAX in QEMU's include/ui/input.h: absolute
// pointer events carry 0..0x7FFF on each axis.
const AbsMax = 0x7FFF

// PixelToAbs maps pixel p of an axis that is size pixels long to QEMU's
// absolute axis with QEMU's own formula, qemu_input_scale_axis(p, 0, size,
// 0, INPUT_EVENT_ABS_MAX) from ui/input.c, the call its display frontends
// (gtk, vnc, sdl) make:
//
//	(value - min_in) * (max_out - min_out) / (max_in - min_in) + min_out
//
// with 64-bit integer arithmetic truncating toward zero. A size below 1
// maps to the middle of the range, as QEMU does.
func PixelToAbs(p, size int) int {
	rangeIn := int64(size)
	rangeOut := int64(AbsMax)
	if rangeIn < 1 {
		return int(rangeOut / 2)
	}
	return int(int64(p) * rangeOut / rangeIn)
}

// AbsToPixel is the inverse a guest applies: the smallest pixel whose
// PixelToAbs is at least abs, which makes PixelToAbs followed by AbsToPixel
// exact for every axis shorter than AbsMax pixels.
func AbsToPixel(abs, size int) int {
	if size < 1 {
		return 0
	}
	// ceil(abs * size / AbsMax)
	return int((int64(abs)*int64(size) + AbsMax - 1) / AbsMax)
}
