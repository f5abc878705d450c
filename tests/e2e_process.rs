//! Processes: memory, registers, threads, trees, sessions, zombies, signals, timers, scheduling, credentials, seccomp, namespaces.
//!
//! One test binary for several test files (each a module below), so the
//! suite links a handful of binaries instead of one per file.

mod common;
mod memory;
mod registers;
mod threads;
mod tree;
mod shapes;
mod zombies;
mod signals;
mod timers;
mod sched;
mod creds;
mod seccomp;
mod stopped;
mod lifecycle;
mod cow;
mod pidfd;
mod users;
mod namespaces;
mod pidns;
mod netns;
mod mntns;
