//! Files and IPC: regular files, FIFOs, pipes, sockets, event/signal/timer fds, epoll, inotify, locks, memfd, POSIX shared memory, terminals, external resources.
//!
//! One test binary for several test files (each a module below), so the
//! suite links a handful of binaries instead of one per file.

mod common;
mod devnode;
mod dirs;
mod epoll;
mod eventfd;
mod external;
mod fifo;
mod files;
mod inet;
mod inotify;
mod locks;
mod memfd;
mod netlink;
mod opath;
mod pipes;
mod pmix_link;
mod privfiles;
mod procfiles;
mod pty;
mod rawsock;
mod shmem;
mod signalfd;
mod timerfd;
mod tty;
mod unix;
