//! GitHub: a narrow interface shaped around what the steps need, implemented with octocrab.
