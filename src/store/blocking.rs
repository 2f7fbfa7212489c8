//! Store work from async code: the store's files are read and written with blocking calls (and
//! fsyncs), so async callers (the orchestrator, the steps, the daemon) run it on the blocking
//! pool through [`blocking`].

use super::{AutopilotStore, StoreError};

/// Run blocking store work off the async runtime.
pub async fn blocking<T: Send + 'static>(
    store: AutopilotStore,
    f: impl FnOnce(&AutopilotStore) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .expect("store work does not panic")
}
