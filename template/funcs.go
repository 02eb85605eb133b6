package template

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	texttemplate "text/template"
	tparse "text/template/parse"
	"time"

	"github.com/kelseyhightower/memkv"

	kvstore "github.com/keysync/confd/store"
)

// FuncMap returns confd 0.16's template functions, with the key lookups
// bound to store.
//
// The key functions are store.Index's, which give memkv v0.1.1's results
// (templates depend on its quirks: getvs sorts by value, ls "/" lists only
// top-level keys, lsdir "/" lists nothing) from an index instead of a scan.
//
// The crypt functions (cget, cgets, cgetv, cgetvs) are always defined, so a
// template using them parses; they decrypt only when Render is given a
// keyring (Options.Keyring), and fail naming -secret-keyring otherwise.
func FuncMap(store *kvstore.Index) texttemplate.FuncMap {
	return funcMap(&binding{store: store})
}

// binding is what the key and crypt functions of one parsed template read:
// the store, keyring and decryption hook of the render executing it. A
// parse is kept and executed again by later renders (parses), so its
// functions cannot capture one store; each execution sets the binding.
type binding struct {
	store   *kvstore.Index
	keyring *Keyring
	seen    func(string) // told every decrypted value; may be nil
	warn    func(string) // told what publicKeys leaves out; may be nil
	// readOnlyGets: nothing the template can call writes to a list gets
	// returns, so gets may hand out the store's own pairs (see sharesGets).
	readOnlyGets bool
}

// funcMap is confd's function set with the key and crypt functions
// reading b. The closures have the signatures of store.Index's methods, so
// text/template reports argument errors exactly as for memkv's.
func funcMap(b *binding) texttemplate.FuncMap {
	m := maps.Clone(storelessFuncs)
	// memkv (store.FuncMap in confd).
	m["exists"] = func(key string) bool { return b.store.Exists(key) }
	m["publicKeys"] = func(values ...any) ([]PublicKey, error) { return publicKeys(b.warn, values...) }
	m["ls"] = func(filePath string) []string { return b.store.List(filePath) }
	m["lsdir"] = func(filePath string) []string { return b.store.ListDir(filePath) }
	m["get"] = func(key string) (memkv.KVPair, error) { return b.store.Get(key) }
	m["gets"] = func(pattern string) (memkv.KVPairs, error) {
		if b.readOnlyGets {
			return b.store.GetAllShared(pattern)
		}
		return b.store.GetAll(pattern)
	}
	m["getv"] = func(key string, v ...string) (string, error) { return b.store.GetValue(key, v...) }
	m["getvs"] = func(pattern string) ([]string, error) { return b.store.GetAllValues(pattern) }
	maps.Copy(m, cryptFuncs(b))
	return m
}

// storelessFuncs are the functions that read no store: one map for every
// parse (text/template copies it).
var storelessFuncs = texttemplate.FuncMap{
	// Thin aliases of the standard library.
	"base":       path.Base,
	"dir":        path.Dir,
	"split":      strings.Split,
	"join":       strings.Join,
	"toUpper":    strings.ToUpper,
	"toLower":    strings.ToLower,
	"contains":   strings.Contains,
	"replace":    strings.Replace,
	"trimSuffix": strings.TrimSuffix,
	"datetime":   time.Now,
	"parseBool":  parseBool,
	"atoi":       atoi,

	"json":         jsonObject,
	"jsonArray":    jsonArray,
	"map":          createMap,
	"getenv":       getenv,
	"base64Encode": base64Encode,
	"base64Decode": base64Decode,
	"fileExists":   fileExists,

	"lookupIP":   lookupIP,
	"lookupIPV4": lookupIPV4,
	"lookupIPV6": lookupIPV6,
	"lookupSRV":  lookupSRV,

	// A zero divisor panics; text/template turns the panic into an
	// execution error, which is what confd users get too.
	"add": func(a, b int) int { return a + b },
	"sub": func(a, b int) int { return a - b },
	"mul": func(a, b int) int { return a * b },
	"div": func(a, b int) int { return a / b },
	"mod": func(a, b int) int { return a % b },

	"seq":            seq,
	"reverse":        reverse,
	"sortByLength":   sortByLength,
	"sortKVByLength": sortKVByLength,

	// This implementation's additions; none shadows a confd name.
	"pemBlocks":    pemBlocks,
	"keyID":        keyID,
	"pemNormalize": pemNormalize,
}

func jsonObject(data string) (map[string]interface{}, error) {
	var v map[string]interface{}
	if err := json.Unmarshal([]byte(data), &v); err != nil {
		return nil, jsonError("json", len(data), err)
	}
	return v, nil
}

func jsonArray(data string) ([]interface{}, error) {
	var v []interface{}
	if err := json.Unmarshal([]byte(data), &v); err != nil {
		return nil, jsonError("jsonArray", len(data), err)
	}
	return v, nil
}

// createMap builds a map from alternating keys and values, mainly so a
// template can hand several values to a sub-template.
func createMap(pairs ...interface{}) (map[string]interface{}, error) {
	if len(pairs)%2 != 0 {
		return nil, errors.New("invalid map call")
	}
	m := make(map[string]interface{}, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		k, ok := pairs[i].(string)
		if !ok {
			return nil, errors.New("map keys must be strings")
		}
		m[k] = pairs[i+1]
	}
	return m, nil
}

// getenv treats an empty variable like an unset one: confd templates rely
// on `getenv "X" "fallback"` covering both.
func getenv(key string, def ...string) string {
	if v := os.Getenv(key); v != "" || len(def) == 0 {
		return v
	}
	return def[0]
}

func base64Encode(s string) string {
	return base64.StdEncoding.EncodeToString([]byte(s))
}

func base64Decode(s string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		// The error names a byte offset, never the input.
		return "", fmt.Errorf("base64Decode: value (%d bytes, not shown): %w", len(s), err)
	}
	return string(b), nil
}

// fileExists answers false only for "does not exist"; any other stat
// failure (permission denied, a file used as a directory) counts as
// existing, as in confd.
func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !os.IsNotExist(err)
}

// seq is GNU seq: first..last inclusive, nothing when first > last.
func seq(first, last int) []int {
	var out []int
	for i := first; i <= last; i++ {
		out = append(out, i)
	}
	return out
}

// reverse reverses in place, so the caller's variable changes too. Only the
// exact types []string and []memkv.KVPair are reversed: memkv.KVPairs, which
// gets returns, is a distinct type and comes back untouched, as in confd.
func reverse(values interface{}) interface{} {
	switch v := values.(type) {
	case []string:
		slices.Reverse(v)
	case []memkv.KVPair:
		slices.Reverse(v)
	}
	return values
}

// writesPairs are the functions of the set that write to a list of pairs
// they are given: sortKVByLength sorts it in place, as confd's does.
// reverse reverses only []memkv.KVPair, which gets's memkv.KVPairs is not,
// and cgets decrypts into a copy of its own. A function added to the set
// that writes to its argument must be named here.
var writesPairs = map[string]bool{"sortKVByLength": true}

// sharesGets reports whether gets may hand tmpl the index's own pairs:
// none of its templates (defines included) calls a function of writesPairs.
// A template can call one only by naming it, so the parse trees say it;
// where one is called, every gets copies, as memkv's does.
func sharesGets(tmpl *texttemplate.Template) bool {
	for _, t := range tmpl.Templates() {
		if t.Tree != nil && callsAny(t.Tree.Root, writesPairs) {
			return false
		}
	}
	return true
}

// callsAny reports whether n names a function of names anywhere below it.
func callsAny(n tparse.Node, names map[string]bool) bool {
	switch n := n.(type) {
	case *tparse.IdentifierNode:
		return names[n.Ident]
	case *tparse.ListNode:
		return n != nil && slices.ContainsFunc(n.Nodes, func(c tparse.Node) bool { return callsAny(c, names) })
	case *tparse.ActionNode:
		return callsAny(n.Pipe, names)
	case *tparse.PipeNode:
		return n != nil && slices.ContainsFunc(n.Cmds, func(c *tparse.CommandNode) bool { return callsAny(c, names) })
	case *tparse.CommandNode:
		return slices.ContainsFunc(n.Args, func(c tparse.Node) bool { return callsAny(c, names) })
	case *tparse.ChainNode:
		return callsAny(n.Node, names)
	case *tparse.IfNode:
		return callsAny(&n.BranchNode, names)
	case *tparse.RangeNode:
		return callsAny(&n.BranchNode, names)
	case *tparse.WithNode:
		return callsAny(&n.BranchNode, names)
	case *tparse.BranchNode:
		return callsAny(n.Pipe, names) || callsAny(n.List, names) || callsAny(n.ElseList, names)
	case *tparse.TemplateNode:
		return callsAny(n.Pipe, names)
	}
	return false
}

// sortByLength and sortKVByLength sort in place with sort.Sort's algorithm
// (sort.Slice runs the same pdqsort), as confd does, rather than a stable
// sort: for up to 6 items both Go 1.10's and
// today's sort.Sort keep equal lengths in input order, so such lists render
// as confd 0.16 rendered them (longer lists with ties may differ).
func sortByLength(values []string) []string {
	sort.Slice(values, func(i, j int) bool { return len(values[i]) < len(values[j]) })
	return values
}

func sortKVByLength(values []memkv.KVPair) []memkv.KVPair {
	sort.Slice(values, func(i, j int) bool { return len(values[i].Key) < len(values[j].Key) })
	return values
}
