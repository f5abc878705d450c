/*
 * Outside-pipe victim: its stdin is a pipe from the test (outside the
 * dumped tree), moved to OUTSIDE_FD, with /dev/null as fd 0 again, so the
 * tree holds a pipe to outside on an fd that is not stdio. ckpt must
 * refuse it; after go the victim checks it still has that pipe.
 */
#include "victim.h"

#include <sys/stat.h>

#define OUTSIDE_FD 10

int main(int argc, char **argv)
{
	struct stat st;

	victim_init(argc, argv);
	if (dup2(0, OUTSIDE_FD) != OUTSIDE_FD)
		die("dup2");
	int null = open("/dev/null", O_RDONLY);
	if (null < 0 || dup2(null, 0) != 0)
		die("reopen stdin");
	close(null);
	victim_ready_and_wait(NULL);
	CHECK(fstat(OUTSIDE_FD, &st) == 0 && S_ISFIFO(st.st_mode),
	      "fd %d is no longer the pipe", OUTSIDE_FD);
	victim_finish();
}
