package s3bucket

import (
	"fmt"
	"net/netip"
	"strings"
)

// ValidateBucketName checks name against S3's naming rules for general purpose buckets
// (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html): 3 to 63
// characters of lowercase letters, digits, dots and hyphens, beginning and ending with a
// letter or digit, no two dots in a row, not shaped like an IPv4 address, and none of
// the prefixes and suffixes S3 reserves. Names created before March 2018 in us-east-1
// may break these rules; such a bucket is not accepted here.
func ValidateBucketName(name string) error {
	if len(name) < 3 || len(name) > 63 {
		return fmt.Errorf("bucket name %q: must be 3 to 63 characters long", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '-':
		case c >= 'A' && c <= 'Z':
			return fmt.Errorf("bucket name %q: must be lowercase", name)
		default:
			return fmt.Errorf("bucket name %q: %q is not allowed (lowercase letters, digits, '.' and '-' only)", name, c)
		}
	}
	if !alnum(name[0]) || !alnum(name[len(name)-1]) {
		return fmt.Errorf("bucket name %q: must begin and end with a letter or digit", name)
	}
	if strings.Contains(name, "..") {
		return fmt.Errorf("bucket name %q: must not contain two dots in a row", name)
	}
	if a, err := netip.ParseAddr(name); err == nil && a.Is4() {
		return fmt.Errorf("bucket name %q: must not be an IP address", name)
	}
	for _, p := range []string{"xn--", "sthree-", "amzn-s3-demo-"} {
		if strings.HasPrefix(name, p) {
			return fmt.Errorf("bucket name %q: the prefix %s is reserved", name, p)
		}
	}
	for _, s := range []string{"-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"} {
		if strings.HasSuffix(name, s) {
			return fmt.Errorf("bucket name %q: the suffix %s is reserved", name, s)
		}
	}
	return nil
}

func alnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
