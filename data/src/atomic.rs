//! Output files written so that a crash or a failed run never destroys the previous file: every
//! writer (`flamia data tokenize`, `make-shard`, `make-synthetic`, `flamia tokenizer
//! convert-tiktoken`) writes `OUT.tmp` beside `OUT`, fsyncs it, renames it over `OUT` and fsyncs
//! the directory. Until the rename, `OUT` is the previous file (or absent); a failure removes
//! `OUT.tmp`, and a `.tmp` left by a killed run is overwritten by the next one. `.tmp` is not a
//! shard extension, so directory and glob inputs never pick the temporary file up.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};

/// The temporary file `path` is written to before it is renamed into place: `path` + `.tmp`.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut s: OsString = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// An output file being written under its temporary name. [`Staged::commit`] puts it in place;
/// dropping it uncommitted (an error, a panic) removes the temporary file.
#[derive(Debug)]
pub struct Staged {
    path: PathBuf,
    tmp: PathBuf,
    committed: bool,
}

impl Staged {
    /// Creates (truncating a leftover) the temporary file of `path` and returns it for writing.
    pub fn create(path: &Path) -> Result<(Staged, File)> {
        let tmp = temp_path(path);
        let file = File::create(&tmp).map_err(|e| DataError::Write {
            path: path.into(),
            problem: format!("cannot create its temporary file {}: {e}", tmp.display()),
        })?;
        Ok((
            Staged {
                path: path.into(),
                tmp,
                committed: false,
            },
            file,
        ))
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the written `file` durable and renames it over the final path (then fsyncs the
    /// directory, so the new name survives a power loss).
    pub fn commit(mut self, file: File) -> Result<()> {
        let werr = |what: &str, e: std::io::Error| DataError::Write {
            path: self.path.clone(),
            problem: format!("{what}: {e}"),
        };
        file.sync_all()
            .map_err(|e| werr(&format!("fsync of {}", self.tmp.display()), e))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|e| werr(&format!("renaming {} into place", self.tmp.display()), e))?;
        self.committed = true;
        let dir = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| werr(&format!("fsync of directory {}", dir.display()), e))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` to `path` through a [`Staged`] temporary file.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let (staged, mut file) = Staged::create(path)?;
    file.write_all(bytes).map_err(|e| DataError::Write {
        path: path.into(),
        problem: e.to_string(),
    })?;
    staged.commit(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_replaces_and_a_dropped_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.bin");
        std::fs::write(&p, b"old").unwrap();
        {
            let (staged, mut f) = Staged::create(&p).unwrap();
            std::io::Write::write_all(&mut f, b"half").unwrap();
            assert!(temp_path(&p).is_file());
            drop(staged); // a failure before commit
        }
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert!(!temp_path(&p).exists(), "the temporary file is removed");
        write(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert!(!temp_path(&p).exists());
        let e = write(&dir.path().join("no/such/dir/x"), b"x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no/such/dir/x") && e.contains("temporary file"), "{e}");
    }
}
