/* Benchmark victim: fills SIZE_MIB of anonymous memory with non-zero,
 * poorly compressible data, says "ready" on stdout, then sleeps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
	size_t n = mib << 20;
	uint64_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 1;
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < n / 8; i++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		p[i] = x;
	}
	printf("ready\n");
	fflush(stdout);
	for (;;)
		pause();
}
