/*
 * inotify victim. `inotify WORKDIR [deleted|queued]`.
 * Before the dump: an inotify instance (non-blocking) at fd 10 watching
 * WORKDIR (wd 1, removed again, its IN_IGNORED read), WORKDIR/dir for
 * IN_CREATE|IN_DELETE (wd 2) and WORKDIR/file for IN_MODIFY|IN_CLOSE_WRITE
 * (wd 3); nothing queued. After go: still non-blocking and nothing queued
 * (no stray IN_IGNORED from the restore); creating dir/new.txt gives
 * IN_CREATE on wd 2 named new.txt, writing and closing file gives IN_MODIFY
 * and IN_CLOSE_WRITE on wd 3 (and nothing for wd 2); removing new.txt gives
 * IN_DELETE on wd 2; a new watch gets wd 4 (numbering goes on after 3).
 * With "deleted": fd 11 is an open file, watched (wd 4), whose name was
 * removed. The dump must refuse it; with "linked": the watched file was
 * made as a second name of WORKDIR/kept, which stays, and is held open
 * (until go) by a process outside the tree instead of fd 11, so its removed
 * name is what a file handle opens to: the watch comes back (through the
 * handle) and writing kept gives IN_MODIFY on wd 4. Otherwise the dump
 * must refuse it; the victim then passes untouched. With "queued": an
 * IN_CREATE event (dir/queued.txt) is left unread at dump time; it is lost
 * (the dump warns), so after go nothing is queued either.
 */
#include "victim.h"
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>

#define FD_INOTIFY 10
#define FD_DELETED 11
#define DIR_MASK (IN_CREATE | IN_DELETE)
#define FILE_MASK (IN_MODIFY | IN_CLOSE_WRITE)
#define WAIT_MS 2000

struct seen {
	int wd;
	uint32_t mask;
	char name[64];
};

static void at(int fd, int want)
{
	if (fd < 0)
		die("create");
	if (fd != want) {
		if (dup2(fd, want) != want)
			die("dup2");
		close(fd);
	}
}

/* Reads events until `want` arrived or WAIT_MS passed without any. */
static int read_events(struct seen *out, int cap, int want)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	int n = 0;

	while (n < want) {
		struct pollfd p = { .fd = FD_INOTIFY, .events = POLLIN };
		if (poll(&p, 1, WAIT_MS) <= 0)
			break;
		ssize_t len = read(FD_INOTIFY, buf, sizeof(buf));
		if (len <= 0)
			break;
		for (char *q = buf; q < buf + len && n < cap;) {
			struct inotify_event *e = (struct inotify_event *)q;
			out[n].wd = e->wd;
			out[n].mask = e->mask;
			snprintf(out[n].name, sizeof(out[n].name), "%s", e->len ? e->name : "");
			n++;
			q += sizeof(*e) + e->len;
		}
	}
	return n;
}

static void expect(const struct seen *s, int wd, uint32_t mask, const char *name)
{
	CHECK(s->wd == wd && s->mask == mask && strcmp(s->name, name) == 0,
	      "event wd %d mask %#x name '%s', want wd %d mask %#x name '%s'", s->wd, s->mask,
	      s->name, wd, mask, name);
}

/* A process outside the tree (a grandchild, orphaned) holding `path` open
 * until go, so its name's dentry outlives the unlink. */
static void hold_outside(const char *path)
{
	int ready[2];
	char c;

	if (pipe(ready))
		die("pipe");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		if (fork() != 0)
			_exit(0);
		close(ready[0]);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || write(ready[1], "k", 1) != 1)
			_exit(1);
		close(ready[1]);
		victim_child_wait_go(1);
		_exit(0);
	}
	close(ready[1]);
	if (waitpid(child, NULL, 0) != child || read(ready[0], &c, 1) != 1)
		die("holder");
	close(ready[0]);
}

int main(int argc, char **argv)
{
	char dir[PATH_MAX], file[PATH_MAX], newf[PATH_MAX];
	int linked = argc > 2 && strcmp(argv[2], "linked") == 0;
	int deleted = linked || (argc > 2 && strcmp(argv[2], "deleted") == 0);
	char kept[PATH_MAX];
	int queued = argc > 2 && strcmp(argv[2], "queued") == 0;
	struct seen ev[16];

	victim_init(argc, argv);
	victim_path(dir, sizeof(dir), "dir");
	victim_path(file, sizeof(file), "file");
	snprintf(newf, sizeof(newf), "%s/new.txt", dir);
	if (mkdir(dir, 0700))
		die("mkdir");
	int f = open(file, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (f < 0)
		die("create file");
	close(f);

	at(inotify_init1(IN_NONBLOCK | IN_CLOEXEC), FD_INOTIFY);
	int wd_tmp = inotify_add_watch(FD_INOTIFY, victim_workdir, IN_ATTRIB);
	int wd_dir = inotify_add_watch(FD_INOTIFY, dir, DIR_MASK);
	int wd_file = inotify_add_watch(FD_INOTIFY, file, FILE_MASK);
	if (wd_tmp != 1 || wd_dir != 2 || wd_file != 3)
		die("inotify_add_watch");
	if (inotify_rm_watch(FD_INOTIFY, wd_tmp))
		die("inotify_rm_watch");
	if (read_events(ev, 16, 1) != 1 || ev[0].mask != IN_IGNORED)
		die("IN_IGNORED of the removed watch");
	int wd_deleted = -1;
	if (deleted) {
		char gone[PATH_MAX];

		victim_path(gone, sizeof(gone), "gone");
		victim_path(kept, sizeof(kept), "kept");
		if (linked) {
			/* gone's name is the inode's newest: a file handle opens
			 * to it, not to kept. */
			f = open(kept, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
			if (f < 0 || link(kept, gone))
				die("link kept");
			close(f);
		}
		if (linked)
			hold_outside(gone);
		else
			at(open(gone, O_RDWR | O_CREAT, 0600), FD_DELETED);
		wd_deleted = inotify_add_watch(FD_INOTIFY, gone, IN_MODIFY);
		if (wd_deleted != 4 || unlink(gone))
			die("watch a deleted file");
		/* Its IN_ATTRIB (link count) and the dir's nothing: read it out. */
		read_events(ev, 16, 1);
	}

	if (queued) {
		char q[PATH_MAX];

		snprintf(q, sizeof(q), "%s/queued.txt", dir);
		f = open(q, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
		if (f < 0)
			die("create queued.txt");
		close(f);
	}

	victim_ready_and_wait(NULL);

	CHECK(fcntl(FD_INOTIFY, F_GETFL) & O_NONBLOCK, "inotify lost O_NONBLOCK");
	char b[256];
	CHECK(read(FD_INOTIFY, b, sizeof(b)) < 0 && errno == EAGAIN,
	      "events queued after restore (want none)");

	f = open(newf, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	CHECK(f >= 0, "create %s: %s", newf, strerror(errno));
	close(f);
	int n = read_events(ev, 16, 1);
	CHECK(n == 1, "%d events after creating new.txt, want 1", n);
	if (n >= 1)
		expect(&ev[0], wd_dir, IN_CREATE, "new.txt");

	f = open(file, O_WRONLY | O_APPEND | O_CLOEXEC);
	CHECK(f >= 0 && write(f, "x", 1) == 1, "write %s: %s", file, strerror(errno));
	close(f);
	n = read_events(ev, 16, 2);
	CHECK(n == 2, "%d events after writing file, want 2", n);
	if (n >= 2) {
		expect(&ev[0], wd_file, IN_MODIFY, "");
		expect(&ev[1], wd_file, IN_CLOSE_WRITE, "");
	}

	if (linked) {
		f = open(kept, O_WRONLY | O_APPEND | O_CLOEXEC);
		CHECK(f >= 0 && write(f, "x", 1) == 1, "write %s: %s", kept, strerror(errno));
		close(f);
		n = read_events(ev, 16, 1);
		CHECK(n == 1, "%d events after writing kept, want 1", n);
		if (n >= 1)
			expect(&ev[0], wd_deleted, IN_MODIFY, "");
	}

	CHECK(unlink(newf) == 0, "unlink: %s", strerror(errno));
	n = read_events(ev, 16, 1);
	CHECK(n == 1, "%d events after removing new.txt, want 1", n);
	if (n >= 1)
		expect(&ev[0], wd_dir, IN_DELETE, "new.txt");

	int wd_next = inotify_add_watch(FD_INOTIFY, victim_workdir, IN_ATTRIB);
	CHECK(wd_next == (deleted ? 5 : 4), "a new watch got wd %d, want %d", wd_next,
	      deleted ? 5 : 4);
	victim_finish();
}
