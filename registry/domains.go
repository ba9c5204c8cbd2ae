package registry

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"unicode"
)

// WildcardNames returns the certificate names of wildcard domains: *.<domain> each.
func WildcardNames(domains []string) []string {
	out := make([]string, 0, len(domains))
	for _, d := range domains {
		out = append(out, "*."+d)
	}
	return out
}

// ParseWildcardDomains splits each value on commas and white space and returns the
// domains, lowercased, without a trailing dot or a leading "*." (so "example.com" and
// "*.example.com" both mean *.example.com), in order and without duplicates.
func ParseWildcardDomains(vals []string) ([]string, error) {
	var out []string
	for _, v := range vals {
		for _, f := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || unicode.IsSpace(r) }) {
			d := strings.TrimSuffix(strings.ToLower(f), ".")
			d = strings.TrimPrefix(d, "*.")
			if err := validDNSName(d); err != nil {
				return nil, fmt.Errorf("%q is not a domain: %v", f, err)
			}
			if !slices.Contains(out, d) {
				out = append(out, d)
			}
		}
	}
	return out, nil
}

// validDNSName accepts a host name of at least two labels (letters, digits and
// hyphens; internationalized names in their xn-- form), which is what a public CA
// issues a wildcard under.
func validDNSName(d string) error {
	if net.ParseIP(d) != nil {
		return errors.New("an IP address has no wildcard")
	}
	if len(d) > 253 {
		return errors.New("longer than 253 characters")
	}
	labels := strings.Split(d, ".")
	if len(labels) < 2 {
		return errors.New("needs at least two labels, as in example.com")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return errors.New("each label must have 1 to 63 characters")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("label %q starts or ends with a hyphen", l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("label %q may only hold letters, digits and hyphens", l)
			}
		}
	}
	return nil
}
