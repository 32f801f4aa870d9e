package readme

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// maxCopiedFile leaves out large files (built binaries) when copying the
// repository: no README command needs them.
const maxCopiedFile = 4 << 20

// copyTree copies the repository at src into dst, as a fresh clone would
// have it, for README blocks to run in without writing into the real one:
// everything but .git, bin/ and files over maxCopiedFile. (A tree of
// symbolic links would not do: go:embed refuses them.)
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || rel == "bin") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case !d.Type().IsRegular():
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() > maxCopiedFile {
			return err
		}
		return copyFile(path, target, info.Mode().Perm())
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}
