package template

import (
	"strings"
	"testing"

	kvstore "github.com/keysync/confd/store"
)

// TestErrorsNeverCarryValues feeds secret-looking values to every function
// whose error could quote its argument, and asserts the value is absent.
func TestErrorsNeverCarryValues(t *testing.T) {
	secret := "hunter2-Sup3rS3cret"
	pem := "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
	kvs := map[string]string{"/s": secret, "/pem": pem, "/n": "12"}
	for _, src := range []string{
		`{{atoi (getv "/s")}}`,
		`{{parseBool (getv "/s")}}`,
		`{{json (getv "/s")}}`,
		`{{jsonArray (getv "/s")}}`,
		`{{json (getv "/pem")}}`,
		`{{base64Decode (getv "/s")}}`,
		`{{atoi (getv "/pem")}}`,
		`{{index (getv "/s") 99}}`,
		`{{slice (getv "/s") 3 99}}`,
		`{{add (getv "/s") 1}}`,
		`{{(getv "/s").Field}}`,
		`{{template (getv "/s")}}`,
		`{{printf "%s" (getv "/s") | atoi}}`,
		`{{atoi (printf "x%sx" (getv "/s"))}}`,
		`{{map (getv "/s")}}`,
		`{{$x := split (getv "/pem") "\n"}}{{atoi (index $x 1)}}`,
	} {
		_, err := renderWith(t, src, kvs)
		if err == nil {
			t.Errorf("%s rendered without error", src)
			continue
		}
		for _, s := range []string{secret, "MIIEvQIBADAN", "Sup3r"} {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: error carries %q: %v", src, s, err)
			}
		}
	}
}

// TestFunctionErrorsLeaveValuesOut checks the functions themselves, without
// the guard in Render behind them.
func TestFunctionErrorsLeaveValuesOut(t *testing.T) {
	v := "hunter2-Sup3rS3cret"
	_, e1 := atoi(v)
	_, e2 := parseBool(v)
	_, e3 := jsonObject(v)
	_, e4 := jsonArray(v)
	_, e5 := jsonObject(`["` + v + `"]`)
	_, e6 := base64Decode(v)
	for i, err := range []error{e1, e2, e3, e4, e5, e6} {
		if err == nil || strings.Contains(err.Error(), "hunter") || strings.Contains(err.Error(), "'h'") {
			t.Errorf("error %d = %v", i+1, err)
		}
	}
}

// TestWithoutValuesReplacesValuesByKeyName checks the guard on its own: a
// message quoting a value, or one line of it, names the key instead.
func TestWithoutValuesReplacesValuesByKeyName(t *testing.T) {
	kvs := map[string]string{"/a": "line-one-secret\nline-two-secret", "/short": "on"}
	err := withoutValues(errStr(`bad "line-one-secret\nline-two-secret" and "line-two-secret" turned on`), kvstore.New(kvs), []string{"decrypted-thing"})
	if got, want := err.Error(), `bad "[value of /a]\n[value of /a]" and "[value of /a]" turned on`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := withoutValues(errStr("x decrypted-thing"), kvstore.New(nil), []string{"decrypted-thing"}).Error(); got != "x [decrypted value]" {
		t.Errorf("decrypted: %q", got)
	}
}

type errStr string

func (e errStr) Error() string { return string(e) }
