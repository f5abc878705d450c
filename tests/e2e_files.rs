//! Files and IPC: regular files, FIFOs, pipes, sockets, event/signal/timer fds, epoll, inotify, locks, memfd, shared memory, terminals, external resources.
//!
//! One test binary for several test files (each a module below), so the
//! suite links a handful of binaries instead of one per file.

mod common;
mod files;
mod fifo;
mod pipes;
mod unix;
mod inet;
mod epoll;
mod eventfd;
mod signalfd;
mod timerfd;
mod inotify;
mod locks;
mod memfd;
mod shmem;
mod sysv;
mod tty;
mod pty;
mod external;
