//! Shared anonymous memory between a process and its child stays one shared
//! object after restore, with both halves' contents (victim: tests/c/shmem.c).

mod common;

use common::*;

#[test]
fn shared_anonymous_memory_stays_shared() {
    standard_cycle("shmem", "shmem", &[]);
}
