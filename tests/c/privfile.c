/*
 * A file opened with more privilege than the process has now
 * (`privfile WORKDIR LOG UID GID`, started as root): fd 20 is LOG opened
 * by root (created 0600, write-only, O_APPEND), "before\n" written; then
 * the process drops to UID:GID for good and checks it can no longer open
 * LOG. After go it is still UID:GID, fd 20 is still LOG (same inode, root's,
 * 0600, write-only and O_APPEND), "after\n" written through it lands, and
 * LOG still cannot be opened by path. The test reads LOG.
 */
#include "victim.h"

#include <grp.h>
#include <sys/stat.h>

#define FD_LOG 20

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	if (argc < 5)
		die("usage: privfile WORKDIR LOG UID GID");
	const char *log = argv[2];
	uid_t uid = (uid_t)atoi(argv[3]);
	gid_t gid = (gid_t)atoi(argv[4]);

	victim_fd_at(open(log, O_WRONLY | O_CREAT | O_APPEND | O_EXCL, 0600), FD_LOG);
	victim_write_all(FD_LOG, "before\n", 7);
	if (setgroups(0, NULL) || setgid(gid) || setuid(uid))
		die("drop privileges");
	if (open(log, O_WRONLY | O_CLOEXEC) >= 0 || errno != EACCES)
		die("the dropped process can still open the log");
	struct stat before;
	if (fstat(FD_LOG, &before))
		die("fstat");

	victim_ready_and_wait(NULL);

	CHECK(getuid() == uid && geteuid() == uid && getgid() == gid,
	      "ids %u/%u/%u after restore, want %u:%u", getuid(), geteuid(), getgid(), uid, gid);
	struct stat st;
	CHECK(fstat(FD_LOG, &st) == 0 && st.st_ino == before.st_ino &&
		      st.st_dev == before.st_dev,
	      "fd %d is not the log it was", FD_LOG);
	CHECK(st.st_uid == 0 && (st.st_mode & 07777) == 0600, "log is %u, mode %#o", st.st_uid,
	      st.st_mode & 07777);
	int fl = fcntl(FD_LOG, F_GETFL);
	CHECK(fl >= 0 && (fl & O_ACCMODE) == O_WRONLY && (fl & O_APPEND),
	      "fd %d flags %#o, want O_WRONLY|O_APPEND", FD_LOG, fl);
	CHECK(write(FD_LOG, "after\n", 6) == 6, "write to the log: %s", strerror(errno));
	int again = open(log, O_WRONLY | O_CLOEXEC);
	CHECK(again < 0 && errno == EACCES, "the restored process can open the log by path");
	victim_finish();
}
