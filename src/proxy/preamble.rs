//! The line the relay writes before an agent's bytes, naming the run whose network the
//! connection came from: `ROVER-RUN <run>\n` for a run of the server's own dir (a daemon of one
//! checkout), `ROVER-RUN <key>/<run>\n` for a run of the store `<key>` under a server shared by
//! the repositories of a daemon file. The relay is rover's own process, started with the key
//! and the run as arguments: an agent cannot change the line. The proxy reads it byte by byte
//! so that nothing after it is consumed: the rest of the stream is the agent's HTTP, handed to
//! hyper untouched.

use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt};

use super::grant::{is_valid_key, is_valid_run};

/// What the line starts with.
pub const PREAMBLE_PREFIX: &str = "ROVER-RUN ";
/// The longest line read, newline included (a key and a run of 128 bytes each fit).
pub const MAX_PREAMBLE_BYTES: usize = 300;

/// Why a connection's first line is not a preamble.
#[derive(Debug, thiserror::Error)]
pub enum BadPreamble {
    #[error("the connection closed before its preamble line ended")]
    Closed,
    #[error("no newline within the first {MAX_PREAMBLE_BYTES} bytes")]
    TooLong,
    #[error("the first line is not `ROVER-RUN <run>` or `ROVER-RUN <key>/<run>`")]
    Garbled,
    #[error("{0:?} is not a run name")]
    BadRun(String),
    #[error("{0:?} is not a store key")]
    BadKey(String),
    #[error("cannot read the preamble")]
    Io(#[source] std::io::Error),
}

/// The run a preamble names: its store's key under the server's dir (none: the server's own
/// dir) and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRef {
    pub key: Option<String>,
    pub run: String,
}

impl RunRef {
    /// The proxy dir of the run's store, under the server's dir `root`.
    pub fn store_dir(&self, root: &Path) -> PathBuf {
        match &self.key {
            Some(key) => root.join(key),
            None => root.to_path_buf(),
        }
    }
}

/// The preamble line for `run` of the store `key` (none: the server's own dir).
pub fn preamble(key: Option<&str>, run: &str) -> String {
    match key {
        Some(key) => format!("{PREAMBLE_PREFIX}{key}/{run}\n"),
        None => format!("{PREAMBLE_PREFIX}{run}\n"),
    }
}

/// Read the preamble from `stream` and give the run it names.
pub async fn read_preamble<R: AsyncRead + Unpin>(stream: &mut R) -> Result<RunRef, BadPreamble> {
    let mut line = Vec::with_capacity(64);
    loop {
        let byte = match stream.read_u8().await {
            Ok(byte) => byte,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(BadPreamble::Closed)
            }
            Err(e) => return Err(BadPreamble::Io(e)),
        };
        if byte == b'\n' {
            break;
        }
        line.push(byte);
        if line.len() >= MAX_PREAMBLE_BYTES {
            return Err(BadPreamble::TooLong);
        }
    }
    let line = std::str::from_utf8(&line).map_err(|_| BadPreamble::Garbled)?;
    let line = line.strip_suffix('\r').unwrap_or(line);
    let named = line
        .strip_prefix(PREAMBLE_PREFIX)
        .ok_or(BadPreamble::Garbled)?;
    let (key, run) = match named.split_once('/') {
        Some((key, run)) => (Some(key), run),
        None => (None, named),
    };
    if let Some(key) = key.filter(|k| !is_valid_key(k)) {
        return Err(BadPreamble::BadKey(key.chars().take(140).collect()));
    }
    if !is_valid_run(run) {
        return Err(BadPreamble::BadRun(run.chars().take(140).collect()));
    }
    Ok(RunRef {
        key: key.map(str::to_owned),
        run: run.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_preamble_is_read_and_nothing_after_it() {
        let mut input: &[u8] = b"ROVER-RUN run-1\nGET / HTTP/1.1\r\n";
        let named = read_preamble(&mut input).await.expect("valid");
        assert_eq!(
            named,
            RunRef {
                key: None,
                run: "run-1".into()
            }
        );
        assert_eq!(named.store_dir(Path::new("/p")), PathBuf::from("/p"));
        assert_eq!(input, b"GET / HTTP/1.1\r\n");
        for bad in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"ROVER-RUN ../x\n",
            b"ROVER-RUN run",
            &[b'x'; 300][..],
        ] {
            let mut input = bad;
            assert!(read_preamble(&mut input).await.is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_keyed_preamble_names_the_store_under_the_servers_dir() {
        let line = preamble(Some("acme-web-1a2b3c4d"), "rover-run-1");
        assert_eq!(line, "ROVER-RUN acme-web-1a2b3c4d/rover-run-1\n");
        let mut input = format!("{line}GET / HTTP/1.1\r\n");
        let mut bytes = input.as_bytes();
        let named = read_preamble(&mut bytes).await.expect("valid");
        assert_eq!(named.key.as_deref(), Some("acme-web-1a2b3c4d"));
        assert_eq!(named.run, "rover-run-1");
        assert_eq!(
            named.store_dir(Path::new("/d/proxy")),
            PathBuf::from("/d/proxy/acme-web-1a2b3c4d")
        );
        assert_eq!(bytes, b"GET / HTTP/1.1\r\n");
        // The longest key and run fit in one line.
        input = preamble(Some(&"k".repeat(128)), &"r".repeat(128));
        let named = read_preamble(&mut input.as_bytes()).await.expect("fits");
        assert_eq!(named.run.len(), 128);
    }

    #[tokio::test]
    async fn keys_that_could_leave_the_servers_dir_are_refused() {
        let too_long = format!("ROVER-RUN {}/run-1\n", "k".repeat(129));
        for bad in [
            "ROVER-RUN ../run-1\n",
            "ROVER-RUN ./run-1\n",
            "ROVER-RUN /run-1\n",
            "ROVER-RUN a/b/run-1\n",
            "ROVER-RUN a b/run-1\n",
            too_long.as_str(),
        ] {
            let mut input = bad.as_bytes();
            assert!(
                matches!(
                    read_preamble(&mut input).await,
                    Err(BadPreamble::BadKey(_) | BadPreamble::BadRun(_))
                ),
                "{bad:?}"
            );
        }
        // A bad key is named as a key, not taken for part of the run.
        let mut input: &[u8] = b"ROVER-RUN ../run-1\n";
        assert!(matches!(
            read_preamble(&mut input).await,
            Err(BadPreamble::BadKey(k)) if k == ".."
        ));
        let mut input: &[u8] = b"ROVER-RUN key/..\n";
        assert!(matches!(
            read_preamble(&mut input).await,
            Err(BadPreamble::BadRun(_))
        ));
    }
}
