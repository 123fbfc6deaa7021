//! The kernels' PTX on disk, so a process does not spend NVRTC's seconds on a module another
//! process (an earlier run, another rank on the node, the next benchmark) already compiled.
//!
//! An entry is one file `<source>-<hash>.ptx`: a header line that names everything the PTX depends
//! on (source, architecture, NVRTC version, options, a hash of the source text with its includes
//! resolved), then the PTX. The file name hashes the header, and a lookup returns the PTX only when
//! the file's header is the expected one, so a changed kernel, variant, NVRTC or a hash collision
//! is a miss, never a wrong module. Entries are written to a temporary file and renamed into
//! place (readers see a whole entry or none; concurrent writers of one entry write the same
//! bytes). The cache is an optimisation: any I/O error is a miss or a skipped store.
//!
//! Where: `FLAMIA_KERNEL_CACHE` (a directory; `off` or `0` turns the cache off), else
//! `$XDG_CACHE_HOME/flamia/kernels`, else `$HOME/.cache/flamia/kernels`.

use std::path::{Path, PathBuf};

/// Environment variable naming the cache directory (`off` or `0`: no cache).
pub const CACHE_ENV: &str = "FLAMIA_KERNEL_CACHE";

/// The cache directory for these environment values (`FLAMIA_KERNEL_CACHE`, `XDG_CACHE_HOME`,
/// `HOME`); `None` when the cache is off or there is no place for it.
pub fn cache_dir_from(var: Option<&str>, xdg: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    fn set(v: Option<&str>) -> Option<&str> {
        v.map(str::trim).filter(|v| !v.is_empty())
    }
    match set(var) {
        Some("off" | "0") => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => set(xdg)
            .map(PathBuf::from)
            .or_else(|| set(home).map(|h| Path::new(h).join(".cache")))
            .map(|base| base.join("flamia").join("kernels")),
    }
}

/// The cache directory of this process's environment ([`cache_dir_from`]).
pub fn cache_dir() -> Option<PathBuf> {
    let var = |name| std::env::var(name).ok();
    cache_dir_from(
        var(CACHE_ENV).as_deref(),
        var("XDG_CACHE_HOME").as_deref(),
        var("HOME").as_deref(),
    )
}

/// 64-bit FNV-1a: stable across builds and Rust versions (the file names must be).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// An entry's file name and header line for `source` compiled from `text` (includes resolved)
/// for `arch` by NVRTC `nvrtc` (major, minor) with `options`.
pub fn entry(
    source: &str,
    arch: &str,
    nvrtc: (i32, i32),
    options: &[String],
    text: &str,
) -> (String, String) {
    let header = format!(
        "// flamia kernel cache: {source} {arch} nvrtc {}.{} text {:016x} options {}\n",
        nvrtc.0,
        nvrtc.1,
        fnv1a64(text.as_bytes()),
        options.join(" ")
    );
    let file = format!("{source}-{:016x}.ptx", fnv1a64(header.as_bytes()));
    (file, header)
}

/// The PTX of entry `file` in `dir` when the file is there, starts with `header` and holds no NUL
/// (the driver takes PTX as a C string).
pub fn lookup(dir: &Path, file: &str, header: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(file)).ok()?;
    text.strip_prefix(header)
        .filter(|ptx| !ptx.is_empty() && !ptx.contains('\0'))
        .map(str::to_string)
}

/// Entries a store leaves in the directory at most ([`prune`]): room for every variant the
/// runtime builds (about 90, the compile test's count) and a few kernel revisions.
pub const MAX_ENTRIES: usize = 256;

/// Age past which a temporary file of [`store`] is a crashed writer's and [`prune`] removes it.
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes the oldest `.ptx` entries of `dir` (by modification time) beyond the newest `keep`,
/// and temporary files of [`store`] older than an hour (a writer killed before its rename).
pub fn prune(dir: &Path, keep: usize) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut entries = Vec::new();
    for e in read.filter_map(Result::ok) {
        let Some(modified) = e.metadata().ok().and_then(|m| m.modified().ok()) else {
            continue;
        };
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".ptx") {
            entries.push((modified, e.path()));
        } else if name.starts_with('.')
            && name.ends_with(".tmp")
            && now.duration_since(modified).is_ok_and(|age| age > STALE_TMP)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
    if entries.len() <= keep {
        return;
    }
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, path) in &entries[keep..] {
        let _ = std::fs::remove_file(path);
    }
}

/// This machine's name as a file-name piece (letters, digits, `-`, `_`; at most 32), "" when
/// unknown: with the process id it keeps the temporary files of writers on different machines
/// apart when the cache directory is shared (`FLAMIA_KERNEL_CACHE` on a network filesystem, so
/// that one node's compile serves every node).
fn host_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_default();
        sanitize_tag(&name)
    })
}

/// `name` with every character but ASCII letters, digits, `-` and `_` dropped, at most 32 kept.
fn sanitize_tag(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(32)
        .collect()
}

/// The temporary file of entry `file` for writer (`host`, `pid`) and its `seq`-th store: a dot
/// file ending in `.tmp` ([`prune`] removes stale ones), distinct per machine, process and store.
fn tmp_name(file: &str, host: &str, pid: u32, seq: u64) -> String {
    format!(".{file}.{host}.{pid}.{seq}.tmp")
}

/// Writes entry `file` (`header`, then `ptx`) into `dir`, creating it, through a temporary file
/// renamed into place, then [`prune`]s the directory to [`MAX_ENTRIES`]; false (and nothing left
/// behind) when any step of the write fails.
pub fn store(dir: &Path, file: &str, header: &str, ptx: &str) -> bool {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(tmp_name(file, host_tag(), std::process::id(), seq));
    let written = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&tmp, format!("{header}{ptx}")))
        .and_then(|_| std::fs::rename(&tmp, dir.join(file)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return false;
    }
    prune(dir, MAX_ENTRIES);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_files_differ_per_machine_process_and_store_and_are_pruned_as_such() {
        let a = tmp_name("k1.ptx", "node-a", 42, 0);
        assert_eq!(a, ".k1.ptx.node-a.42.0.tmp");
        // the same process id on another machine (a shared cache directory), another process,
        // another store of the same process: all distinct
        assert_ne!(a, tmp_name("k1.ptx", "node-b", 42, 0));
        assert_ne!(a, tmp_name("k1.ptx", "node-a", 43, 0));
        assert_ne!(a, tmp_name("k1.ptx", "node-a", 42, 1));
        assert_eq!(sanitize_tag("gpu-17.cluster.local\n"), "gpu-17clusterlocal");
        assert_eq!(sanitize_tag("../x y/"), "xy");
        assert_eq!(sanitize_tag(&"h".repeat(40)).len(), 32);
        // what prune takes for a writer's leftover
        assert!(a.starts_with('.') && a.ends_with(".tmp"));
        assert!(!host_tag().contains('/'));
    }

    #[test]
    fn the_directory_follows_the_environment() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(cache_dir_from(Some("/c"), Some("/x"), Some("/h")), p("/c"));
        assert_eq!(cache_dir_from(Some("off"), Some("/x"), Some("/h")), None);
        assert_eq!(cache_dir_from(Some(" 0 "), None, Some("/h")), None);
        assert_eq!(
            cache_dir_from(None, Some("/x"), Some("/h")),
            p("/x/flamia/kernels")
        );
        assert_eq!(
            cache_dir_from(Some(""), Some(""), Some("/h")),
            p("/h/.cache/flamia/kernels")
        );
        assert_eq!(cache_dir_from(None, None, None), None);
    }

    #[test]
    fn every_input_of_the_ptx_changes_the_entry() {
        let opts = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let base = entry("quant.cu", "sm_90a", (13, 0), &opts(&["-DMODE=0"]), "text");
        let others = [
            entry("attn_fwd.cu", "sm_90a", (13, 0), &opts(&["-DMODE=0"]), "text"),
            entry("quant.cu", "sm_100a", (13, 0), &opts(&["-DMODE=0"]), "text"),
            entry("quant.cu", "sm_90a", (13, 1), &opts(&["-DMODE=0"]), "text"),
            entry("quant.cu", "sm_90a", (13, 0), &opts(&["-DMODE=1"]), "text"),
            entry("quant.cu", "sm_90a", (13, 0), &opts(&["-DMODE=0"]), "text!"),
        ];
        for o in &others {
            assert_ne!(o.0, base.0, "{}", o.1);
            assert_ne!(o.1, base.1);
        }
        assert_eq!(
            base,
            entry("quant.cu", "sm_90a", (13, 0), &opts(&["-DMODE=0"]), "text")
        );
        assert!(base.0.starts_with("quant.cu-") && base.0.ends_with(".ptx"));
    }

    #[test]
    fn pruning_keeps_the_newest_entries_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(100);
        for i in 0..5u64 {
            let f = std::fs::File::create(d.join(format!("k{i}.ptx"))).unwrap();
            f.set_modified(t0 + std::time::Duration::from_secs(i)).unwrap();
        }
        // not an entry: kept
        std::fs::write(d.join("notes.txt"), "").unwrap();
        // a crashed writer's temporary file two hours old goes, a fresh one (a writer now) stays
        let stale = std::fs::File::create(d.join(".k9.ptx.1.0.tmp")).unwrap();
        stale
            .set_modified(t0 - std::time::Duration::from_secs(7200))
            .unwrap();
        std::fs::write(d.join(".k8.ptx.2.0.tmp"), "").unwrap();
        prune(d, 2);
        let mut names: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [".k8.ptx.2.0.tmp", "k3.ptx", "k4.ptx", "notes.txt"]);
    }

    #[test]
    fn a_stored_entry_is_found_under_its_header_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("new"); // (created by the store)
        let (file, header) = entry("quant.cu", "sm_90a", (13, 0), &[], "text");
        assert_eq!(lookup(&d, &file, &header), None);
        assert!(store(&d, &file, &header, ".version 8.8\n"));
        assert_eq!(lookup(&d, &file, &header).as_deref(), Some(".version 8.8\n"));
        // another header under the same name (a collision, a truncated file) is a miss
        let (_, other) = entry("quant.cu", "sm_90a", (13, 1), &[], "text");
        assert_eq!(lookup(&d, &file, &other), None);
        std::fs::write(d.join(&file), &header[..10]).unwrap();
        assert_eq!(lookup(&d, &file, &header), None);
        // a header with no PTX, or PTX with a NUL in it, is a miss
        std::fs::write(d.join(&file), &header).unwrap();
        assert_eq!(lookup(&d, &file, &header), None);
        std::fs::write(d.join(&file), format!("{header}.ver\0sion")).unwrap();
        assert_eq!(lookup(&d, &file, &header), None);
        // nothing but the entry is left in the directory
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(&file)]);
        // an unwritable place is a skipped store, not an error
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "").unwrap();
        assert!(!store(&blocker.join("sub"), &file, &header, "x"));
    }
}
