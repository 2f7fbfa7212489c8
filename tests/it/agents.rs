//! Integration tests for `agents`.
