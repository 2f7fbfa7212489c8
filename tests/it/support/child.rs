//! Child processes for multi-process tests: the test binary runs one of its own `#[ignore]`d
//! tests, selected by name, with the parent's instructions in environment variables.

use std::process::{Child, Command, Stdio};

/// Set in a child run; a child test does nothing without it.
pub const CHILD_ENV: &str = "ROVER_TEST_CHILD";

/// Start `test` (its full path, e.g. `store::crash_child`) in a new process of this test binary.
pub fn spawn(test: &str, envs: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, "1")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// The value of a child's instruction, or `None` when not running as a child.
pub fn instruction(name: &str) -> Option<String> {
    std::env::var_os(CHILD_ENV)?;
    std::env::var(name).ok()
}

/// A small deterministic PRNG (xorshift64*), so failures replay with the same seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}
