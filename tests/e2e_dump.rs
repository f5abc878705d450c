//! Dump and restore modes and the tool itself: background, incremental and lazy dumps, failures and kills mid-dump, the parasite, logging, the command line, scripts, the trust boundaries of images and files, and the service through which users checkpoint their own jobs.
//!
//! One test binary for several test files (each a module below), so the
//! suite links a handful of binaries instead of one per file.

mod background;
mod cli;
mod common;
mod failures;
mod ib_layer;
mod incremental;
mod killed_dumper;
mod lazy;
mod logging;
mod parasite;
mod scripts;
mod security_files;
mod security_images;
mod service;
