//! Processes: memory, registers, threads, trees, sessions, zombies, signals, timers, scheduling, credentials, seccomp, namespaces.
//!
//! One test binary for several test files (each a module below), so the
//! suite links a handful of binaries instead of one per file.

mod clone_share;
mod common;
mod cow;
mod creds;
mod lifecycle;
mod memory;
mod mntns;
mod namespaces;
mod netns;
mod pidfd;
mod pidns;
mod registers;
mod sched;
mod seccomp;
mod shapes;
mod signals;
mod stopped;
mod threads;
mod timers;
mod tree;
mod users;
mod zombies;
