//! What the rebuild of a tree shares across its resources: the memory of
//! one process, the fds of another, the shared memory objects both map or
//! hold, the checks every reopened file goes through. One value for the
//! whole rebuild, with a named field for each thing several resources
//! use; state private to one kind of fd stays in the fd module's own
//! tables.

use ckpt_image::ImageDir;
use ckpt_image::fd::Files;

use crate::fd::inet::OutsidePeers;
use crate::identity::FileChecks;
use crate::options::RestoreOptions;
use crate::shmem;

/// The restore-wide state of one rebuild.
pub struct RestoreContext<'a> {
    /// The checkpoint.
    pub images: &'a ImageDir,
    /// Every open file of the checkpoint.
    pub files: &'a Files,
    /// The options of the restore.
    pub options: &'a RestoreOptions<'a>,
    /// The shared memory objects: mapped by VMAs, held by memfd fds,
    /// created once whichever comes first.
    pub shmem: shmem::Objects,
    /// TCP connections to peers outside the tree, in repair mode until
    /// the tree resumes.
    pub outside_peers: OutsidePeers,
    /// The checks reopened files are put through: by fds, by mappings,
    /// the executable.
    pub checks: FileChecks,
}

impl<'a> RestoreContext<'a> {
    /// The context of rebuilding the tree of `images`, whose shared memory
    /// objects are `shmem` (read and checked, none created yet).
    pub fn new(
        images: &'a ImageDir,
        files: &'a Files,
        options: &'a RestoreOptions<'a>,
        shmem: shmem::Objects,
    ) -> Self {
        RestoreContext {
            images,
            files,
            options,
            shmem,
            outside_peers: OutsidePeers::default(),
            checks: FileChecks::new(&images.manifest().hostname),
        }
    }
}
