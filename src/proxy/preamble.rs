//! The line the relay writes before an agent's bytes, `ROVER-RUN <run>\n`, naming the run whose
//! network the connection came from. The proxy reads it byte by byte so that nothing after it
//! is consumed: the rest of the stream is the agent's HTTP, handed to hyper untouched.

use tokio::io::{AsyncRead, AsyncReadExt};

use super::grant::is_valid_run;

/// What the line starts with.
pub const PREAMBLE_PREFIX: &str = "ROVER-RUN ";
/// The longest line read, newline included.
pub const MAX_PREAMBLE_BYTES: usize = 200;

/// Why a connection's first line is not a preamble.
#[derive(Debug, thiserror::Error)]
pub enum BadPreamble {
    #[error("the connection closed before its preamble line ended")]
    Closed,
    #[error("no newline within the first {MAX_PREAMBLE_BYTES} bytes")]
    TooLong,
    #[error("the first line is not `ROVER-RUN <run>`")]
    Garbled,
    #[error("{0:?} is not a run name")]
    BadRun(String),
    #[error("cannot read the preamble")]
    Io(#[source] std::io::Error),
}

/// The preamble line for `run`.
pub fn preamble(run: &str) -> String {
    format!("{PREAMBLE_PREFIX}{run}\n")
}

/// Read the preamble from `stream` and give the run it names.
pub async fn read_preamble<R: AsyncRead + Unpin>(stream: &mut R) -> Result<String, BadPreamble> {
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
    let run = line
        .strip_prefix(PREAMBLE_PREFIX)
        .ok_or(BadPreamble::Garbled)?;
    if is_valid_run(run) {
        Ok(run.to_owned())
    } else {
        Err(BadPreamble::BadRun(run.chars().take(140).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_preamble_is_read_and_nothing_after_it() {
        let mut input: &[u8] = b"ROVER-RUN run-1\nGET / HTTP/1.1\r\n";
        assert_eq!(read_preamble(&mut input).await.expect("valid"), "run-1");
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
}
