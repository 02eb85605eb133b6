package packaging

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
)

// pkgFile is one path a package installs.
type pkgFile struct {
	mode fs.FileMode // permission bits, with fs.ModeDir for a directory
	size int64
}

// pkgInfo is what the tests check of a .deb or an .rpm, read with Go alone
// so that the checks run where dpkg-deb or rpm is missing.
type pkgInfo struct {
	version string
	arch    string
	files   map[string]pkgFile // absolute path -> file
	scripts map[string]string  // postinstall, preremove, postremove -> text
	changes string             // the changelog's text
	fields  map[string]string  // deb control fields; rpm: Conflicts
}

// readDeb reads a .deb: an ar archive of debian-binary, control.tar.gz and
// data.tar.gz (nfpm's default compression).
func readDeb(file string) (*pkgInfo, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(data, []byte("!<arch>\n")) {
		return nil, fmt.Errorf("%s: not an ar archive", file)
	}
	members := map[string][]byte{}
	for rest := data[8:]; len(rest) >= 60; {
		name := strings.TrimSuffix(strings.TrimSpace(string(rest[:16])), "/")
		size, err := strconv.ParseInt(strings.TrimSpace(string(rest[48:58])), 10, 64)
		if err != nil || int64(len(rest)-60) < size {
			return nil, fmt.Errorf("%s: bad ar member header %q", file, rest[:60])
		}
		members[name] = rest[60 : 60+size]
		rest = rest[60+size+size%2:]
	}
	p := &pkgInfo{files: map[string]pkgFile{}, scripts: map[string]string{}, fields: map[string]string{}}
	debScripts := map[string]string{"postinst": "postinstall", "prerm": "preremove", "postrm": "postremove"}
	err = readTarGz(members["control.tar.gz"], func(h *tar.Header, body []byte) {
		name := path.Base(h.Name)
		if s, ok := debScripts[name]; ok {
			p.scripts[s] = string(body)
		}
		if name == "control" {
			for _, line := range strings.Split(string(body), "\n") {
				if k, v, ok := strings.Cut(line, ": "); ok && !strings.HasPrefix(line, " ") {
					p.fields[k] = v
				}
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("%s: control.tar.gz: %w", file, err)
	}
	p.version, p.arch = p.fields["Version"], p.fields["Architecture"]
	err = readTarGz(members["data.tar.gz"], func(h *tar.Header, body []byte) {
		name := strings.TrimSuffix(strings.TrimPrefix(h.Name, "."), "/")
		mode := fs.FileMode(h.Mode).Perm()
		if h.Typeflag == tar.TypeDir {
			mode |= fs.ModeDir
		}
		p.files[name] = pkgFile{mode: mode, size: h.Size}
		if name == "/usr/share/doc/keysync/changelog.Debian.gz" {
			if zr, err := gzip.NewReader(bytes.NewReader(body)); err == nil {
				text, _ := io.ReadAll(zr)
				p.changes = string(text)
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("%s: data.tar.gz: %w", file, err)
	}
	return p, nil
}

func readTarGz(data []byte, each func(*tar.Header, []byte)) error {
	if data == nil {
		return fmt.Errorf("missing")
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		each(h, body)
	}
}

// The rpm header tags the tests read (rpm's lib/rpmtag.h).
const (
	rpmTagVersion       = 1001
	rpmTagArch          = 1022
	rpmTagPostin        = 1024
	rpmTagPreun         = 1025
	rpmTagPostun        = 1026
	rpmTagFileSizes     = 1028
	rpmTagFileModes     = 1030
	rpmTagConflictName  = 1054
	rpmTagChangelogText = 1082
	rpmTagDirIndexes    = 1116
	rpmTagBaseNames     = 1117
	rpmTagDirNames      = 1118
)

// readRPM reads an .rpm's main header: a 96-byte lead, the signature
// header (padded to 8 bytes), then the header with the package's tags.
func readRPM(file string) (*pkgInfo, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if len(data) < 96 || !bytes.HasPrefix(data, []byte{0xed, 0xab, 0xee, 0xdb}) {
		return nil, fmt.Errorf("%s: no rpm lead", file)
	}
	_, n, err := rpmHeader(data[96:])
	if err != nil {
		return nil, fmt.Errorf("%s: signature header: %w", file, err)
	}
	off := 96 + (n+7)/8*8
	tags, _, err := rpmHeader(data[off:])
	if err != nil {
		return nil, fmt.Errorf("%s: header: %w", file, err)
	}
	str := func(tag int) string {
		if v := tags[tag]; len(v) > 0 {
			return v[0].(string)
		}
		return ""
	}
	p := &pkgInfo{version: str(rpmTagVersion), arch: str(rpmTagArch), files: map[string]pkgFile{},
		scripts: map[string]string{}, fields: map[string]string{}}
	for tag, s := range map[int]string{rpmTagPostin: "postinstall", rpmTagPreun: "preremove", rpmTagPostun: "postremove"} {
		if v := str(tag); v != "" {
			p.scripts[s] = v
		}
	}
	var conflicts []string
	for _, v := range tags[rpmTagConflictName] {
		conflicts = append(conflicts, v.(string))
	}
	p.fields["Conflicts"] = strings.Join(conflicts, ", ")
	for _, v := range tags[rpmTagChangelogText] {
		p.changes += v.(string) + "\n"
	}
	base, dirs, idx := tags[rpmTagBaseNames], tags[rpmTagDirNames], tags[rpmTagDirIndexes]
	modes, sizes := tags[rpmTagFileModes], tags[rpmTagFileSizes]
	if len(idx) != len(base) || len(modes) != len(base) || len(sizes) != len(base) {
		return nil, fmt.Errorf("%s: %d base names, %d dir indexes, %d modes, %d sizes", file, len(base), len(idx), len(modes), len(sizes))
	}
	for i := range base {
		d := int(idx[i].(uint32))
		if d >= len(dirs) {
			return nil, fmt.Errorf("%s: dir index %d of %d", file, d, len(dirs))
		}
		m := uint32(modes[i].(uint16))
		mode := fs.FileMode(m & 0o777)
		if m&0o170000 == 0o040000 {
			mode |= fs.ModeDir
		}
		p.files[path.Clean(dirs[d].(string)+base[i].(string))] = pkgFile{mode: mode, size: int64(sizes[i].(uint32))}
	}
	return p, nil
}

// rpmHeader decodes one header structure: its tags' values (string,
// uint16 or uint32 each) and its length in bytes.
func rpmHeader(b []byte) (map[int][]any, int, error) {
	if len(b) < 16 || !bytes.HasPrefix(b, []byte{0x8e, 0xad, 0xe8, 0x01}) {
		return nil, 0, fmt.Errorf("no header magic")
	}
	nindex, hsize := int(binary.BigEndian.Uint32(b[8:])), int(binary.BigEndian.Uint32(b[12:]))
	size := 16 + 16*nindex + hsize
	if len(b) < size {
		return nil, 0, fmt.Errorf("header of %d bytes in %d", size, len(b))
	}
	store := b[16+16*nindex : size]
	tags := map[int][]any{}
	for i := range nindex {
		e := b[16+16*i:]
		tag, typ := int(binary.BigEndian.Uint32(e)), binary.BigEndian.Uint32(e[4:])
		off, count := int(binary.BigEndian.Uint32(e[8:])), int(binary.BigEndian.Uint32(e[12:]))
		if off > len(store) {
			return nil, 0, fmt.Errorf("tag %d at %d past the store", tag, off)
		}
		var vals []any
		switch typ {
		case 3: // int16
			for j := range count {
				vals = append(vals, binary.BigEndian.Uint16(store[off+2*j:]))
			}
		case 4: // int32
			for j := range count {
				vals = append(vals, binary.BigEndian.Uint32(store[off+4*j:]))
			}
		case 6, 8, 9: // string, string array, i18n string
			s := store[off:]
			for range count {
				end := bytes.IndexByte(s, 0)
				if end < 0 {
					return nil, 0, fmt.Errorf("tag %d: unterminated string", tag)
				}
				vals = append(vals, string(s[:end]))
				s = s[end+1:]
			}
		default:
			continue
		}
		tags[tag] = vals
	}
	return tags, size, nil
}
