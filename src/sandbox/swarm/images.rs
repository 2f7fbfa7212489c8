//! Images onto a node without a registry: `docker save` from one engine streamed into `docker
//! load` on another, through their APIs. The image keeps its id (a content address), which is
//! how a service names it.

use futures_util::StreamExt;

use crate::sandbox::error::{status_of, SandboxError};
use crate::sandbox::DockerSandbox;

/// The id (`sha256:…`) of `image` on `engine`; `None` when it has no such image.
pub async fn image_id(engine: &DockerSandbox, image: &str) -> Result<Option<String>, SandboxError> {
    match engine.client().inspect_image(image).await {
        Ok(info) => Ok(info.id),
        Err(e) if status_of(&e) == Some(404) => Ok(None),
        Err(e) => Err(engine.err("inspect image", image, e)),
    }
}

/// Copies `image` from `from` onto `to` unless `to` has the same id already; returns the id.
pub async fn load_image(
    from: &DockerSandbox,
    to: &DockerSandbox,
    image: &str,
) -> Result<String, SandboxError> {
    let id = image_id(from, image)
        .await?
        .ok_or_else(|| SandboxError::ImageMissing {
            image: image.to_owned(),
        })?;
    if image_id(to, &id).await?.is_some() {
        return Ok(id);
    }
    let saved = from.client().export_image(image);
    let mut loaded = to.client().import_image_stream(
        bollard::query_parameters::ImportImageOptionsBuilder::default()
            .quiet(true)
            .build(),
        saved,
        None,
    );
    while let Some(step) = loaded.next().await {
        let step = step.map_err(|e| to.err("load image", image, e))?;
        if let Some(error) = step.error_detail.and_then(|d| d.message) {
            return Err(SandboxError::ImageBuild {
                image: image.to_owned(),
                reason: format!("loading it onto {} failed: {error}", to.host()),
            });
        }
    }
    if image_id(to, &id).await?.is_none() {
        return Err(SandboxError::ImageBuild {
            image: image.to_owned(),
            reason: format!("{} loaded it but has no image {id}", to.host()),
        });
    }
    Ok(id)
}
