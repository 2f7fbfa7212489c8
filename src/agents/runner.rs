//! Runs an agent CLI as a child process: own process group, allow-listed env, both pipes
//! drained, timeouts, SIGTERM-then-SIGKILL of the whole group, and a transcript on disk.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{sleep_until, timeout};

use super::error::AgentError;

/// Bytes of stderr (and of stdout, for error reports) kept in memory.
const TAIL_BYTES: usize = 64 * 1024;

/// One child process to run.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Working directory.
    pub cwd: PathBuf,
    /// The complete environment (the parent's is cleared first).
    pub env: Vec<(String, String)>,
    /// Bytes written to stdin, which is then closed; `None` gives a null stdin.
    pub stdin: Option<Vec<u8>>,
    /// Absolute limit.
    pub timeout: Duration,
    /// Limit on silence on stdout.
    pub inactivity_timeout: Duration,
    /// Time between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// How long to let the process finish on its own after the final line arrived.
    pub after_result_grace: Duration,
    /// Raw stdout lines go here; stderr to the same path with `.stderr` appended.
    pub transcript: Option<PathBuf>,
    /// Longest stdout line kept (longer lines are cut, still counted as one line).
    pub max_line_bytes: usize,
}

/// How the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEnd {
    /// Stdout reached EOF or the final line arrived, and the process exited.
    Finished,
    /// The absolute timeout passed; the group was stopped.
    Timeout,
    /// Stdout was silent too long; the group was stopped.
    Inactive,
}

/// What a run produced besides the lines given to the callback.
#[derive(Debug, Clone)]
pub struct ProcessOutcome {
    /// How it ended.
    pub end: ProcessEnd,
    /// Whether the callback reported the final line.
    pub result_seen: bool,
    /// Exit code, when the process exited normally.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// Whether rover stopped the process group itself.
    pub stopped_by_us: bool,
    /// The end of stderr.
    pub stderr: String,
    /// The end of stdout.
    pub stdout_tail: String,
    /// Total stdout bytes.
    pub stdout_bytes: usize,
    /// Wall-clock time from spawn to exit.
    pub elapsed: Duration,
}

/// Stops the process group when a run is abandoned (its future dropped, e.g. on cancellation):
/// SIGTERM now, SIGKILL after the grace period, and the child is reaped.
struct GroupGuard {
    pgid: Pid,
    child: Option<Child>,
    grace: Duration,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pgid = self.pgid;
        let grace = self.grace;
        let _ = killpg(pgid, Signal::SIGTERM);
        // A plain thread, so the cleanup outlives the runtime and needs no SIGCHLD delivery:
        // it polls `try_wait` (a non-blocking waitpid) until the child is reaped.
        let spawned = std::thread::Builder::new()
            .name("rover-agent-reaper".to_owned())
            .spawn(move || {
                let poll = Duration::from_millis(20);
                let started = Instant::now();
                while started.elapsed() < grace {
                    if !matches!(child.try_wait(), Ok(None)) {
                        let _ = killpg(pgid, Signal::SIGKILL);
                        return;
                    }
                    std::thread::sleep(poll);
                }
                let _ = killpg(pgid, Signal::SIGKILL);
                let started = Instant::now();
                while started.elapsed() < Duration::from_secs(60) {
                    if !matches!(child.try_wait(), Ok(None)) {
                        return;
                    }
                    std::thread::sleep(poll);
                }
            });
        if spawned.is_err() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

/// Waits for the child to exit. Normally woken by SIGCHLD; also polls `try_wait` so a missed
/// notification cannot hang the run.
async fn reap(child: &mut Child) -> std::io::Result<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        tokio::select! {
            status = child.wait() => return status,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Keeps the last `max` bytes of everything pushed.
#[derive(Default)]
struct Tail {
    bytes: Vec<u8>,
    total: usize,
}

impl Tail {
    fn push(&mut self, data: &[u8], max: usize) {
        self.total += data.len();
        self.bytes.extend_from_slice(data);
        if self.bytes.len() > max {
            let drop = self.bytes.len() - max;
            self.bytes.drain(..drop);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Reads one line into `buf` (without the newline), keeping at most `max` bytes of it.
/// Returns false at EOF with nothing read. Cancel-safe: bytes are consumed only once copied.
async fn read_line_capped(
    reader: &mut BufReader<ChildStdout>,
    buf: &mut Vec<u8>,
    seen: &mut usize,
    max: usize,
) -> std::io::Result<bool> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(*seen > 0);
        }
        let (chunk, used, done) = match available.iter().position(|b| *b == b'\n') {
            Some(at) => (&available[..at], at + 1, true),
            None => (available, available.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        *seen += used;
        reader.consume(used);
        if done {
            return Ok(true);
        }
    }
}

fn io_error(path: &std::path::Path, source: std::io::Error) -> AgentError {
    AgentError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Sends SIGTERM to the group, waits `grace`, then SIGKILLs it; returns the leader's status.
async fn stop_group(child: &mut Child, pgid: Pid, grace: Duration) -> std::io::Result<ExitStatus> {
    let _ = killpg(pgid, Signal::SIGTERM);
    if let Ok(status) = timeout(grace, reap(child)).await {
        return status;
    }
    let _ = killpg(pgid, Signal::SIGKILL);
    reap(child).await
}

/// Runs `spec`, giving each stdout line to `on_line`, which returns true at the final line.
///
/// Once the final line arrived the process gets `after_result_grace` to exit by itself, then
/// its group is stopped: a result followed by a hang or a non-zero exit is still a result.
pub async fn run_process(
    spec: ProcessSpec,
    on_line: &mut (dyn FnMut(&str) -> bool + Send),
) -> Result<ProcessOutcome, AgentError> {
    // Opened before the spawn: an unwritable transcript must not cost a started agent.
    let mut transcript = match &spec.transcript {
        Some(path) => Some(BufWriter::new(
            tokio::fs::File::create(path)
                .await
                .map_err(|err| io_error(path, err))?,
        )),
        None => None,
    };
    let started = Instant::now();
    let (mut guard, stdout, stderr_task) = spawn(&spec)?;
    let deadline = tokio::time::Instant::from_std(started + spec.timeout);
    let mut read = read_stdout(&spec, stdout, deadline, &mut transcript, on_line).await?;
    let child = guard
        .child
        .as_mut()
        .expect("the guard holds the child until the end");
    let (status, stopped_by_us) = end_child(&spec, child, guard.pgid, deadline, &mut read).await;
    // Anything left in the group (grandchildren) goes too; the leader is already reaped.
    let _ = killpg(guard.pgid, Signal::SIGKILL);
    guard.child = None;
    let status = status.map_err(|source| AgentError::Spawn {
        binary: spec.program.display().to_string(),
        source,
    })?;
    let elapsed = started.elapsed();
    let stderr_tail = match timeout(Duration::from_secs(2), stderr_task).await {
        Ok(Ok(tail)) => tail,
        _ => Tail::default(),
    };
    if let (Some(writer), Some(path)) = (transcript, spec.transcript.as_ref()) {
        close_transcript(writer, path, &stderr_tail).await?;
    }
    Ok(ProcessOutcome {
        end: read.end,
        result_seen: read.result_seen,
        exit_code: status.code(),
        signal: status.signal(),
        stopped_by_us,
        stderr: stderr_tail.text(),
        stdout_tail: read.stdout_tail.text(),
        stdout_bytes: read.stdout_tail.total,
        elapsed,
    })
}

/// The child started in a process group of its own, under a guard that stops the group if
/// the caller goes away; its stdout, and a task keeping the tail of its stderr. The stdin
/// data is written from its own task so a child that prints before reading cannot deadlock
/// us; dropping the handle closes stdin (claude and codex wait for EOF).
fn spawn(
    spec: &ProcessSpec,
) -> Result<(GroupGuard, ChildStdout, tokio::task::JoinHandle<Tail>), AgentError> {
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|source| AgentError::Spawn {
        binary: spec.program.display().to_string(),
        source,
    })?;
    let pgid = Pid::from_raw(
        child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .expect("a just-spawned child has a pid"),
    );
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    if let (Some(data), Some(mut stdin)) = (spec.stdin.clone(), child.stdin.take()) {
        tokio::spawn(async move {
            let _ = stdin.write_all(&data).await;
            let _ = stdin.shutdown().await;
        });
    }
    let stderr_task = tokio::spawn(async move {
        let mut tail = Tail::default();
        let mut chunk = vec![0_u8; 16 * 1024];
        while let Ok(n) = stderr.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            tail.push(&chunk[..n], TAIL_BYTES);
        }
        tail
    });
    let guard = GroupGuard {
        pgid,
        child: Some(child),
        grace: spec.kill_grace,
    };
    Ok((guard, stdout, stderr_task))
}

/// How reading a child's stdout ended.
struct Reading {
    end: ProcessEnd,
    result_seen: bool,
    /// Stdout closed.
    eof: bool,
    stdout_tail: Tail,
}

/// Reads stdout a line at a time (each capped, copied to the transcript, handed to
/// `on_line`) until it closes, the deadline passes, it stays silent past the inactivity
/// limit, or past the short grace after the final line.
async fn read_stdout(
    spec: &ProcessSpec,
    stdout: ChildStdout,
    deadline: tokio::time::Instant,
    transcript: &mut Option<BufWriter<tokio::fs::File>>,
    on_line: &mut (dyn FnMut(&str) -> bool + Send),
) -> Result<Reading, AgentError> {
    let mut reader = BufReader::with_capacity(256 * 1024, stdout);
    let mut read = Reading {
        end: ProcessEnd::Finished,
        result_seen: false,
        eof: false,
        stdout_tail: Tail::default(),
    };
    let mut buf = Vec::new();
    let mut seen = 0;
    let mut idle_deadline = tokio::time::Instant::now() + spec.inactivity_timeout;
    loop {
        let read_until = if read.result_seen {
            idle_deadline.min(deadline)
        } else {
            deadline
        };
        tokio::select! {
            line = read_line_capped(&mut reader, &mut buf, &mut seen, spec.max_line_bytes) => {
                let Ok(true) = line else {
                    read.eof = true;
                    break;
                };
                read.stdout_tail.push(&buf, TAIL_BYTES);
                read.stdout_tail.push(b"\n", TAIL_BYTES);
                if let (Some(writer), Some(path)) = (transcript.as_mut(), spec.transcript.as_ref()) {
                    writer.write_all(&buf).await.map_err(|err| io_error(path, err))?;
                    writer.write_all(b"\n").await.map_err(|err| io_error(path, err))?;
                }
                let line = String::from_utf8_lossy(&buf).into_owned();
                buf.clear();
                seen = 0;
                read.result_seen |= on_line(&line);
                // After the result only a short grace applies; before it, the inactivity limit.
                idle_deadline = tokio::time::Instant::now()
                    + if read.result_seen { spec.after_result_grace } else { spec.inactivity_timeout };
            }
            () = sleep_until(read_until) => {
                if !read.result_seen {
                    read.end = ProcessEnd::Timeout;
                }
                break;
            }
            () = sleep_until(idle_deadline), if !read.result_seen => {
                read.end = ProcessEnd::Inactive;
                break;
            }
        }
    }
    Ok(read)
}

/// The child's exit status, and whether rover stopped it: with stdout closed it is waited
/// for, bounded by the deadline (or the grace after a result), then stopped; otherwise it is
/// stopped at once.
async fn end_child(
    spec: &ProcessSpec,
    child: &mut Child,
    pgid: Pid,
    deadline: tokio::time::Instant,
    read: &mut Reading,
) -> (std::io::Result<ExitStatus>, bool) {
    if read.end == ProcessEnd::Finished && read.eof {
        let limit = if read.result_seen {
            tokio::time::Instant::now() + spec.after_result_grace
        } else {
            deadline
        };
        if let Ok(status) = tokio::time::timeout_at(limit, reap(child)).await {
            return (status, false);
        }
        if !read.result_seen {
            read.end = ProcessEnd::Timeout;
        }
    }
    (stop_group(child, pgid, spec.kill_grace).await, true)
}

/// Flushes the transcript and writes the stderr tail beside it (`<transcript>.stderr`).
async fn close_transcript(
    mut writer: BufWriter<tokio::fs::File>,
    path: &Path,
    stderr_tail: &Tail,
) -> Result<(), AgentError> {
    writer.flush().await.map_err(|err| io_error(path, err))?;
    let mut stderr_path = path.to_path_buf().into_os_string();
    stderr_path.push(".stderr");
    let stderr_path = PathBuf::from(stderr_path);
    tokio::fs::write(&stderr_path, &stderr_tail.bytes)
        .await
        .map_err(|err| io_error(&stderr_path, err))
}
