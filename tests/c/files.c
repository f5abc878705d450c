/*
 * Files victim: regular files at known offsets with every access mode,
 * O_APPEND, O_CLOEXEC, a directory fd, /dev/null, two fds sharing one open
 * file description, and unlinked-but-open files (one of them sparse, with
 * its own mode and times, which must come back with its holes; one a hard
 * link of a file whose other name is kept, which must come back that very
 * file).  All fds are moved to
 * fixed numbers so the harness and the checks know them.  After go it checks
 * offsets, flags, targets and contents, and that I/O continues correctly.
 *
 * `files WORKDIR [DATADIR]`: the files (and the directory fd) are in
 * DATADIR, WORKDIR by default.  With a DATADIR the victim also maps
 * ro.txt privately and checks the mapping's bytes after restore (a DATADIR
 * that only the victim's mount namespace has: tests/mntns.rs).
 */
#include "victim.h"

#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>

#define FD_RO 10
#define FD_WO 11
#define FD_RW 12
#define FD_APPEND 13
#define FD_CLOEXEC_FILE 14
#define FD_DIR 15
#define FD_NULL 16
#define FD_SHARED_A 17
#define FD_SHARED_B 40 /* dup of 17, deliberately far away */
#define FD_DELETED 18
#define FD_SPARSE 19 /* unlinked, sparse, with its own mode and times */
#define FD_LINKED 20 /* one hard link removed, the other kept */
#define OFF_LINKED 100
#define FD_MAPPED 21 /* unlinked, also mapped privately */

#define OFF_RO 1234
#define OFF_WO 77
#define OFF_RW 2000
#define OFF_SHARED 300
#define OFF_DELETED 555
#define FILE_LEN 4096
/* The sparse unlinked file: 8 MiB, data only at its head and at 6 MiB. */
#define SPARSE_LEN (8L << 20)
#define SPARSE_TAIL (6L << 20)
#define SPARSE_MODE 0640
#define SPARSE_ATIME 1000000000L
#define SPARSE_MTIME 1200000000L
#define SPARSE_NSEC 123456789L

static char content[FILE_LEN];
static char del_content[FILE_LEN];
static char paths[64][PATH_MAX]; /* readlink of every fd before the dump */
static int fd_open_before[64];
static char datadir_abs[PATH_MAX];
/* ro.txt mapped privately, with a DATADIR only. */
static const char *mapped;

static void wpath(char *buf, const char *name)
{
	snprintf(buf, PATH_MAX, "%.3000s/%.64s", datadir_abs, name);
}

/* Open, move to a fixed fd number, seek. */
static void open_at(int want, const char *name, int flags, off_t off)
{
	char p[PATH_MAX];
	int fd;

	wpath(p, name);
	fd = open(p, flags, 0644);
	if (fd < 0)
		die(name);
	if (fd != want) {
		/* dup3 keeps O_CLOEXEC only if asked, so carry it over. */
		if (dup3(fd, want, (flags & O_CLOEXEC) ? O_CLOEXEC : 0) != want)
			die("dup3");
		close(fd);
	}
	if (lseek(want, off, SEEK_SET) != off)
		die("lseek");
}

static void make_file(const char *name, const char *data, size_t len)
{
	char p[PATH_MAX];
	int fd;

	wpath(p, name);
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, data, len) != (ssize_t)len)
		die(name);
	close(fd);
}

/* Lists open fds (< 64) without opendir/malloc; excludes the listing fd. */
static void list_fds(int *open_fds)
{
	char buf[4096];
	int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	long n;

	memset(open_fds, 0, 64 * sizeof(int));
	if (dfd < 0)
		die("open /proc/self/fd");
	while ((n = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0) {
		for (long pos = 0; pos < n;) {
			struct dirent64 *d = (struct dirent64 *)(buf + pos);
			char *end;
			long fd = strtol(d->d_name, &end, 10);

			if (*end == '\0' && end != d->d_name && fd >= 0 && fd < 64 && fd != dfd)
				open_fds[fd] = 1;
			pos += d->d_reclen;
		}
	}
	close(dfd);
}

static void fd_target(int fd, char *out)
{
	char link[64];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, out, PATH_MAX - 1);
	out[n < 0 ? 0 : n] = '\0';
}

static off_t cur(int fd)
{
	return lseek(fd, 0, SEEK_CUR);
}

static void check_file_content(const char *name, off_t off, const char *want, size_t len)
{
	char p[PATH_MAX], got[64];
	int fd;

	wpath(p, name);
	fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || len > sizeof(got) || pread(fd, got, len, off) != (ssize_t)len ||
	    memcmp(got, want, len) != 0)
		fail("%s: expected '%.*s' at offset %ld", name, (int)len, want, (long)off);
	if (fd >= 0)
		close(fd);
}

/* linked-a.txt opened, linked as linked-b.txt, and its first name removed:
 * the fd now names a file that lives on under another name. */
static void make_linked(void)
{
	char a[PATH_MAX], b[PATH_MAX];

	open_at(FD_LINKED, "linked-a.txt", O_RDWR | O_CREAT | O_TRUNC, 0);
	if (write(FD_LINKED, content, FILE_LEN) != FILE_LEN)
		die("write linked-a.txt");
	if (lseek(FD_LINKED, OFF_LINKED, SEEK_SET) != OFF_LINKED)
		die("lseek linked");
	wpath(a, "linked-a.txt");
	wpath(b, "linked-b.txt");
	unlink(b);
	if (link(a, b) || unlink(a))
		die("link linked-b.txt, unlink linked-a.txt");
}

/* The fd is the very file still named linked-b.txt: one inode, a write
 * through the fd seen through the name, at the saved offset. */
static void verify_linked(void)
{
	char b[PATH_MAX], buf[4];
	struct stat fd_st, name_st;
	int fd;

	wpath(b, "linked-b.txt");
	if (fstat(FD_LINKED, &fd_st) || stat(b, &name_st)) {
		fail("linked file: stat: %s", strerror(errno));
		return;
	}
	CHECK(fd_st.st_dev == name_st.st_dev && fd_st.st_ino == name_st.st_ino,
	      "linked file: the fd is inode %lu, linked-b.txt inode %lu",
	      (unsigned long)fd_st.st_ino, (unsigned long)name_st.st_ino);
	CHECK(fd_st.st_nlink == 1, "linked file: nlink %lu, want 1", (unsigned long)fd_st.st_nlink);
	CHECK(cur(FD_LINKED) == OFF_LINKED, "linked file offset %ld, want %d",
	      (long)cur(FD_LINKED), OFF_LINKED);
	CHECK(write(FD_LINKED, "LNKD", 4) == 4, "linked file: write: %s", strerror(errno));
	fd = open(b, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0 && pread(fd, buf, 4, OFF_LINKED) == 4 && memcmp(buf, "LNKD", 4) == 0,
	      "linked file: a write through the fd is not seen through linked-b.txt");
	if (fd >= 0)
		close(fd);
}

/* mapped.bin mapped privately (one page written through the mapping, one
 * not), its fd kept, then unlinked. */
static char *mapped_deleted;

static void make_mapped_deleted(void)
{
	char p[PATH_MAX];

	open_at(FD_MAPPED, "mapped.bin", O_RDWR | O_CREAT | O_TRUNC, 0);
	if (write(FD_MAPPED, del_content, FILE_LEN) != FILE_LEN ||
	    write(FD_MAPPED, content, FILE_LEN) != FILE_LEN)
		die("write mapped.bin");
	mapped_deleted = mmap(NULL, 2 * FILE_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE, FD_MAPPED, 0);
	if (mapped_deleted == MAP_FAILED)
		die("mmap mapped.bin");
	mapped_deleted[0] = 'P'; /* the first page is the process's own now */
	wpath(p, "mapped.bin");
	if (unlink(p))
		die("unlink mapped.bin");
}

/* One file behind the fd and the mapping: a write through the fd shows in
 * the page the mapping never wrote, not in the one it did. */
static void verify_mapped_deleted(void)
{
	CHECK(mapped_deleted[0] == 'P' && !memcmp(mapped_deleted + 1, del_content + 1, FILE_LEN - 1),
	      "mapped deleted file: the page written through the mapping changed");
	CHECK(!memcmp(mapped_deleted + FILE_LEN, content, FILE_LEN),
	      "mapped deleted file: the page not written changed");
	CHECK(pwrite(FD_MAPPED, "MAPD", 4, FILE_LEN + 8) == 4 && pwrite(FD_MAPPED, "FDFD", 4, 8) == 4,
	      "mapped deleted file: pwrite: %s", strerror(errno));
	CHECK(!memcmp(mapped_deleted + FILE_LEN + 8, "MAPD", 4),
	      "mapped deleted file: a write through the fd does not show in the mapping");
	CHECK(memcmp(mapped_deleted + 8, "FDFD", 4) != 0,
	      "mapped deleted file: a write through the fd shows in a page the mapping made its own");
}

/* An unlinked file mostly holes, with a mode and times of its own. */
static void make_sparse(void)
{
	char p[PATH_MAX];
	struct timespec times[2] = { { SPARSE_ATIME, SPARSE_NSEC }, { SPARSE_MTIME, SPARSE_NSEC } };

	open_at(FD_SPARSE, "sparse.bin", O_RDWR | O_CREAT | O_TRUNC, 0);
	if (ftruncate(FD_SPARSE, SPARSE_LEN) || pwrite(FD_SPARSE, "head", 4, 0) != 4 ||
	    pwrite(FD_SPARSE, "tail", 4, SPARSE_TAIL) != 4)
		die("write sparse.bin");
	if (fchmod(FD_SPARSE, SPARSE_MODE) || futimens(FD_SPARSE, times))
		die("fchmod/futimens sparse.bin");
	wpath(p, "sparse.bin");
	if (unlink(p))
		die("unlink sparse.bin");
}

/* The sparse file keeps its size, holes, mode and times (checked before
 * anything reads it, which could move its access time). */
static void verify_sparse(void)
{
	struct stat st;
	char buf[4];
	off_t hole;

	if (fstat(FD_SPARSE, &st)) {
		fail("sparse file: fstat: %s", strerror(errno));
		return;
	}
	CHECK(st.st_nlink == 0 && st.st_size == SPARSE_LEN, "sparse file: nlink %lu size %ld",
	      (unsigned long)st.st_nlink, (long)st.st_size);
	CHECK((st.st_mode & 07777) == SPARSE_MODE, "sparse file: mode %o, want %o",
	      st.st_mode & 07777, SPARSE_MODE);
	CHECK(st.st_uid == getuid(), "sparse file: owner %u, want %u", st.st_uid, getuid());
	CHECK(st.st_atim.tv_sec == SPARSE_ATIME && st.st_atim.tv_nsec == SPARSE_NSEC,
	      "sparse file: atime %ld.%09ld, want %ld.%09ld", (long)st.st_atim.tv_sec,
	      st.st_atim.tv_nsec, SPARSE_ATIME, SPARSE_NSEC);
	CHECK(st.st_mtim.tv_sec == SPARSE_MTIME && st.st_mtim.tv_nsec == SPARSE_NSEC,
	      "sparse file: mtime %ld.%09ld, want %ld.%09ld", (long)st.st_mtim.tv_sec,
	      st.st_mtim.tv_nsec, SPARSE_MTIME, SPARSE_NSEC);
	/* Two extents of a block or so each, not 8 MiB of zeros. */
	CHECK((long)st.st_blocks * 512 < (1L << 20), "sparse file: %ld bytes allocated, holes lost",
	      (long)st.st_blocks * 512);
	hole = lseek(FD_SPARSE, 0, SEEK_HOLE);
	CHECK(hole > 0 && hole < SPARSE_TAIL, "sparse file: first hole at %ld", (long)hole);
	CHECK(pread(FD_SPARSE, buf, 4, 0) == 4 && memcmp(buf, "head", 4) == 0,
	      "sparse file: head lost");
	CHECK(pread(FD_SPARSE, buf, 4, SPARSE_TAIL) == 4 && memcmp(buf, "tail", 4) == 0,
	      "sparse file: tail lost");
	CHECK(pread(FD_SPARSE, buf, 4, SPARSE_TAIL / 2) == 4 && memcmp(buf, "\0\0\0\0", 4) == 0,
	      "sparse file: a hole reads as data");
}

static void setup(void)
{
	char p[PATH_MAX];
	int fd;

	fill_pattern(content, sizeof(content), 11);
	fill_pattern(del_content, sizeof(del_content), 22);
	make_file("ro.txt", content, FILE_LEN);
	make_file("rw.txt", content, FILE_LEN);
	make_file("shared.txt", content, FILE_LEN);
	make_file("cloexec.txt", content, FILE_LEN);
	make_file("append.txt", "line1\n", 6);

	open_at(FD_RO, "ro.txt", O_RDONLY, OFF_RO);
	open_at(FD_WO, "wo.txt", O_WRONLY | O_CREAT | O_TRUNC, 0);
	if (write(FD_WO, content, 100) != 100)
		die("write wo.txt");
	if (lseek(FD_WO, OFF_WO, SEEK_SET) != OFF_WO)
		die("lseek wo");
	open_at(FD_RW, "rw.txt", O_RDWR, OFF_RW);
	open_at(FD_APPEND, "append.txt", O_WRONLY | O_APPEND, 2);
	open_at(FD_CLOEXEC_FILE, "cloexec.txt", O_RDONLY | O_CLOEXEC, 10);

	fd = open(datadir_abs, O_RDONLY | O_DIRECTORY);
	if (fd < 0 || dup2(fd, FD_DIR) != FD_DIR)
		die("open data dir");
	close(fd);

	fd = open("/dev/null", O_RDWR);
	if (fd < 0 || dup2(fd, FD_NULL) != FD_NULL)
		die("open /dev/null");
	close(fd);

	open_at(FD_SHARED_A, "shared.txt", O_RDWR, OFF_SHARED);
	if (dup2(FD_SHARED_A, FD_SHARED_B) != FD_SHARED_B)
		die("dup2 shared");

	open_at(FD_DELETED, "deleted.txt", O_RDWR | O_CREAT | O_TRUNC, 0);
	if (write(FD_DELETED, del_content, FILE_LEN) != FILE_LEN)
		die("write deleted.txt");
	if (lseek(FD_DELETED, OFF_DELETED, SEEK_SET) != OFF_DELETED)
		die("lseek deleted");
	wpath(p, "deleted.txt");
	if (unlink(p))
		die("unlink deleted.txt");

	make_sparse();
	make_linked();
	make_mapped_deleted();
	list_fds(fd_open_before);
	for (int i = 0; i < 64; i++)
		if (fd_open_before[i])
			fd_target(i, paths[i]);
}

static void verify_table(void)
{
	int open_after[64];
	char now[PATH_MAX];

	list_fds(open_after);
	for (int i = 0; i < 64; i++) {
		CHECK(open_after[i] == fd_open_before[i], "fd %d: %s after restore", i,
		      open_after[i] ? "unexpectedly open" : "missing");
		if (!open_after[i] || !fd_open_before[i])
			continue;
		fd_target(i, now);
		if (i == FD_MAPPED) {
			/* One file with its mapping: the memfd that holds both,
			 * named after the file ("/memfd:NAME (deleted)"). */
			const char *base = strrchr(paths[i], '/');

			CHECK(base && !strncmp(now, "/memfd:", 7) && !strcmp(now + 7, base + 1),
			      "fd %d points to '%s', want the memfd of '%s'", i, now, paths[i]);
			continue;
		}
		CHECK(strcmp(now, paths[i]) == 0, "fd %d points to '%s', was '%s'", i, now,
		      paths[i]);
	}
}

static void verify_modes(void)
{
	static const struct {
		int fd, accmode, append;
	} want[] = {
		{ FD_RO, O_RDONLY, 0 },	     { FD_WO, O_WRONLY, 0 },
		{ FD_RW, O_RDWR, 0 },	     { FD_APPEND, O_WRONLY, 1 },
		{ FD_CLOEXEC_FILE, O_RDONLY, 0 }, { FD_DIR, O_RDONLY, 0 },
		{ FD_NULL, O_RDWR, 0 },	     { FD_SHARED_A, O_RDWR, 0 },
		{ FD_SHARED_B, O_RDWR, 0 },  { FD_DELETED, O_RDWR, 0 },
	};

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		int fl = fcntl(want[i].fd, F_GETFL);
		int fdfl = fcntl(want[i].fd, F_GETFD);
		int cloexec = want[i].fd == FD_CLOEXEC_FILE;

		if (fl < 0 || fdfl < 0) {
			fail("fd %d: fcntl: %s", want[i].fd, strerror(errno));
			continue;
		}
		CHECK((fl & O_ACCMODE) == want[i].accmode, "fd %d: access mode %#x, want %#x",
		      want[i].fd, fl & O_ACCMODE, want[i].accmode);
		CHECK(!!(fl & O_APPEND) == want[i].append, "fd %d: O_APPEND is %s", want[i].fd,
		      (fl & O_APPEND) ? "set" : "clear");
		CHECK(!!(fdfl & FD_CLOEXEC) == cloexec, "fd %d: FD_CLOEXEC is %s", want[i].fd,
		      (fdfl & FD_CLOEXEC) ? "set" : "clear");
	}
}

static void verify_offsets_and_io(void)
{
	char buf[FILE_LEN];
	struct stat st, st2;
	char target[PATH_MAX];
	size_t tl;

	/* Read-only at 1234: reading continues from there. */
	CHECK(cur(FD_RO) == OFF_RO, "ro offset %ld, want %d", (long)cur(FD_RO), OFF_RO);
	CHECK(read(FD_RO, buf, 10) == 10 && memcmp(buf, content + OFF_RO, 10) == 0,
	      "ro: read after restore returned wrong data");
	CHECK(write(FD_RO, "x", 1) < 0, "ro: fd became writable");

	/* Write-only at 77: a write lands there. */
	CHECK(cur(FD_WO) == OFF_WO, "wo offset %ld, want %d", (long)cur(FD_WO), OFF_WO);
	CHECK(write(FD_WO, "WOWO", 4) == 4, "wo: write failed: %s", strerror(errno));
	check_file_content("wo.txt", OFF_WO, "WOWO", 4);
	CHECK(read(FD_WO, buf, 1) < 0, "wo: fd became readable");

	/* Read-write at 2000: read advances, then write lands right after. */
	CHECK(cur(FD_RW) == OFF_RW, "rw offset %ld, want %d", (long)cur(FD_RW), OFF_RW);
	CHECK(read(FD_RW, buf, 10) == 10 && memcmp(buf, content + OFF_RW, 10) == 0,
	      "rw: read after restore returned wrong data");
	CHECK(write(FD_RW, "RWRW", 4) == 4, "rw: write failed: %s", strerror(errno));
	check_file_content("rw.txt", OFF_RW + 10, "RWRW", 4);

	/* O_APPEND: even after seeking to 0 the write goes to the end. */
	CHECK(lseek(FD_APPEND, 0, SEEK_SET) == 0, "append: lseek failed");
	CHECK(write(FD_APPEND, "line2\n", 6) == 6, "append: write failed");
	check_file_content("append.txt", 0, "line1\nline2\n", 12);

	CHECK(cur(FD_CLOEXEC_FILE) == 10, "cloexec offset %ld, want 10", (long)cur(FD_CLOEXEC_FILE));

	/* Directory fd: still the data dir, usable for *at() calls. */
	CHECK(fstat(FD_DIR, &st) == 0 && S_ISDIR(st.st_mode), "dir fd is not a directory");
	CHECK(stat(datadir_abs, &st2) == 0 && st.st_ino == st2.st_ino && st.st_dev == st2.st_dev,
	      "dir fd is not the data dir");
	{
		int fd = openat(FD_DIR, "ro.txt", O_RDONLY | O_CLOEXEC);
		CHECK(fd >= 0, "openat(dir fd, ro.txt): %s", strerror(errno));
		if (fd >= 0)
			close(fd);
	}

	/* /dev/null: the real character device. */
	CHECK(fstat(FD_NULL, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3),
	      "fd %d is not /dev/null", FD_NULL);
	CHECK(write(FD_NULL, "abc", 3) == 3 && read(FD_NULL, buf, 1) == 0,
	      "/dev/null does not behave like /dev/null");

	/* dup'ed fds share one open file description (and thus one offset). */
	CHECK(cur(FD_SHARED_A) == OFF_SHARED && cur(FD_SHARED_B) == OFF_SHARED,
	      "shared offsets %ld/%ld, want %d", (long)cur(FD_SHARED_A), (long)cur(FD_SHARED_B),
	      OFF_SHARED);
	CHECK(lseek(FD_SHARED_A, 555, SEEK_SET) == 555, "lseek shared A");
	CHECK(cur(FD_SHARED_B) == 555, "dup'ed fd does not share the offset (%ld, want 555)",
	      (long)cur(FD_SHARED_B));
	CHECK(read(FD_SHARED_B, buf, 5) == 5 && cur(FD_SHARED_A) == 560,
	      "reading fd %d did not move fd %d", FD_SHARED_B, FD_SHARED_A);

	/* Unlinked file: same content, still deleted, same offset. */
	fd_target(FD_DELETED, target);
	tl = strlen(target);
	CHECK(tl > 10 && strcmp(target + tl - 10, " (deleted)") == 0,
	      "unlinked file fd points to '%s', want a '(deleted)' path", target);
	CHECK(fstat(FD_DELETED, &st) == 0 && st.st_nlink == 0 && st.st_size == FILE_LEN,
	      "unlinked file: nlink %lu size %ld", (unsigned long)st.st_nlink, (long)st.st_size);
	CHECK(cur(FD_DELETED) == OFF_DELETED, "unlinked file offset %ld, want %d",
	      (long)cur(FD_DELETED), OFF_DELETED);
	CHECK(pread(FD_DELETED, buf, FILE_LEN, 0) == FILE_LEN &&
		      memcmp(buf, del_content, FILE_LEN) == 0,
	      "unlinked file content changed");
	CHECK(write(FD_DELETED, "DD", 2) == 2 && pread(FD_DELETED, buf, 2, OFF_DELETED) == 2 &&
		      memcmp(buf, "DD", 2) == 0,
	      "unlinked file: write did not land at the restored offset");
}

/* A private read-only mapping of ro.txt; the fd it was made from is closed. */
static void map_ro(void)
{
	char p[PATH_MAX];
	int fd;

	wpath(p, "ro.txt");
	fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		die("open ro.txt to map");
	mapped = mmap(NULL, FILE_LEN, PROT_READ, MAP_PRIVATE, fd, 0);
	if (mapped == MAP_FAILED)
		die("mmap ro.txt");
	close(fd);
}

static void verify_mapping(void)
{
	if (mapped)
		CHECK(memcmp(mapped, content, FILE_LEN) == 0,
		      "the mapping of ro.txt does not hold its bytes after restore");
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	if (!realpath(argc > 2 ? argv[2] : victim_workdir, datadir_abs))
		die("realpath data dir");
	setup();
	if (argc > 2)
		map_ro();
	victim_ready_and_wait(NULL);
	/* The fd table first: the checks below open and close temporary fds. */
	verify_table();
	verify_sparse();
	verify_linked();
	verify_mapped_deleted();
	verify_modes();
	verify_offsets_and_io();
	verify_mapping();
	victim_finish();
}
