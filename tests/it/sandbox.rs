//! Integration tests for `sandbox`.
