package lchat

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestScalarArg: each kind of destination reads its one argument the way the
// subdirectives that use it always have, with the same messages.
func TestScalarArg(t *testing.T) {
	var (
		s     string
		b     bool
		n     int
		n64   int64
		dur   caddy.Duration
		opt   *caddy.Duration
		count int
	)
	for _, tc := range []struct {
		line string
		dst  any
		// got reads the destination after a successful parse.
		got     func() any
		want    any
		wantErr string
	}{
		{"f /srv/state", &s, func() any { return s }, "/srv/state", ""},
		{"f", &s, nil, nil, "wrong argument count"},
		{"f a b", &s, nil, nil, "wrong argument count"},
		{"f on", &b, func() any { return b }, true, ""},
		{"f off", &b, func() any { return b }, false, ""},
		{"f yes", &b, nil, nil, `f: "yes" is not on or off`},
		{"f -3", &n, func() any { return n }, -3, ""},
		{"f many", &n, nil, nil, `f: strconv.Atoi: parsing "many": invalid syntax`},
		{"f 16", positiveInt(&n), func() any { return n }, 16, ""},
		{"f 0", positiveInt(&n), nil, nil, `f: want a positive number, got "0"`},
		{"f 64", positiveInt64(&n64), func() any { return n64 }, int64(64), ""},
		{"f -1", positiveInt64(&n64), nil, nil, `f: want a positive number, got "-1"`},
		{"f 1h30m", &dur, func() any { return dur }, caddy.Duration(90 * time.Minute), ""},
		{"f 1d", &dur, func() any { return dur }, caddy.Duration(24 * time.Hour), ""},
		{"f -1", &dur, func() any { return dur }, caddy.Duration(-1), ""},
		{"f soon", &dur, nil, nil, `f: time: invalid duration "soon"`},
		{"f 0s", &opt, func() any { return *opt }, caddy.Duration(0), ""},
		{"f 3s", positiveDuration(&dur), func() any { return dur }, caddy.Duration(3 * time.Second), ""},
		{"f -1", positiveDuration(&dur), nil, nil, `f: want a positive duration, got "-1"`},
		{"f 64MiB", &n64, func() any { return n64 }, int64(64 << 20), ""},
		{"f 0", &n64, nil, nil, `f: want a size such as 64MiB, got "0"`},
		{"f 4GiB", intSize(&n), func() any { return n }, 1<<31 - 1, ""},
		{"f 1048577", mebibytes(&count), func() any { return count }, 2, ""},
		{"f lots", mebibytes(&count), nil, nil, `f: want a size such as 64MiB, got "lots"`},
	} {
		d := caddyfile.NewTestDispenser(tc.line)
		d.Next()
		ok, err := scalarArg(d, map[string]any{"f": tc.dst})
		switch {
		case !ok:
			t.Errorf("%q into %T: not read", tc.line, tc.dst)
		case tc.wantErr != "":
			if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
				t.Errorf("%q into %T: err %v, want %q", tc.line, tc.dst, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%q into %T: %v", tc.line, tc.dst, err)
		case tc.got() != tc.want:
			t.Errorf("%q into %T: got %v, want %v", tc.line, tc.dst, tc.got(), tc.want)
		}
	}

	d := caddyfile.NewTestDispenser("other 1")
	d.Next()
	if ok, err := scalarArg(d, map[string]any{"f": &s}); ok || err != nil || !d.NextArg() {
		t.Errorf("a name not in the table: ok %v, err %v, and its argument should be left unread", ok, err)
	}
}
