//! The pipeline's steps, one file each, and the typed metas of their actions.

pub mod meta;
pub mod noop;

pub use noop::NoopStep;
