//! Container logs with a size cap: what a container prints goes to disk as it arrives, at most a
//! set number of bytes per stream (its head and its tail, with a line saying how much was cut
//! between), and is read back a bounded amount at a time. Memory stays the same whatever a
//! container prints.
//!
//! A stream of limit `L` writes its first `L/2` bytes straight to its file (the head). Past the
//! head, bytes go to two tail files of `L/4` each, in turn: when the current one is full, the
//! other is emptied and takes over. Until the stream has passed `L` nothing is dropped; past it,
//! each switch drops the older quarter (the middle of the output). [`CappedLog::finish`] appends
//! the tail files to the head (after a line saying how many bytes were cut, when some were) and
//! removes them. So a stream's files never hold more than `L` bytes while it runs; the kept file
//! holds at most `L` plus that line (for a moment while the tail is appended, up to `L/4` more).

use std::io::SeekFrom;
use std::path::{Path, PathBuf};

use tokio::fs::File;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::error::SandboxError;

/// One stream's log, capped; see the module documentation.
#[derive(Debug)]
pub struct CappedLog {
    path: PathBuf,
    file: File,
    head_cap: u64,
    tail_cap: u64,
    head_len: u64,
    seen: u64,
    tails: Option<Tails>,
}

#[derive(Debug)]
struct Tails {
    paths: [PathBuf; 2],
    files: [File; 2],
    lens: [u64; 2],
    current: usize,
}

/// What a finished capped stream saw and kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Bytes the stream carried.
    pub seen: u64,
    /// Bytes dropped from its middle (0 when the file holds all of it).
    pub cut: u64,
}

fn file_err(path: &Path) -> impl FnOnce(std::io::Error) -> SandboxError {
    let path = path.to_path_buf();
    move |source| SandboxError::File { path, source }
}

/// The two tail files of the log at `path` (next to it, `.tail.0` and `.tail.1` appended).
pub fn tail_paths(path: &Path) -> [PathBuf; 2] {
    [0, 1].map(|i| {
        let mut name = path
            .file_name()
            .map(std::ffi::OsStr::to_os_string)
            .unwrap_or_default();
        name.push(format!(".tail.{i}"));
        path.with_file_name(name)
    })
}

/// The bytes the log at `path` holds on disk now, its tail files included: it changes as long
/// as the stream carries output (the stuck detector's measure of activity).
pub async fn bytes_on_disk(path: &Path) -> u64 {
    let mut total = 0;
    let [a, b] = tail_paths(path);
    for p in [path.to_path_buf(), a, b] {
        total += tokio::fs::metadata(&p).await.map_or(0, |m| m.len());
    }
    total
}

/// The line put where bytes were cut.
pub fn cut_note(cut: u64, limit: u64, head: u64, tail: u64) -> String {
    format!(
        "\n[rover: {cut} bytes cut here; this stream passed its limit of {limit} bytes (autopilot.sandbox.logLimitMb); rover kept the first {head} and the last {tail} bytes]\n"
    )
}

impl CappedLog {
    /// Creates (or truncates) the log at `path`, keeping at most `limit` bytes of the stream;
    /// tail files left by an earlier run are removed.
    pub async fn create(path: &Path, limit: u64) -> Result<CappedLog, SandboxError> {
        for stale in tail_paths(path) {
            match tokio::fs::remove_file(&stale).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(file_err(&stale)(e)),
            }
        }
        let file = File::create(path).await.map_err(file_err(path))?;
        let head_cap = limit / 2;
        Ok(CappedLog {
            path: path.to_path_buf(),
            file,
            head_cap,
            // At least a byte, so a tiny limit still moves on.
            tail_cap: ((limit - head_cap) / 2).max(1),
            head_len: 0,
            seen: 0,
            tails: None,
        })
    }

    /// The most bytes the file keeps without a cut.
    pub fn limit(&self) -> u64 {
        self.head_cap + 2 * self.tail_cap
    }

    /// Bytes the stream carried so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The stream has passed its limit: its middle is being dropped.
    pub fn over_limit(&self) -> bool {
        self.seen > self.limit()
    }

    /// Appends `bytes` to the stream.
    pub async fn write(&mut self, mut bytes: &[u8]) -> Result<(), SandboxError> {
        self.seen += bytes.len() as u64;
        if self.head_len < self.head_cap {
            let room = usize::try_from(self.head_cap - self.head_len).unwrap_or(usize::MAX);
            let (now, rest) = bytes.split_at(bytes.len().min(room));
            self.file
                .write_all(now)
                .await
                .map_err(file_err(&self.path))?;
            self.head_len += now.len() as u64;
            bytes = rest;
        }
        while !bytes.is_empty() {
            let tails = match &mut self.tails {
                Some(tails) => tails,
                None => self.tails.insert(Tails::create(&self.path).await?),
            };
            let cur = tails.current;
            if tails.lens[cur] == self.tail_cap {
                // The current one is full: the other (the older quarter) is dropped and refilled.
                let next = 1 - cur;
                let file = &mut tails.files[next];
                let path = &tails.paths[next];
                file.set_len(0).await.map_err(file_err(path))?;
                file.seek(SeekFrom::Start(0))
                    .await
                    .map_err(file_err(path))?;
                tails.lens[next] = 0;
                tails.current = next;
                continue;
            }
            let room = usize::try_from(self.tail_cap - tails.lens[cur]).unwrap_or(usize::MAX);
            let (now, rest) = bytes.split_at(bytes.len().min(room));
            tails.files[cur]
                .write_all(now)
                .await
                .map_err(file_err(&tails.paths[cur]))?;
            tails.lens[cur] += now.len() as u64;
            bytes = rest;
        }
        Ok(())
    }

    /// Puts the file together (head, the cut line if bytes were dropped, tail), flushed, and
    /// removes the tail files.
    pub async fn finish(mut self) -> Result<StreamStats, SandboxError> {
        let path = self.path.clone();
        let Some(mut tails) = self.tails.take() else {
            self.file.flush().await.map_err(file_err(&path))?;
            return Ok(StreamStats {
                seen: self.seen,
                cut: 0,
            });
        };
        for (file, p) in tails.files.iter_mut().zip(&tails.paths) {
            file.flush().await.map_err(file_err(p))?;
        }
        // Oldest first: the other file (full, or still empty), then the current one.
        let order = [1 - tails.current, tails.current];
        let kept_tail = tails.lens[0] + tails.lens[1];
        let cut = self.seen - self.head_len - kept_tail;
        if cut > 0 {
            let note = cut_note(cut, self.limit(), self.head_len, kept_tail);
            self.file
                .write_all(note.as_bytes())
                .await
                .map_err(file_err(&path))?;
        }
        let Tails { paths, files, .. } = tails;
        drop(files);
        for i in order {
            let mut from = File::open(&paths[i]).await.map_err(file_err(&paths[i]))?;
            tokio::io::copy(&mut from, &mut self.file)
                .await
                .map_err(file_err(&path))?;
            drop(from);
            tokio::fs::remove_file(&paths[i])
                .await
                .map_err(file_err(&paths[i]))?;
        }
        self.file.flush().await.map_err(file_err(&path))?;
        Ok(StreamStats {
            seen: self.seen,
            cut,
        })
    }
}

/// A container's two output streams, each capped: stdout to a path, stderr to the path with
/// `.stderr` added (see [`super::stderr_path`]); what the engines' log streams are written to.
#[derive(Debug)]
pub struct CappedLogs {
    out: CappedLog,
    err: CappedLog,
}

impl CappedLogs {
    /// Creates (or truncates) both files, each capped at `limit` bytes.
    pub async fn create(path: &Path, limit: u64) -> Result<CappedLogs, SandboxError> {
        Ok(CappedLogs {
            out: CappedLog::create(path, limit).await?,
            err: CappedLog::create(&super::stderr_path(path), limit).await?,
        })
    }

    /// Writes one chunk of the engine's log stream to its stream's file.
    pub async fn write(
        &mut self,
        chunk: bollard::container::LogOutput,
    ) -> Result<(), SandboxError> {
        use bollard::container::LogOutput;
        match chunk {
            LogOutput::StdErr { message } => self.err.write(&message).await,
            LogOutput::StdOut { message }
            | LogOutput::Console { message }
            | LogOutput::StdIn { message } => self.out.write(&message).await,
        }
    }

    /// A stream passed the limit: what the container prints from now on would only be cut.
    pub fn over_limit(&self) -> bool {
        self.out.over_limit() || self.err.over_limit()
    }

    /// Puts both files together (also when the stream broke: `failed`, returned then) and says
    /// how much each stream carried and lost.
    pub async fn finish(
        self,
        failed: Option<SandboxError>,
    ) -> Result<super::LogStats, SandboxError> {
        let limit_bytes = self.out.limit();
        let out = self.out.finish().await;
        let err = self.err.finish().await;
        if let Some(e) = failed {
            return Err(e);
        }
        let (out, err) = (out?, err?);
        Ok(super::LogStats {
            stdout_bytes: out.seen,
            stderr_bytes: err.seen,
            stdout_cut: out.cut,
            stderr_cut: err.cut,
            limit_bytes,
        })
    }
}

impl Tails {
    async fn create(path: &Path) -> Result<Tails, SandboxError> {
        let paths = tail_paths(path);
        let a = File::create(&paths[0]).await.map_err(file_err(&paths[0]))?;
        let b = File::create(&paths[1]).await.map_err(file_err(&paths[1]))?;
        Ok(Tails {
            paths,
            files: [a, b],
            lens: [0, 0],
            current: 0,
        })
    }
}

/// At most the last `max` bytes of the file at `path` (empty when it cannot be read).
pub async fn read_tail(path: &Path, max: u64) -> Vec<u8> {
    let Ok(mut file) = File::open(path).await else {
        return Vec::new();
    };
    let len = file.metadata().await.map_or(0, |m| m.len());
    let start = len.saturating_sub(max);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).await.is_ok() {
        let _ = file.take(max).read_to_end(&mut bytes).await;
    }
    bytes
}

/// At most the first `max` bytes of the file at `path` (empty when it cannot be read).
async fn read_head(path: &Path, max: u64) -> Vec<u8> {
    let Ok(file) = File::open(path).await else {
        return Vec::new();
    };
    let mut bytes = Vec::new();
    let _ = file.take(max).read_to_end(&mut bytes).await;
    bytes
}

/// The files at `paths` one after the other, as [`crate::git::bounded_output`] would give their
/// concatenation (head and tail within `limit`, the cut marked), reading at most `limit` bytes:
/// a file that cannot be read counts as empty. Returns the text and whether it was cut.
pub async fn read_bounded(paths: &[PathBuf], limit: usize) -> (String, bool) {
    let mut lens = Vec::with_capacity(paths.len());
    for p in paths {
        lens.push(tokio::fs::metadata(p).await.map_or(0, |m| m.len()));
    }
    let total: u64 = lens.iter().sum();
    let limit_u64 = limit as u64;
    if total <= limit_u64 {
        let mut bytes = Vec::new();
        for (p, len) in paths.iter().zip(&lens) {
            bytes.extend(read_head(p, *len).await);
        }
        return crate::git::bounded_output(&bytes, limit);
    }
    let half = limit_u64 / 2;
    let mut head = Vec::new();
    for (p, len) in paths.iter().zip(&lens) {
        let want = half - head.len() as u64;
        if want == 0 {
            break;
        }
        head.extend(read_head(p, want.min(*len)).await);
    }
    let mut tail: Vec<u8> = Vec::new();
    for (p, len) in paths.iter().zip(&lens).rev() {
        let want = half - tail.len() as u64;
        if want == 0 {
            break;
        }
        let mut part = read_tail(p, want.min(*len)).await;
        part.extend(tail);
        tail = part;
    }
    let cut = total - head.len() as u64 - tail.len() as u64;
    let text = format!(
        "{}\n[... {cut} bytes truncated by rover ...]\n{}",
        String::from_utf8_lossy(&head),
        String::from_utf8_lossy(&tail),
    );
    (text, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn capped(dir: &Path, limit: u64, chunks: &[&[u8]]) -> (Vec<u8>, StreamStats) {
        let path = dir.join("out.log");
        let mut log = CappedLog::create(&path, limit).await.expect("create");
        for chunk in chunks {
            log.write(chunk).await.expect("write");
        }
        let stats = log.finish().await.expect("finish");
        for tail in tail_paths(&path) {
            assert!(!tail.exists(), "{} left behind", tail.display());
        }
        (std::fs::read(&path).expect("read"), stats)
    }

    #[tokio::test]
    async fn a_stream_within_its_limit_is_kept_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (bytes, stats) = capped(dir.path(), 16, &[b"0123456", b"789abcdef"]).await;
        assert_eq!(bytes, b"0123456789abcdef");
        assert_eq!(stats, StreamStats { seen: 16, cut: 0 });
        let (bytes, stats) = capped(dir.path(), 16, &[b"0123"]).await;
        assert_eq!(bytes, b"0123");
        assert_eq!(stats, StreamStats { seen: 4, cut: 0 });
        let (bytes, _) = capped(dir.path(), 16, &[]).await;
        assert!(bytes.is_empty());
    }

    #[tokio::test]
    async fn past_its_limit_the_head_and_the_tail_are_kept_and_the_cut_is_said() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Limit 16: head 8, two tail files of 4. 26 bytes: head `abcdefgh`; the tail files take
        // `ijkl` and `mnop`, then `qrst` (dropping `ijkl`), `uvwx` (dropping `mnop`) and `yz`
        // (dropping `qrst`): kept `uvwx` + `yz`.
        let input: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
        let (bytes, stats) =
            capped(dir.path(), 16, &[&input[..3], &input[3..20], &input[20..]]).await;
        let mut expected = b"abcdefgh".to_vec();
        expected.extend(cut_note(12, 16, 8, 6).as_bytes());
        expected.extend(b"uvwxyz");
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&expected)
        );
        assert_eq!(stats, StreamStats { seen: 26, cut: 12 });
        assert!(cut_note(12, 16, 8, 6).contains(
            "12 bytes cut here; this stream passed its limit of 16 bytes (autopilot.sandbox.logLimitMb); rover kept the first 8 and the last 6 bytes"
        ));
        // One byte over: the first tail quarter goes.
        let (bytes, stats) = capped(dir.path(), 16, &[&input[..17]]).await;
        let mut expected = b"abcdefgh".to_vec();
        expected.extend(cut_note(4, 16, 8, 5).as_bytes());
        expected.extend(b"mnopq");
        assert_eq!(bytes, expected);
        assert_eq!(stats, StreamStats { seen: 17, cut: 4 });
    }

    #[tokio::test]
    async fn the_files_of_a_stream_never_hold_more_than_its_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out.log");
        let mut log = CappedLog::create(&path, 1000).await.expect("create");
        for i in 0..500u32 {
            log.write(format!("line {i}\n").as_bytes())
                .await
                .expect("write");
            let on_disk = bytes_on_disk(&path).await;
            assert!(on_disk <= 1000, "{on_disk} bytes on disk after line {i}");
            assert_eq!(log.over_limit(), log.seen() > 1000);
        }
        let stats = log.finish().await.expect("finish");
        let bytes = std::fs::read(&path).expect("read");
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.starts_with("line 0\nline 1\n"), "{text}");
        assert!(text.ends_with("line 498\nline 499\n"), "{text}");
        assert_eq!(
            bytes.len() as u64,
            stats.seen - stats.cut
                + cut_note(stats.cut, 1000, 500, stats.seen - stats.cut - 500).len() as u64
        );
    }

    /// The writer holds no buffer of its own: 256 MiB through a 1 MiB cap leaves the process's
    /// peak memory where it was (give or take what other tests do meanwhile).
    #[tokio::test]
    async fn memory_does_not_grow_with_the_output() {
        fn peak_kib() -> u64 {
            std::fs::read_to_string("/proc/self/status")
                .expect("procfs")
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .expect("VmHWM")
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out.log");
        let before = peak_kib();
        let mut log = CappedLog::create(&path, 1 << 20).await.expect("create");
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..(256 * 16) {
            log.write(&chunk).await.expect("write");
        }
        let stats = log.finish().await.expect("finish");
        // The kernel's resident counters are approximate (per-CPU caches): under a loaded parallel
        // run the peak can read back a little lower than before.
        let grown_mib = peak_kib().saturating_sub(before) / 1024;
        assert_eq!(stats.seen, 256 << 20);
        assert!(std::fs::metadata(&path).expect("meta").len() < (1 << 20) + 200);
        assert!(
            grown_mib < 64,
            "peak memory grew by {grown_mib} MiB for 256 MiB of output"
        );
    }

    #[tokio::test]
    async fn bounded_reads_match_the_whole_reads_they_replace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("a");
        let err = dir.path().join("b");
        let cases: [(&[u8], &[u8]); 4] = [
            (b"hello ", b"world"),
            (b"0123456789", b"abcdefghij"),
            (b"01", b"abcdefghijklmnopqrstuvwxyz"),
            (b"abcdefghijklmnopqrstuvwxyz", b""),
        ];
        for (a, b) in cases {
            std::fs::write(&out, a).expect("write");
            std::fs::write(&err, b).expect("write");
            let whole = [a, b].concat();
            for limit in [4, 8, 11, 64] {
                assert_eq!(
                    read_bounded(&[out.clone(), err.clone()], limit).await,
                    crate::git::bounded_output(&whole, limit),
                    "{a:?} {b:?} within {limit}"
                );
            }
        }
        let missing = dir.path().join("missing");
        assert_eq!(
            read_bounded(std::slice::from_ref(&missing), 10).await,
            (String::new(), false)
        );
        assert_eq!(read_tail(&out, 3).await, b"xyz");
        assert!(read_tail(&missing, 3).await.is_empty());
    }
}
