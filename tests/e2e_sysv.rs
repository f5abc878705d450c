//! SysV IPC in the host's IPC namespace, alone in its binary: its victims
//! leave objects of the test user in the one namespace every test shares
//! (a dump of another tree of that user would rightly refuse them as
//! unattributable), and its tests measure the machine's shared memory.

mod common;
mod sysv;
