//! Lab tier, QEMU guests (scripts/ib-vm.sh): InfiniBand over SoftRoCE, the vDSO proxy and older kernels.
//!
//! One test binary for several test files (each a module below), so the
//! suite links a handful of binaries instead of one per file.

mod common;
mod ib_ckpt;
mod ib_vm;
mod old_kernel;
mod vdso_proxy;
