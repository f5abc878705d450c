/*
 * A process whose stdin is a pipe from the process that started it, which
 * is outside the dumped tree and keeps writing (a child of make reading
 * its parent's pipe). Before ready the parent wrote "before\n", unread.
 * After go, the victim checks from inside that fd 0 is the very pipe it
 * had (same inode, remembered before the dump), reads "before\n" that
 * sat in it across the dump, then "after\n" the parent writes after the
 * restore.
 */
#include "victim.h"

#include <sys/stat.h>

static int read_line(char *buf, size_t cap)
{
	size_t got = 0;
	while (got + 1 < cap) {
		ssize_t n = read(0, buf + got, 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		if (buf[got++] == '\n')
			break;
	}
	buf[got] = 0;
	return 0;
}

int main(int argc, char **argv)
{
	struct stat before, now;
	char line[32];

	victim_init(argc, argv);
	if (fstat(0, &before) != 0 || !S_ISFIFO(before.st_mode))
		die("stdin is not a pipe");
	victim_ready_and_wait(NULL);
	CHECK(fstat(0, &now) == 0 && S_ISFIFO(now.st_mode) && now.st_ino == before.st_ino,
	      "fd 0 is no longer the parent's pipe (inode %lu, was %lu)",
	      (unsigned long)now.st_ino, (unsigned long)before.st_ino);
	CHECK(read_line(line, sizeof(line)) == 0 && strcmp(line, "before\n") == 0,
	      "what the parent wrote before the dump: '%s'", line);
	CHECK(read_line(line, sizeof(line)) == 0 && strcmp(line, "after\n") == 0,
	      "what the parent wrote after the restore: '%s'", line);
	victim_finish();
}
