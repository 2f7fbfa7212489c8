//! For `status` on the swarm backend: which node runs which of the project's sandboxes, asked
//! of the swarm's manager (`ROVER_SWARM_HOST`, default `DOCKER_HOST`).

use crate::config::RoverConfig;
use crate::sandbox::swarm::Placement;
use crate::sandbox::{
    docker_host, DockerSandbox, SandboxBackend, SwarmSandbox, DOCKER_HOST_ENV, SWARM_HOST_ENV,
};

use super::Context;

/// The project's services and their nodes; `None` when the project's backend is not `swarm`;
/// an error in words when the manager does not answer.
pub fn placements(ctx: &Context, project: &str) -> Option<Result<Vec<Placement>, String>> {
    let config = ctx
        .project()
        .ok()
        .and_then(|p| RoverConfig::load(&p.root).ok())?;
    if config.autopilot.sandbox.backend != SandboxBackend::Swarm {
        return None;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return Some(Err(format!("cannot start a runtime to ask the swarm: {e}"))),
    };
    let project = project.to_owned();
    Some(runtime.block_on(async move {
        let local = DockerSandbox::connect(Vec::new(), &ctx.host)
            .await
            .map_err(|e| crate::error::error_chain(&e))?;
        let manager = docker_host(
            ctx.host
                .var(SWARM_HOST_ENV)
                .or_else(|| ctx.host.var(DOCKER_HOST_ENV)),
        );
        let swarm = SwarmSandbox::connect(local, &manager, Vec::new())
            .await
            .map_err(|e| crate::error::error_chain(&e))?;
        swarm
            .placements(&project)
            .await
            .map_err(|e| crate::error::error_chain(&e))
    }))
}
