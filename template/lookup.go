package template

import (
	"fmt"
	"net"
	"sort"
	"strings"
)

// DNS answers come back in rotating order; the lookups sort them so a
// rendered file does not change (and trigger a reload) on every poll.

// lookupIP returns nil on any resolver error so a template can range over
// the result without failing the render.
func lookupIP(host string) []string {
	ips, err := net.LookupIP(host)
	if err != nil {
		return nil
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	sort.Strings(out)
	return out
}

// lookupIPV4 and lookupIPV6 tell the families apart by their text form, as
// confd does.
func lookupIPV4(host string) []string { return filterIPs(lookupIP(host), ".") }
func lookupIPV6(host string) []string { return filterIPs(lookupIP(host), ":") }

func filterIPs(ips []string, sep string) []string {
	var out []string
	for _, ip := range ips {
		if strings.Contains(ip, sep) {
			out = append(out, ip)
		}
	}
	return out
}

// lookupSRV returns an empty (non-nil) slice on error, as confd does.
func lookupSRV(service, proto, name string) []*net.SRV {
	_, addrs, err := net.LookupSRV(service, proto, name)
	if err != nil {
		return []*net.SRV{}
	}
	sortSRV(addrs)
	return addrs
}

// sortSRV orders records by the concatenated text of all their fields,
// confd's (odd, but relied upon) order: nothing is compared numerically, so
// port 80 at priority 9 sorts after port 8080 at priority 1.
func sortSRV(addrs []*net.SRV) {
	sort.Slice(addrs, func(i, j int) bool { return srvText(addrs[i]) < srvText(addrs[j]) })
}

func srvText(r *net.SRV) string {
	return fmt.Sprintf("%s%d%d%d", r.Target, r.Port, r.Priority, r.Weight)
}
