/*
 * O_PATH fds victim. Before the dump, in the work directory: a file "target"
 * and a symbolic link "link" -> "target"; fd P = open("target", O_PATH), fd
 * L = open("link", O_PATH|O_NOFOLLOW) (names the link itself), fd F =
 * open("link", O_PATH) (follows it: the file). Their device and inode are
 * remembered. After go each fd is still O_PATH with its own O_NOFOLLOW
 * (F_GETFL), fstat gives the same inode (and for L a symbolic link),
 * readlinkat(L, "") reads "target", and fstatat(P, "") reaches the file.
 *
 * "unlinked" mode: only L, and "link" is removed before ready (the dump must
 * be refused); after go L still reads "target".
 */
#include "victim.h"

#include <sys/stat.h>

static int open_path(const char *name, int flags)
{
	char path[PATH_MAX];
	victim_path(path, sizeof(path), name);
	int fd = open(path, flags);
	if (fd < 0)
		die(name);
	return fd;
}

static void check_fd(int fd, int want_flags, const struct stat *want, const char *name)
{
	struct stat st;
	int fl = fcntl(fd, F_GETFL);
	CHECK(fl >= 0, "%s: F_GETFL: %s", name, strerror(errno));
	CHECK((fl & (O_PATH | O_NOFOLLOW)) == want_flags, "%s: flags %#o, want %#o", name,
	      fl & (O_PATH | O_NOFOLLOW), want_flags);
	CHECK(fstat(fd, &st) == 0, "%s: fstat: %s", name, strerror(errno));
	CHECK(st.st_dev == want->st_dev && st.st_ino == want->st_ino,
	      "%s: inode %lu, want %lu", name, (unsigned long)st.st_ino,
	      (unsigned long)want->st_ino);
	CHECK((st.st_mode & S_IFMT) == (want->st_mode & S_IFMT), "%s: file type %#o, want %#o",
	      name, st.st_mode & S_IFMT, want->st_mode & S_IFMT);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	char target[PATH_MAX], link[PATH_MAX];
	victim_path(target, sizeof(target), "target");
	victim_path(link, sizeof(link), "link");
	victim_write_file("target", "contents\n");
	if (symlink("target", link))
		die("symlink");

	if (argc > 2 && strcmp(argv[2], "unlinked") == 0) {
		int gone = open_path("link", O_PATH | O_NOFOLLOW);
		if (unlink(link))
			die("unlink");
		victim_ready_and_wait("ready");
		char got[64] = { 0 };
		CHECK(readlinkat(gone, "", got, sizeof(got) - 1) == 6, "unlinked L reads no link");
		victim_finish();
	}

	int p = open_path("target", O_PATH);
	int l = open_path("link", O_PATH | O_NOFOLLOW);
	int f = open_path("link", O_PATH);
	struct stat file_st, link_st;
	if (fstat(p, &file_st) || fstatat(l, "", &link_st, AT_EMPTY_PATH))
		die("fstat");

	victim_ready_and_wait("ready");

	check_fd(p, O_PATH, &file_st, "P");
	check_fd(l, O_PATH | O_NOFOLLOW, &link_st, "L");
	check_fd(f, O_PATH, &file_st, "F");
	char buf[64] = { 0 };
	ssize_t n = readlinkat(l, "", buf, sizeof(buf) - 1);
	CHECK(n == 6 && memcmp(buf, "target", 6) == 0, "readlinkat(L, \"\") gave %zd \"%s\"", n,
	      n > 0 ? buf : "");
	struct stat st;
	CHECK(fstatat(p, "", &st, AT_EMPTY_PATH) == 0 && st.st_size == 9,
	      "fstatat(P, \"\") reaches no file of 9 bytes");
	victim_finish();
}
