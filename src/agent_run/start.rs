//! Starting a prepared run's container: never a second one for the same action. One that runs
//! or exited is taken over; one left created but never started (a crash in between), gone or
//! lost with its node is made again.

use super::{AgentRunError, AgentRuns, PreparedRun};
use crate::sandbox::{ContainerStatus, SandboxError};

/// How the run's container came to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub container_id: String,
    /// It ran already (a restart) and was taken over.
    pub adopted: bool,
    /// One created but never started was removed and replaced.
    pub replaced_unstarted: bool,
}

impl AgentRuns {
    /// Starts `prepared`'s container, or takes over the one that runs already.
    pub async fn start(&self, prepared: &PreparedRun) -> Result<Started, AgentRunError> {
        let spec = &prepared.spec;
        let container = spec.container_name();
        let failed = |source: SandboxError| AgentRunError::Sandbox {
            container: container.clone(),
            source,
        };
        match self.sandbox.run(spec).await {
            Ok(id) => {
                return Ok(Started {
                    container_id: id,
                    adopted: false,
                    replaced_unstarted: false,
                })
            }
            Err(SandboxError::Conflict { .. }) => {}
            Err(e) => return Err(failed(e)),
        }
        match self.sandbox.status(&container).await.map_err(failed)? {
            ContainerStatus::Running | ContainerStatus::Exited { .. } => Ok(Started {
                container_id: container.clone(),
                adopted: true,
                replaced_unstarted: false,
            }),
            // Never started, gone, or lost with its node: made again.
            ContainerStatus::Created | ContainerStatus::Gone | ContainerStatus::NodeLost => {
                self.sandbox.remove(&container).await.map_err(failed)?;
                let id = self.sandbox.run(spec).await.map_err(failed)?;
                Ok(Started {
                    container_id: id,
                    adopted: false,
                    replaced_unstarted: true,
                })
            }
        }
    }
}
