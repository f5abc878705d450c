//! ckpt's compel: run code inside another process.
//!
//! [`Tracee`] is a task stopped under ptrace: registers, xstate, signal mask
//! and memory are reachable, and single syscalls run inside it at an address
//! holding `syscall; int3`. [`Infection`] maps the freestanding parasite
//! [`blob`] into the task, calls its commands ([`proto`]) and removes every
//! trace again. [`remote::Remote`] runs syscalls from a scratch area of
//! ckpt's own (the restorer's way of rebuilding a process); [`fault`] is the
//! fault injection both the dumper and the restorer use in tests. This
//! crate knows nothing about images, files or trees.

#![warn(missing_docs)]

pub mod batch;
pub mod blob;
pub mod error;
pub mod fault;
mod infect;
pub mod proc_read;
pub mod proto;
pub mod remote;
mod sigframe;
mod sys;
pub mod tracee;
pub mod uffd;

pub use error::{ParasiteError, Result};
pub use infect::{Infection, ThreadState, first_exec_addr, restart_regs};
pub use sys::{RseqConfig, SIGINFO_SIZE, cpu_vendor, xcr0, xsave_size};
pub use tracee::{NewTask, Regs, SYSCALL_INT3, Stopping, TaskMemory, Tracee, check_ret, tracer_of};
