//! Docker sandboxes in which workflow agents run, behind a narrow trait.
