//! Lab tier, the Slurm lab (scripts/slurm/lab-up.sh): `ckpt slurm` under a real Slurm, on one and two nodes, the site hooks, and jobs of an ordinary user through the ckpt service.
//!
//! One test binary for several test files (each a module below), so the
//! suite links a handful of binaries instead of one per file.

mod common;
mod slurm;
mod slurm_lab;
mod slurm_nodes;
mod slurm_pmix;
mod slurm_site;
mod slurm_users;
