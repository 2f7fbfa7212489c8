//! The image a workflow run uses: the repository's own environment, built (or found cached)
//! from its default branch's definition, else `autopilot.sandbox.image`; and the failed span
//! a build that did not succeed ends the task with, before any agent runs.

use uuid::Uuid;

use super::{WorkflowSpanMeta, WorkflowStep};
use crate::environment::{self, BuildRequest, EnvironmentMeta};
use crate::git::Workspace;
use crate::orchestrator::{Finished, Outcome, StepContext, StepError};
use crate::sandbox::Sandbox;
use crate::steps::meta::TaskStatus;

impl WorkflowStep {
    /// The environment of the run of `action_id` in span `span_id`: `Ok(Err(outcome))` when
    /// its build failed (the span fails with the build's error and the command that reproduces
    /// it, and the commit step records the task as failed).
    pub(super) async fn environment(
        &self,
        ctx: &StepContext,
        span_id: Uuid,
        action_id: Uuid,
        ws: &Workspace,
        sandbox: &dyn Sandbox,
    ) -> Result<Result<EnvironmentMeta, Outcome>, StepError> {
        let settings = &self.services.config.autopilot.sandbox;
        let ensure = || async {
            sandbox.ensure_image(&settings.image).await.map_err(|e| {
                StepError::from_error(&e, e.is_retryable()).detail("image", &settings.image)
            })
        };
        let definition = match environment::define(ws, settings, &self.services.host).await {
            Ok(Some(definition)) => definition,
            Ok(None) => {
                ensure().await?;
                return Ok(Ok(EnvironmentMeta::image(&settings.image)));
            }
            Err(e) => {
                let mut meta = EnvironmentMeta::image(&settings.image);
                meta.error = Some(e.to_string());
                return Ok(Err(Self::build_failed(action_id, meta)));
            }
        };
        ensure().await?;
        // A long build says how far it got on the console, as it goes.
        let (progress, mut said) = tokio::sync::mpsc::unbounded_channel::<String>();
        let console = ctx.clone();
        let short = span_id.to_string()[..8].to_owned();
        tokio::spawn(async move {
            while let Some(line) = said.recv().await {
                // Build output for a terminal: no escape sequence of it gets through.
                let line: String = line.chars().filter(|c| !c.is_control()).collect();
                console.notice(format!("{short} environment build: {line}"));
            }
        });
        let request = BuildRequest {
            definition: &definition,
            agents_image: &settings.image,
            settings: &settings.environment,
            project: &self.services.project_id,
            ws,
            dir: environment::build_dir(&ctx.store.artifacts_dir(span_id)),
            store: Some(ctx.store.root()),
            progress: Some(progress),
            host: &self.services.host,
        };
        match environment::build(&request).await {
            Ok(meta) => Ok(Ok(meta)),
            Err(failed) => Ok(Err(Self::build_failed(action_id, failed.0))),
        }
    }

    /// The failed finish of a run whose environment did not build: no container was started.
    fn build_failed(action_id: Uuid, meta: EnvironmentMeta) -> Outcome {
        let error = meta
            .error
            .clone()
            .unwrap_or_else(|| "the environment did not build".to_owned());
        let summary = format!("not started: {error}");
        Outcome::Finished(
            Finished::failed(summary.clone())
                .with_meta_record(&WorkflowSpanMeta {
                    error: Some(StepError::fatal(error).to_meta()),
                    environment: Some(meta),
                    ..WorkflowSpanMeta::default()
                })
                .then(Self::commit_action(action_id, TaskStatus::Failed, &summary)),
        )
    }
}
