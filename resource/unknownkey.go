package resource

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/suggest"
)

// resourceKeys are the keys of [template]; the TOML tags of tomlTemplate.
var resourceKeys = []string{"src", "dest", "keys", "prefix", "owner", "group", "uid", "gid", "mode",
	"check_cmd", "reload_cmd", "check_cmd_timeout", "reload_cmd_timeout", "wait"}

// unknownKeyError names the file, the line and the key, and what was
// probably meant.
func unknownKeyError(file string, k toml.Key) error {
	where := file
	// The line that defines k: a "name =" line inside k's table, or the
	// header of a table k names.
	data, _ := os.ReadFile(file)
	if line := config.KeyLines(data)[strings.Join(k, ".")]; line > 0 {
		where = fmt.Sprintf("%s:%d", file, line)
	}
	name := k[len(k)-1]
	hint := ""
	switch {
	case len(k) == 1 && slices.Contains(resourceKeys, name):
		hint = "; it belongs in the [template] table: move it below the [template] line"
	case len(k) == 2 && k[0] == "template":
		// "checkcmd", "check-cmd", "CheckCmd", "chek_cmd" → "check_cmd".
		if m := suggest.Closest(name, resourceKeys); m != "" {
			hint = fmt.Sprintf("; did you mean %q?", m)
		}
	}
	return fmt.Errorf("%s: unknown key %q%s (the resource is skipped)", where, k.String(), hint)
}
