package buckets

import (
	"testing"

	"github.com/lchat/lchat-caddy/internal/caddyfuzz"
)

func FuzzS3Caddyfile(f *testing.F) {
	for _, s := range append(caddyfuzz.Seeds,
		"s3 my-bucket",
		"s3 {\n\tbucket b\n\tprefix fleet/\n\tregion eu-west-1\n\tendpoint http://127.0.0.1:7070\n\tuse_path_style\n}",
		"s3 {\n\tvirtual_host\n\taccess_key_id AK\n\tsecret_access_key SK\n\tsession_token T\n}",
		"s3 a b", "s3 {\n\tbucket\n}", "s3 {\n\tunknown x\n}",
	) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		caddyfuzz.Unmarshal(t, input, func() *S3 { return new(S3) })
	})
}

func FuzzFileCaddyfile(f *testing.F) {
	for _, s := range append(caddyfuzz.Seeds, "file /var/lib/bucket", "file {\n\troot /x\n}", "file a b") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		caddyfuzz.Unmarshal(t, input, func() *File { return new(File) })
	})
}
