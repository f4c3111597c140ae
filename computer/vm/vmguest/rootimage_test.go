package vmguest

import (
	"errors"
	"strings"
	"testing"
)

// TestDecodeRootImage: a root image names two distinct disks and binds
// only absolute clean paths below /.
func TestDecodeRootImage(t *testing.T) {
	withImage := strings.Replace(good, `"drop_caps"`, `"root_image":{"base_serial":"tether-base","upper_serial":"tether-disk",
 "binds":["/etc/tether","/usr/bin/tether-receiver"]},"drop_caps"`, 1)
	c, err := DecodeConfig([]byte(withImage))
	if err != nil || c.RootImage == nil || c.RootImage.UpperSerial != "tether-disk" || len(c.RootImage.Binds) != 2 {
		t.Fatalf("%+v %v", c.RootImage, err)
	}
	for name, edit := range map[string][2]string{
		"same disk":     {`"tether-disk"`, `"tether-base"`},
		"no base":       {`"base_serial":"tether-base"`, `"base_serial":""`},
		"bind relative": {`"/etc/tether"`, `"etc/tether"`},
		"bind root":     {`"/etc/tether"`, `"/"`},
		"bind escape":   {`"/etc/tether"`, `"/etc/../tether"`},
		"unknown field": {`"binds"`, `"lower":"x","binds"`},
	} {
		data := strings.Replace(withImage, edit[0], edit[1], 1)
		if _, err := DecodeConfig([]byte(data)); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}
