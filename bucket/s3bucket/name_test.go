package s3bucket

import "testing"

func TestValidateBucketName(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"lchat-spaces", true},
		{"a.b-c1", true},
		{"abc", true},
		{"lchat-test-1-0a1b2c3d", true},
		{"ab", false},
		{"a23456789012345678901234567890123456789012345678901234567890123", true},
		{"a234567890123456789012345678901234567890123456789012345678901234", false},
		{"nope://x", false},
		{"Lchat", false},
		{"my_bucket", false},
		{"-lchat", false},
		{"lchat-", false},
		{"lchat..spaces", false},
		{"192.168.5.4", false},
		{"xn--lchat", false},
		{"sthree-lchat", false},
		{"amzn-s3-demo-lchat", false},
		{"lchat-s3alias", false},
		{"lchat--ol-s3", false},
		{"lchat.mrap", false},
		{"lchat--x-s3", false},
		{"lchat--table-s3", false},
		{"s3://lchat", false},
		{"lchat/prefix", false},
	} {
		if err := ValidateBucketName(c.name); (err == nil) != c.ok {
			t.Errorf("ValidateBucketName(%q) = %v, want ok %v", c.name, err, c.ok)
		}
	}
}
