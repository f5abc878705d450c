/*
 * An open file of a device node unlinked while open.
 *
 *   devnode WORKDIR        (root) makes WORKDIR/null-node, char 1:3 (the
 *                          null device) mode 0640, opens it read-write at
 *                          fd 40 and unlinks it. After restore fd 40 is
 *                          still that device, unlinked, mode 0640, named
 *                          after the node, and behaves as /dev/null.
 *   devnode WORKDIR user   (an ordinary user) opens WORKDIR/null-node,
 *                          which the test made mode 0666, read-write at
 *                          fd 40; the test then makes it 0600 and unlinks
 *                          it: restore must refuse to make it again.
 *   devnode WORKDIR kept   (root) as the first, the node left in place
 *                          (the test replaces it with another device).
 */
#include "victim.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#define FD_NODE 40
#define NODE_MODE 0640

int main(int argc, char **argv)
{
	char path[PATH_MAX], target[PATH_MAX], buf[8];
	int user = argc > 2 && strcmp(argv[2], "user") == 0;
	int kept = argc > 2 && strcmp(argv[2], "kept") == 0;
	struct stat st;
	ssize_t n;

	victim_init(argc, argv);
	victim_path(path, sizeof(path), "null-node");
	if (!user) {
		unlink(path);
		if (mknod(path, S_IFCHR | NODE_MODE, makedev(1, 3)) || chmod(path, NODE_MODE))
			die("mknod null-node");
	}
	victim_fd_at(open(path, O_RDWR), FD_NODE);
	if (!user && !kept && unlink(path))
		die("unlink null-node");
	victim_ready_and_wait(NULL);

	CHECK(fstat(FD_NODE, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3),
	      "fd %d is not the null device", FD_NODE);
	CHECK(st.st_nlink == 0, "the node has %lu links, want none", (unsigned long)st.st_nlink);
	CHECK((st.st_mode & 07777) == NODE_MODE && st.st_uid == 0,
	      "the node has mode %o owner %u, want %o owner 0", st.st_mode & 07777, st.st_uid,
	      NODE_MODE);
	CHECK((fcntl(FD_NODE, F_GETFL) & O_ACCMODE) == O_RDWR, "fd %d is not read-write", FD_NODE);
	snprintf(buf, sizeof(buf), "%d", FD_NODE);
	snprintf(path, sizeof(path), "/proc/self/fd/%s", buf);
	n = readlink(path, target, sizeof(target) - 1);
	target[n > 0 ? n : 0] = 0;
	CHECK(strstr(target, "/null-node") && strstr(target, " (deleted)"),
	      "fd %d reads as '%s', want the unlinked null-node", FD_NODE, target);
	CHECK(write(FD_NODE, "abc", 3) == 3 && read(FD_NODE, buf, sizeof(buf)) == 0,
	      "fd %d does not behave as the null device", FD_NODE);
	victim_finish();
}
