package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	"github.com/docsgate/gateway/limits"
)

// By says what a limit counts: each request's tenant id for it is a project, a key, an org or
// a client address.
type By uint8

// What limits count by.
const (
	ByProject By = iota + 1
	ByKey
	ByOrg
	ByIP
)

// byNames are the config's names of what limits count by, indexed by By.
var byNames = [...]string{ByProject: "project", ByKey: "key", ByOrg: "org", ByIP: "ip"}

// String is the config's name: "project", "key", "org" or "ip".
func (b By) String() string {
	if int(b) < len(byNames) {
		return byNames[b]
	}
	return ""
}

// ParseBy reads the config's name of what a limit counts by.
func ParseBy(s string) (By, bool) {
	for b, name := range byNames {
		if name != "" && name == s {
			return By(b), true
		}
	}
	return 0, false
}

// Bys is a set of what limits count by.
type Bys uint8

// AllBys has every By.
const AllBys = Bys(1<<ByProject | 1<<ByKey | 1<<ByOrg | 1<<ByIP)

// With is s and b.
func (s Bys) With(b By) Bys { return s | 1<<b }

// Has says whether s holds b.
func (s Bys) Has(b By) bool { return s&(1<<b) != 0 }

// pathParam is the path parameter a limit counting by b reads its id from ("" for none).
func pathParam(b By) string {
	switch b {
	case ByProject:
		return "projectId"
	case ByOrg:
		return "domain"
	}
	return ""
}

// SafeID is a client-chosen value (a path's project id or domain) as a limit counts it: the
// value itself when it is short and plain, else a digest, since ids become part of store key
// names.
func SafeID(v string) string {
	if len(v) > 0 && len(v) <= 128 {
		ok := true
		for i := 0; i < len(v); i++ {
			c := v[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' || c == '@') {
				ok = false
				break
			}
		}
		if ok {
			return v
		}
	}
	sum := sha256.Sum256([]byte(v))
	return "sha256-" + hex.EncodeToString(sum[:16])
}

// AddrID is the per-IP limits' id of a client address: an IPv4 address itself, an IPv6 one
// grouped by its client_ip.ipv6_prefix (one host usually holds a whole /64).
func (p *Policy) AddrID(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return "unknown"
	case a.Is4():
		return a.String()
	}
	pre, err := a.WithZone("").Prefix(p.ipv6Bits)
	if err != nil {
		return a.String()
	}
	return pre.String()
}

// IPv6Prefix is client_ip.ipv6_prefix: how many bits of an IPv6 address name one client.
func (p *Policy) IPv6Prefix() int { return p.ipv6Bits }

// QuotaIDMax bounds an id of a quota action: the longest id the limits count by (a project id
// or an org, 128 characters; a digest is 64, an IPv6 prefix shorter).
const QuotaIDMax = 128

// QuotaID checks that id is one a limit counting by b could count (what /usage/top shows), so
// nothing else ever becomes part of a key name, and returns it as the limit counts it: project
// ids and orgs as the limiter keeps them (characters [A-Za-z0-9._~@-], at most 128, or a
// configured org's name), an IP address (an IPv6 address or prefix becomes the prefix the limit
// counts), a key's SHA-256 digest (lower case). A bad id is a *limits.InvalidError of field "id".
func (p *Policy) QuotaID(b By, id string) (string, error) {
	bad := func(want string) error {
		return &limits.InvalidError{Field: "id", Reason: "not " + want}
	}
	if id == "" || len(id) > QuotaIDMax {
		return "", &limits.InvalidError{Field: "id", Reason: fmt.Sprintf("must be 1 to %d characters", QuotaIDMax)}
	}
	switch b {
	case ByProject:
		if SafeID(id) != id {
			return "", bad("a project id as the limit counts it (characters A-Z a-z 0-9 . _ ~ @ -)")
		}
	case ByOrg:
		if !p.Configured(id) && SafeID(id) != id {
			return "", bad("an org: a configured one, or characters A-Z a-z 0-9 . _ ~ @ -")
		}
	case ByIP:
		return p.quotaIP(id)
	case ByKey:
		if len(id) != 64 {
			return "", bad("a key's digest (64 hexadecimal characters, as /usage/top shows it)")
		}
		if _, err := hex.DecodeString(id); err != nil {
			return "", bad("a key's digest (64 hexadecimal characters, as /usage/top shows it)")
		}
		return strings.ToLower(id), nil
	default:
		return "", bad("an id of this limit")
	}
	return id, nil
}

// quotaIP is the per-IP limits' id of an IP address, or of an IPv6 prefix of the length the
// limits count (client_ip.ipv6_prefix).
func (p *Policy) quotaIP(id string) (string, error) {
	if a, err := netip.ParseAddr(id); err == nil && a.Zone() == "" {
		return p.AddrID(a.Unmap()), nil
	}
	pre, err := netip.ParsePrefix(id)
	if err != nil || !pre.Addr().Is6() || pre.Addr().Is4In6() {
		return "", &limits.InvalidError{Field: "id", Reason: "not an IP address, or an IPv6 prefix as /usage/top shows it"}
	}
	if pre.Bits() != p.ipv6Bits || pre.Masked() != pre {
		return "", &limits.InvalidError{Field: "id", Reason: fmt.Sprintf("an IPv6 prefix must be the /%d the limits count (client_ip.ipv6_prefix), without host bits", p.ipv6Bits)}
	}
	return pre.String(), nil
}
