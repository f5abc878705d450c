/*
 * fanotify victim. `fanotify WORKDIR [user]`.
 * Before the dump (as root): a fanotify group (notification class,
 * non-blocking) at fd 10 with an inode mark on WORKDIR/file for
 * FAN_MODIFY|FAN_CLOSE_WRITE and one on WORKDIR/dir for FAN_OPEN of its
 * children (FAN_EVENT_ON_CHILD); a mark on WORKDIR's mount that only
 * ignores FAN_ACCESS (surviving modification), so no one else's events
 * reach the group, and one on its filesystem ignoring it until the next
 * modification (which empties it); nothing queued. After go: still
 * non-blocking, nothing queued; writing file gives FAN_MODIFY and
 * FAN_CLOSE_WRITE with an fd of file; opening dir/child gives FAN_OPEN
 * with an fd of child; a new mark can be added.
 * With "user" (run as an ordinary user): the group is the unprivileged
 * kind (FAN_REPORT_FID) with the inode mark on file; the dump must refuse
 * it, and the victim then passes untouched.
 */
#include "victim.h"
#include <poll.h>
#include <sys/fanotify.h>
#include <sys/stat.h>

#define FD_FANOTIFY 10
#define FILE_MASK (FAN_MODIFY | FAN_CLOSE_WRITE)
#define DIR_MASK (FAN_OPEN | FAN_EVENT_ON_CHILD)
#define WAIT_MS 2000

/* Reads events until those of `mask` on inode `ino` all arrived, or
 * WAIT_MS passed without any; returns the events seen on it. */
static uint64_t events_on(ino_t ino, uint64_t mask)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct fanotify_event_metadata))));
	uint64_t seen = 0;

	while ((seen & mask) != mask) {
		struct pollfd p = { .fd = FD_FANOTIFY, .events = POLLIN };
		if (poll(&p, 1, WAIT_MS) <= 0)
			break;
		ssize_t len = read(FD_FANOTIFY, buf, sizeof(buf));
		if (len <= 0)
			break;
		struct fanotify_event_metadata *m = (struct fanotify_event_metadata *)buf;
		for (; FAN_EVENT_OK(m, len); m = FAN_EVENT_NEXT(m, len)) {
			struct stat st;
			if (m->fd >= 0) {
				if (fstat(m->fd, &st) == 0 && st.st_ino == ino)
					seen |= m->mask;
				close(m->fd);
			}
		}
	}
	return seen;
}

int main(int argc, char **argv)
{
	char dir[PATH_MAX], file[PATH_MAX], child[PATH_MAX];
	int user = argc > 2 && strcmp(argv[2], "user") == 0;
	struct stat st;

	victim_init(argc, argv);
	victim_path(dir, sizeof(dir), "dir");
	victim_path(file, sizeof(file), "file");
	snprintf(child, sizeof(child), "%s/child", dir);
	if (mkdir(dir, 0700))
		die("mkdir");
	int f = open(file, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (f < 0)
		die("create file");
	close(f);

	unsigned int flags = FAN_CLASS_NOTIF | FAN_NONBLOCK | FAN_CLOEXEC;
	if (user)
		flags |= FAN_REPORT_FID;
	int g = fanotify_init(flags, O_RDONLY | O_LARGEFILE);
	if (g < 0)
		die("fanotify_init");
	if (g != FD_FANOTIFY) {
		if (dup2(g, FD_FANOTIFY) != FD_FANOTIFY)
			die("dup2");
		close(g);
	}
	if (fanotify_mark(FD_FANOTIFY, FAN_MARK_ADD, FILE_MASK, AT_FDCWD, file))
		die("mark file");
	if (!user && fanotify_mark(FD_FANOTIFY, FAN_MARK_ADD, DIR_MASK, AT_FDCWD, dir))
		die("mark dir");
	if (!user && fanotify_mark(FD_FANOTIFY,
				   FAN_MARK_ADD | FAN_MARK_MOUNT | FAN_MARK_IGNORED_MASK |
					   FAN_MARK_IGNORED_SURV_MODIFY,
				   FAN_ACCESS, AT_FDCWD, victim_workdir))
		die("mark mount");
	if (!user && fanotify_mark(FD_FANOTIFY,
				   FAN_MARK_ADD | FAN_MARK_FILESYSTEM | FAN_MARK_IGNORED_MASK, FAN_ACCESS,
				   AT_FDCWD, victim_workdir))
		die("mark filesystem");

	victim_ready_and_wait(NULL);

	CHECK(fcntl(FD_FANOTIFY, F_GETFL) & O_NONBLOCK, "fanotify lost O_NONBLOCK");
	if (user)
		victim_finish();
	char b[256];
	CHECK(read(FD_FANOTIFY, b, sizeof(b)) < 0 && errno == EAGAIN,
	      "events queued after restore (want none)");

	CHECK(stat(file, &st) == 0, "stat %s: %s", file, strerror(errno));
	f = open(file, O_WRONLY | O_APPEND | O_CLOEXEC);
	CHECK(f >= 0 && write(f, "x", 1) == 1, "write %s: %s", file, strerror(errno));
	close(f);
	uint64_t got = events_on(st.st_ino, FILE_MASK);
	CHECK(got == FILE_MASK, "events %#llx on file, want %#llx", (unsigned long long)got,
	      (unsigned long long)FILE_MASK);

	f = open(child, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	CHECK(f >= 0 && fstat(f, &st) == 0, "create %s: %s", child, strerror(errno));
	close(f);
	got = events_on(st.st_ino, FAN_OPEN);
	CHECK(got & FAN_OPEN, "events %#llx on dir/child, want FAN_OPEN", (unsigned long long)got);

	CHECK(fanotify_mark(FD_FANOTIFY, FAN_MARK_ADD, FAN_CLOSE_NOWRITE, AT_FDCWD, child) == 0,
	      "a new mark: %s", strerror(errno));
	victim_finish();
}
