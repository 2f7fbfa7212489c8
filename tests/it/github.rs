//! Integration tests for `github`.
