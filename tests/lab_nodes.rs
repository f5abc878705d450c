//! Lab tier, multi-node jobs and real programs: coordinated checkpoints across "nodes" (network namespaces on a bridge), `ckpt job`, Open MPI across nodes, and programs nobody here wrote (Python, redis, Open MPI, tmux, make building Lua, tail -f).
//!
//! One test binary for several test files (each a module below), so the
//! suite links a handful of binaries instead of one per file.

mod common;
mod coord_job;
mod job;
mod mpi_nodes;
mod multinode;
mod programs;
mod slurm_lab;
